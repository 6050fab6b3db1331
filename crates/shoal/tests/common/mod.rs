//! What the real-cluster test binaries share: the `shoal` binary under
//! test and a local cluster torn down when dropped.

#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::Command;

use shoal_cluster::{Cluster, Mode, Spec};

pub fn shoal() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shoal"))
}

pub struct TestCluster {
    cluster: Option<Cluster>,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    /// A cluster of `nodes`; each test uses its own `name` and `subnet`.
    pub fn up(name: &str, subnet: u8, nodes: usize, mode: Mode) -> TestCluster {
        if mode == Mode::Netns {
            assert!(
                shoal_cluster::is_root(),
                "namespaced cluster tests need root"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            dir: dir.path().join("cluster"),
            nodes,
            name: name.into(),
            subnet,
            mode,
            shoal: shoal(),
        };
        let cluster = Cluster::up(&spec, &mut |l| eprintln!("[{name}] {l}")).unwrap();
        TestCluster {
            cluster: Some(cluster),
            _dir: dir,
        }
    }

    pub fn get(&self) -> &Cluster {
        self.cluster.as_ref().unwrap()
    }

    /// Runs `shoal ARGS` with this cluster's directory.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(shoal())
            .args(args)
            .arg("--dir")
            .arg(self.get().dir())
            .output()
            .unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take() {
            let _ = c.down(&mut |_| {});
        }
    }
}
