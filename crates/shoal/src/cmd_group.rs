//! `shoal group ...`: create, join, inspect and use process groups from the
//! shell.
//!
//! A member started from the shell (`create`, `join`) sends every line of
//! its standard input to the group and prints every delivery, one line
//! each, in the group's order:
//!
//! ```text
//! SEQ DIGEST msg SENDER TEXT
//! SEQ DIGEST join MEMBER ADDR
//! SEQ DIGEST leave MEMBER
//! SEQ DIGEST view INCARNATION MEMBER,MEMBER,...
//! SEQ DIGEST state                (a joiner's starting point)
//! sent SEQ TEXT                   (this input line is ordered at SEQ)
//! unsent TEXT                     (this line may or may not be ordered:
//!                                  the member was expelled meanwhile)
//! rejoin                          (expelled, e.g. after a partition: the
//!                                  member joins again and gets a state)
//! ```
//!
//! DIGEST is a running hash of the deliveries so far (the member's
//! "application state", handed to joiners), so two members that print the
//! same DIGEST at the same SEQ have delivered the same stream.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Subcommand};
use parking_lot::Mutex;
use shoal_groupsvc::{Delivery, Group, GroupError, GroupOptions, GroupSeq};
use shoal_rpc::{Context, PutPort};

use crate::Failure;

