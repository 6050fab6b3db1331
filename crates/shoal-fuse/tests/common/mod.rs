//! What the mount tests share: three in-process nodes, a file server, the
//! metadata service's three replicas, and the tree mounted twice, as two
//! nodes of one cluster mount it.
#![allow(dead_code)]

use std::fs;
use std::time::{Duration, Instant};

use shoal_bulletsvc::{FileServer, ServerConfig};
use shoal_fssvc::{FsConfig, MetaReplica};
use shoal_fuse::{Mount, Tuning};
use shoal_replicasvc::Durability;
use shoal_testnodes::Nodes;

pub fn replicas(nodes: &Nodes, name: &str, server: shoal_cap::Capability) -> Vec<MetaReplica> {
    let r: Vec<MetaReplica> = (0..3)
        .map(|i| {
            let mut cfg = FsConfig::new(name, i, 3, nodes.path(&format!("meta{i}")));
            cfg.replica.durability = Durability::Fsync;
            cfg.allow_root = true;
            cfg.file_servers = vec![server];
            cfg.copies = 1;
            MetaReplica::start(nodes.ctx[i].clone(), cfg).unwrap()
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while !(r.iter().all(MetaReplica::is_serving)
        && r.iter().filter(|x| x.status()["primary"] == true).count() == 1)
    {
        assert!(Instant::now() < until, "no primary within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    r
}

/// Which replica is the primary.
pub fn primary_of(replicas: &[MetaReplica]) -> usize {
    replicas
        .iter()
        .position(|r| r.status()["primary"] == true)
        .expect("a primary")
}

pub fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Three nodes, a file server, the metadata service's replicas, and the
/// tree mounted on n1 at `pa` and on n2 at `pb`.
pub struct Setup {
    pub nodes: Nodes,
    pub server: FileServer,
    pub service: Vec<MetaReplica>,
    pub pa: std::path::PathBuf,
    pub pb: std::path::PathBuf,
    pub a: Mount,
    pub b: Mount,
}

impl Setup {
    pub fn up(name: &str) -> Setup {
        Setup::up_with(name, Tuning::default())
    }

    /// [`Setup::up`], with both mounts tuned as `tuning`.
    pub fn up_with(name: &str, tuning: Tuning) -> Setup {
        let nodes = Nodes::up(3);
        let server =
            FileServer::start(&nodes.ctx[0], &nodes.path("files"), ServerConfig::default())
                .unwrap();
        let service = replicas(&nodes, name, server.cap());
        let (pa, pb) = (nodes.path("a"), nodes.path("b"));
        fs::create_dir_all(&pa).unwrap();
        fs::create_dir_all(&pb).unwrap();
        let a = Mount::start(&nodes.ctx[0], name, "n1", &pa, tuning)
            .expect("mount a (root and /dev/fuse)");
        let b = Mount::start(&nodes.ctx[1], name, "n2", &pb, tuning).expect("mount b");
        Setup {
            nodes,
            server,
            service,
            pa,
            pb,
            a,
            b,
        }
    }

    /// Unmounts both mounts, then stops the replicas and the file server.
    pub fn down(self) {
        self.a.stop().unwrap();
        self.b.stop().unwrap();
        for r in self.service {
            r.stop();
        }
        self.server.stop().unwrap();
    }
}

/// `fcntl(2)` on a descriptor: a lock (`F_SETLK`, or `F_SETLKW` with
/// `wait`) of `typ` on `len` bytes (0: to the end) from `start`.
pub fn lock(f: &fs::File, typ: i32, start: i64, len: i64, wait: bool) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value; fcntl reads it.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
    // SAFETY: the descriptor is open for the call; `fl` outlives it.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &fl) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}
