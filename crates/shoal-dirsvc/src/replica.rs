//! One replica of the directory service, group variant: the directory's
//! state machine (`shoal_dir::replica::ReplicaState`) on the replica shell
//! (`shoal_replicasvc`), and how a replica answers the directory's
//! requests.
//!
//! A write arrives by RPC at any replica, which sends it to the group and
//! answers once it has applied it and — in the `fsync` mode — once its
//! log holds it on disk.  Reads are served by the replica the client
//! reaches, once that replica has applied every write the client has
//! seen; a linearizable read first sends an ordered no-op through the
//! group and waits for it.  Forming, joining, the log and snapshots are
//! the shell's (`shoal_replicasvc::replica`).

use std::path::PathBuf;
use std::sync::Arc;

use shoal_cap::PutPort;
use shoal_dir::op::FLAG_LINEARIZABLE;
use shoal_dir::replica::ReplicaState;
use shoal_dir::{DirError, Op, Request, Response};
use shoal_replicasvc::{Handler, Ports, Replicated, Unavailable};
use shoal_rpc::{Context, Server};

pub use shoal_replicasvc::Durability;

/// How a replica runs (`service` is the directory service's name; its
/// ports derive from it and the cluster id).
pub type ReplicaConfig = shoal_replicasvc::Config;

/// A running directory replica.
pub struct Replica(shoal_replicasvc::Replica<ReplicaState>);

/// Defaults for replica `replica` of `replicas` of the default directory
/// service, storing in `data_dir`.
pub fn config(replica: usize, replicas: usize, data_dir: PathBuf) -> ReplicaConfig {
    ReplicaConfig::new(crate::DEFAULT_SERVICE, replica, replicas, data_dir)
}

impl Replica {
    /// Recovers from the data directory and starts the replica's threads.
    pub fn start(ctx: Context, cfg: ReplicaConfig) -> std::io::Result<Replica> {
        let cluster = ctx.config().cluster;
        let ports = Ports {
            service: crate::service_port(&cluster, &cfg.service),
            peers: (0..cfg.replicas)
                .map(|i| crate::peer_port(&cluster, &cfg.service, i))
                .collect(),
        };
        shoal_replicasvc::Replica::start(ctx, cfg, ports, Arc::new(Directory)).map(Replica)
    }

    /// The service's port.
    pub fn port(&self) -> PutPort {
        self.0.port()
    }

    /// The replica's status as JSON, as its own process sees it (its
    /// group's port included).
    pub fn status(&self) -> serde_json::Value {
        self.0.status()
    }

    /// Whether the replica is in its group and serving.
    pub fn is_serving(&self) -> bool {
        self.0.is_serving()
    }

    /// Flushes the log, leaves the group and stops.
    pub fn stop(self) {
        self.0.stop()
    }
}

/// The directory's requests, answered by a replica.
struct Directory;

type Rep = Replicated<ReplicaState>;

fn unavailable(e: Unavailable) -> DirError {
    DirError::Unavailable(e.0)
}

impl Handler<ReplicaState> for Directory {
    fn serve(&self, r: &Rep, server: &Server, request: shoal_rpc::Request) {
        let response = match Request::decode(request.body()) {
            Ok(req) => handle(r, req),
            Err(e) => error(r, DirError::BadRequest(e.to_string())),
        };
        let _ = server.putrep(&request, response.encode());
    }
}

fn handle(r: &Rep, req: Request) -> Response {
    if matches!(req.op, Op::Status) {
        return Response {
            index: r.index(),
            result: Ok(shoal_dir::Answer::Status(r.status(false).to_string())),
        };
    }
    let write = req.op.is_write();
    r.count(write);
    let done = if write {
        self::write(r, req)
    } else {
        read(r, req)
    };
    done.unwrap_or_else(|e| error(r, e))
}

fn error(r: &Rep, e: DirError) -> Response {
    Response {
        index: r.index(),
        result: Err(e),
    }
}

fn write(r: &Rep, mut req: Request) -> Result<Response, DirError> {
    if req.client == 0 {
        return Err(DirError::BadRequest("writes need a client id".into()));
    }
    if let Op::CreateDir { secret, .. } = &mut req.op {
        *secret = rand::random();
    }
    let response = r.order(&req.encode()).map_err(unavailable)?;
    r.durable(response.index).map_err(unavailable)?;
    r.still_serving().map_err(unavailable)?;
    Ok(response)
}

fn read(r: &Rep, req: Request) -> Result<Response, DirError> {
    if req.flags & FLAG_LINEARIZABLE != 0 {
        let sync = Request {
            client: 0,
            seq: 0,
            min_index: 0,
            flags: 0,
            op: Op::Sync,
        };
        r.order(&sync.encode()).map_err(unavailable)?;
    }
    r.catch_up(req.min_index).map_err(unavailable)?;
    let response = r.read(|rs| rs.read(&req));
    // A read must not show a write that a crash of every replica could
    // still take back: in the fsync mode it waits for the log too.
    if !matches!(response.result, Err(DirError::Behind { .. })) {
        r.durable(response.index).map_err(unavailable)?;
    }
    r.still_serving().map_err(unavailable)?;
    Ok(response)
}