#[derive(Subcommand)]
pub enum GroupCommand {
    /// Create a group and take part in it: send stdin lines, print
    /// deliveries.  Only your own programs (your uid, on any node) can
    /// join it, unless it is --open.
    Create {
        /// Admit anyone who knows the group's port, not only your uid.
        #[arg(long)]
        open: bool,
        #[command(flatten)]
        params: Params,
        #[command(flatten)]
        member: MemberArgs,
    },
    /// Join a group and take part in it: send stdin lines, print deliveries.
    Join {
        /// The group (as `create` printed it).
        port: PutPort,
        #[command(flatten)]
        member: MemberArgs,
    },
    /// Join a group, send messages (ordered), leave.
    Send {
        /// The group.
        port: PutPort,
        /// The messages, each sent as one group message.
        #[arg(required = true)]
        messages: Vec<String>,
        /// Send the messages this many times over.
        #[arg(long, default_value_t = 1)]
        repeat: u64,
    },
    /// Show the group as each member sees it: members, sequencer, sequence
    /// numbers, history use.
    Info {
        /// The group.
        port: PutPort,
        /// Print the members' answers as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Parameters fixed when the group is created.
#[derive(Args)]
pub struct Params {
    /// Resilience degree: messages survive this many simultaneous crashes.
    #[arg(long, short = 'r', default_value_t = 0)]
    resilience: usize,
    /// Messages of at least this many bytes are broadcast by their sender.
    #[arg(long, default_value_t = 8192)]
    large_bytes: usize,
    /// Least number of members a reset needs (default: a majority, and all
    /// but r).
    #[arg(long)]
    min_members: Option<usize>,
}

/// How a shell member behaves.
#[derive(Args)]
pub struct MemberArgs {
    /// Do not read standard input (only print deliveries).
    #[arg(long)]
    no_input: bool,
    /// Exit (leaving the group) after this many deliveries.
    #[arg(long)]
    count: Option<u64>,
    /// Use IP multicast (`yes`/`no`; default: if the network has broadcast).
    #[arg(long)]
    multicast: Option<YesNo>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum YesNo {
    Yes,
    No,
}

fn attach() -> Result<Context, Failure> {
    Context::from_env().map_err(|e| Failure::unreachable(e.to_string()))
}

fn group_failure(e: GroupError) -> Failure {
    match e {
        GroupError::NotFound(_) => Failure::unreachable(e.to_string()),
        e => Failure::failed(e.to_string()),
    }
}

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn run(command: GroupCommand) -> Result<(), Failure> {
    match command {
        GroupCommand::Create {
            open,
            params,
            member,
        } => {
            let ctx = attach()?;
            let opts = GroupOptions {
                open,
                resilience: params.resilience,
                large_bytes: params.large_bytes,
                min_members: params.min_members,
                multicast: member.multicast.map(|m| matches!(m, YesNo::Yes)),
                ..GroupOptions::default()
            };
            let group = Group::create(&ctx, opts).map_err(group_failure)?;
            say(&format!("group {} member {}", group.port(), group.id()));
            take_part(&ctx, group, member)
        }
        GroupCommand::Join { port, member } => {
            let ctx = attach()?;
            let opts = GroupOptions {
                multicast: member.multicast.map(|m| matches!(m, YesNo::Yes)),
                ..GroupOptions::default()
            };
            let group = Group::join(&ctx, port, opts).map_err(group_failure)?;
            say(&format!("joined {} member {}", group.port(), group.id()));
            take_part(&ctx, group, member)
        }
        GroupCommand::Send {
            port,
            messages,
            repeat,
        } => {
            let ctx = attach()?;
            let group = Group::join(&ctx, port, GroupOptions::default()).map_err(group_failure)?;
            // Deliveries are not read: drain them so they do not pile up.
            for _ in 0..repeat {
                for m in &messages {
                    let seq = group.send(m.as_bytes()).map_err(group_failure)?;
                    say(&format!("sent {seq} {m}"));
                }
            }
            group.leave();
            Ok(())
        }
        GroupCommand::Info { port, json } => {
            let ctx = attach()?;
            let answers = shoal_groupsvc::inspect(&ctx, &port).map_err(group_failure)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&answers).map_err(|e| e.to_string())?
                );
                return Ok(());
            }
            println!(
                "{:<17} {:<10} {:>4} {:<8} {:<17} {:>8} {:>8} {:>8} {:>8} {:>9} {:>12}",
                "MEMBER",
                "STATUS",
                "INC",
                "KEY",
                "SEQUENCER",
                "HELD",
                "COMMIT",
                "STABLE",
                "DELIVER",
                "HISTORY",
                "HISTORY-B"
            );
            for a in &answers {
                let n = |k: &str| a[k].to_string();
                println!(
                    "{:<17} {:<10} {:>4} {:<8} {:<17} {:>8} {:>8} {:>8} {:>8} {:>9} {:>12}",
                    a["member"].as_str().unwrap_or("?"),
                    a["status"].as_str().unwrap_or("?"),
                    n("incarnation"),
                    a["key_epoch"]
                        .as_u64()
                        .map_or("?".into(), |e| format!("{e:08x}")),
                    a["sequencer"].as_str().unwrap_or("?"),
                    n("held"),
                    n("committed"),
                    n("stable"),
                    n("delivered"),
                    n("history_entries"),
                    format!("{}/{}", n("history_bytes"), n("history_limit_bytes")),
                );
            }
            if let Some(first) = answers.first() {
                println!(
                    "resilience {}, large messages from {} bytes, members: {}",
                    first["resilience"],
                    first["large_bytes"],
                    first["members"]
                        .as_array()
                        .map(|m| m
                            .iter()
                            .filter_map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(" "))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs a shell member until stdin's lines are sent and `count` deliveries
/// are printed, or SIGTERM/SIGINT: then leaves the group.
fn take_part(ctx: &Context, group: Group, member: MemberArgs) -> Result<(), Failure> {
    let port = group.port();
    let current = Arc::new(Mutex::new(Arc::new(group)));
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).map_err(|e| e.to_string())?;
    }
    // The application state handed to joiners: SEQ and DIGEST.
    let state = Arc::new(Mutex::new((GroupSeq(0), 0u64)));
    let provide = |group: &Group| {
        let state = state.clone();
        group.on_state_wanted(move || {
            let (seq, digest) = *state.lock();
            format!("{seq} {digest:016x}").into_bytes()
        });
    };
    provide(&current.lock());
    if !member.no_input {
        let current = current.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let group = current.lock().clone();
                match group.send(line.as_bytes()) {
                    Ok(seq) => say(&format!("sent {seq} {line}")),
                    Err(GroupError::NotMember) => say(&format!("unsent {line}")),
                    Err(e) => {
                        eprintln!("shoal: send failed: {e}");
                        say(&format!("unsent {line}"));
                    }
                }
            }
        });
    }
    let mut delivered = 0u64;
    while !stop.load(Ordering::Acquire) {
        let group = current.lock().clone();
        let d = match group.receive_timeout(Some(Duration::from_millis(100))) {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(GroupError::NotMember) => {
                // Expelled (a partition, or falling behind): join again and
                // start from the group's state.
                say("rejoin");
                let opts = GroupOptions {
                    multicast: member.multicast.map(|m| matches!(m, YesNo::Yes)),
                    ..GroupOptions::default()
                };
                let fresh = loop {
                    match Group::join(ctx, port, opts.clone()) {
                        Ok(g) => break g,
                        Err(e) if stop.load(Ordering::Acquire) => return Err(group_failure(e)),
                        Err(_) => std::thread::sleep(Duration::from_millis(200)),
                    }
                };
                provide(&fresh);
                *current.lock() = Arc::new(fresh);
                continue;
            }
            Err(e) => return Err(group_failure(e)),
        };
        let (seq, text) = match d {
            Delivery::Message { seq, sender, body } => (
                seq,
                format!(
                    "msg {sender} {}",
                    String::from_utf8_lossy(&body).replace('\n', " ")
                ),
            ),
            Delivery::Joined { seq, member, addr } => (seq, format!("join {member} {addr}")),
            Delivery::Left { seq, member } => (seq, format!("leave {member}")),
            Delivery::View {
                seq,
                incarnation,
                members,
            } => (
                seq,
                format!(
                    "view {incarnation} {}",
                    members
                        .iter()
                        .map(|m| m.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ),
            Delivery::State { seq, state: bytes } => {
                let text = String::from_utf8_lossy(&bytes).to_string();
                let digest = text
                    .split_whitespace()
                    .nth(1)
                    .and_then(|d| u64::from_str_radix(d, 16).ok())
                    .unwrap_or(0);
                *state.lock() = (seq, digest);
                say(&format!("{seq} {digest:016x} state"));
                continue;
            }
            Delivery::ResetFailed { have, need } => {
                eprintln!("shoal: group reset failed: {have} of {need} members answered; retrying");
                continue;
            }
        };
        let digest = {
            let mut s = state.lock();
            s.1 = fnv(s.1, text.as_bytes());
            s.0 = seq;
            s.1
        };
        say(&format!("{seq} {digest:016x} {text}"));
        delivered += 1;
        if member.count.is_some_and(|c| delivered >= c) {
            break;
        }
    }
    current.lock().leave();
    Ok(())
}
