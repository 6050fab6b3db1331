//! The client-facing endpoint of a replica: a server on
//! the service's port and the threads that take its requests, started
//! while the replica may answer and stopped (drained) when it may not.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use shoal_rpc::{Context, Server, Service};

/// A server endpoint and its threads.
type Pool = (Arc<Server>, Vec<JoinHandle<()>>);

/// A server endpoint and its threads, or nothing while not serving.
#[derive(Default)]
pub struct Serving {
    slot: Mutex<Option<Pool>>,
}

impl Serving {
    pub fn is_serving(&self) -> bool {
        self.slot.lock().is_some()
    }

    /// The serving endpoint, while serving (a handler that answers a
    /// request later, from another thread, keeps it with the request).
    pub fn server(&self) -> Option<Arc<Server>> {
        self.slot.lock().as_ref().map(|(s, _)| s.clone())
    }

    /// The serving endpoint's instance, while serving.
    pub fn instance(&self) -> Option<shoal_wire::Instance> {
        self.slot.lock().as_ref().map(|(s, _)| s.instance())
    }

    /// Serves `port` with `threads` threads named `name-N`, each running
    /// `serve` until the server shuts down; nothing if already serving or
    /// if `stopping()` (checked under the slot's lock, so a concurrent
    /// stop that set its flag first is never undone).
    pub fn start(
        &self,
        ctx: &Context,
        port: Service,
        threads: usize,
        name: &str,
        stopping: impl Fn() -> bool,
        serve: impl Fn(&Server) + Send + Sync + 'static,
    ) -> Result<(), shoal_rpc::Error> {
        let mut slot = self.slot.lock();
        if slot.is_some() || stopping() {
            return Ok(());
        }
        let server = Arc::new(ctx.serve(port)?);
        let serve = Arc::new(serve);
        let handles = (0..threads.max(1))
            .map(|i| {
                let (serve, srv) = (serve.clone(), server.clone());
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || serve(&srv))
                    .expect("spawn a server thread")
            })
            .collect();
        *slot = Some((server, handles));
        Ok(())
    }

    /// Stops serving: the server drains, its threads end.
    pub fn stop(&self) {
        let taken = self.slot.lock().take();
        if let Some((server, threads)) = taken {
            let _ = server.shutdown();
            for t in threads {
                let _ = t.join();
            }
        }
    }
}
