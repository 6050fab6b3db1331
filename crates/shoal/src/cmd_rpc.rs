//! `shoal rpc ...`: call and serve ports from the shell.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Subcommand;
use shoal_rpc::{CallOptions, Context, Error, GetPort, PutPort, TransError};

use crate::Failure;

#[derive(Subcommand)]
pub enum RpcCommand {
    /// Print a fresh get-port (secret) and its put-port (public).
    NewPort,
    /// Serve an echo on a port until SIGTERM (then drain and stop).
    ServeEcho {
        /// The get-port to serve (default: a fresh one), or `-` (read
        /// from standard input) or @FILE, to keep it off the command line.
        #[arg(long, value_parser = crate::cli::secret::<GetPort>)]
        get_port: Option<GetPort>,
        /// Exit after serving this many requests.
        #[arg(long)]
        count: Option<u64>,
        /// Print one line per executed request ("executed TXN").
        #[arg(long)]
        log: bool,
    },
    /// Send a request to a port and print the reply.
    Call {
        /// The put-port to call.
        port: PutPort,
        /// The request body (default: empty).
        #[arg(long, default_value = "")]
        data: String,
        /// Give up after this many milliseconds.
        #[arg(long, default_value_t = 5000)]
        deadline_ms: u64,
        /// Repeat the call this many times (one line per reply).
        #[arg(long, default_value_t = 1)]
        repeat: u64,
    },
}

fn attach() -> Result<Context, Failure> {
    Context::from_env().map_err(|e| Failure::unreachable(e.to_string()))
}

pub fn run(command: RpcCommand) -> Result<(), Failure> {
    match command {
        RpcCommand::NewPort => {
            let get = GetPort::random();
            println!("get-port {}", get.to_hex());
            println!("put-port {}", get.put_port());
            Ok(())
        }
        RpcCommand::ServeEcho {
            get_port,
            count,
            log,
        } => {
            let ctx = attach()?;
            let get = get_port.unwrap_or_else(GetPort::random);
            let server = ctx.serve(get).map_err(|e| Failure::failed(e.to_string()))?;
            let stop = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                signal_hook::flag::register(signal, stop.clone()).map_err(|e| e.to_string())?;
            }
            {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "serving {} at {}", server.port(), server.local_addr());
                let _ = out.flush();
            }
            {
                let server = server.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let _ = server.shutdown();
                });
            }
            let mut served = 0u64;
            loop {
                match server.getreq() {
                    Ok(req) => {
                        if log {
                            use std::io::Write;
                            let mut out = std::io::stdout().lock();
                            let _ = writeln!(out, "executed {}", req.txn());
                            let _ = out.flush();
                        }
                        let body = req.body().to_vec();
                        server
                            .putrep(&req, body)
                            .map_err(|e| Failure::failed(e.to_string()))?;
                        served += 1;
                        if count.is_some_and(|c| served >= c) {
                            stop.store(true, Ordering::Release);
                            server
                                .shutdown()
                                .map_err(|e| Failure::failed(e.to_string()))?;
                            return Ok(());
                        }
                    }
                    Err(Error::Closed) => return Ok(()),
                    Err(e) => return Err(Failure::failed(e.to_string())),
                }
            }
        }
        RpcCommand::Call {
            port,
            data,
            deadline_ms,
            repeat,
        } => {
            let ctx = attach()?;
            let mut client = ctx.client().map_err(|e| Failure::failed(e.to_string()))?;
            let options = CallOptions {
                deadline: Some(Duration::from_millis(deadline_ms)),
                cancel: None,
            };
            for _ in 0..repeat {
                match client.trans_with(&port, data.clone().into_bytes(), &options) {
                    Ok(reply) => println!("{}", String::from_utf8_lossy(&reply)),
                    Err(Error::Trans(
                        e @ (TransError::NotFound { .. } | TransError::ServerUnreachable { .. }),
                    )) => return Err(Failure::unreachable(format!("[{}] {e}", e.code()))),
                    Err(Error::Trans(e)) => {
                        return Err(Failure::failed(format!("[{}] {e}", e.code())));
                    }
                    Err(e) => return Err(Failure::failed(e.to_string())),
                }
            }
            Ok(())
        }
    }
}
