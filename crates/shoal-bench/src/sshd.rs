//! OpenSSH's server on a node of a local cluster, for the benchmarks that
//! set shoal beside ssh (`exec`) and sshfs (`fs`): a host key and a client
//! key made for the run, password and PAM off, listening on the node's
//! cluster address.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use shoal_cluster::Cluster;

/// Where sshd listens.
pub const SSH_PORT: u16 = 2222;

/// A process of the benchmark's (a daemon that forks workers), in a
/// process group of its own: dropping it kills the whole group.
pub struct Daemon(Child);

impl Daemon {
    pub fn spawn(cmd: &mut Command, what: &str) -> Result<Daemon, String> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0)
            .spawn()
            .map(Daemon)
            .map_err(|e| format!("cannot start {what}: {e}"))
    }
}

impl Daemon {
    /// Whether the process has exited.
    fn exited(&mut self) -> bool {
        self.0.try_wait().is_ok_and(|s| s.is_some())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the group this daemon leads.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Runs `cmd`; its standard error is the error if it fails.
pub fn run_ok(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The address of `node` on the cluster network (its node address's IP).
pub fn ip_of(cluster: &Cluster, node: &str) -> Result<String, String> {
    Ok(cluster.node(node)?.addr.ip().to_string())
}

/// sshd running in a node's namespace.
pub struct Sshd {
    /// The client key it lets in (as root).
    pub key: PathBuf,
    /// The node's cluster address.
    pub ip: String,
    _daemon: Daemon,
}

impl Sshd {
    /// Starts `sshd` (the program at that path) on `node`, with its keys,
    /// configuration and log in `work`.
    pub fn start(cluster: &Cluster, node: &str, sshd: &Path, work: &Path) -> Result<Sshd, String> {
        let key = work.join("id_ed25519");
        let host_key = work.join("host_ed25519");
        for k in [&key, &host_key] {
            run_ok(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(k),
            )?;
        }
        std::fs::copy(key.with_extension("pub"), work.join("authorized_keys"))
            .map_err(|e| e.to_string())?;
        let ip = ip_of(cluster, node)?;
        std::fs::write(
            work.join("sshd_config"),
            format!(
                "ListenAddress {ip}:{SSH_PORT}\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
                 PidFile {}\nUseDNS no\nSubsystem sftp internal-sftp\n",
                host_key.display(),
                work.join("authorized_keys").display(),
                work.join("sshd.pid").display(),
            ),
        )
        .map_err(|e| e.to_string())?;
        // sshd's privilege separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let daemon = Daemon::spawn(
            cluster
                .command(node, sshd)?
                .args(["-D", "-e", "-f"])
                .arg(work.join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(work.join("sshd.log")).map_err(|e| e.to_string())?),
            &format!("sshd on {node}"),
        )?;
        Ok(Sshd {
            key,
            ip,
            _daemon: daemon,
        })
    }

    /// `ssh`'s options to log in as root without a question.
    pub fn ssh_options(&self) -> String {
        format!(
            "-i {} -p {SSH_PORT} -o BatchMode=yes -o GSSAPIAuthentication=no \
             -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.key.display()
        )
    }
}

/// An sshfs mount in a node's mount namespace, of a directory on the node
/// an [`Sshd`] runs on: what a user would otherwise mount to share a tree.
pub struct SshfsMount {
    pub path: PathBuf,
    unmount: Command,
    daemon: Daemon,
}

impl SshfsMount {
    /// Mounts `remote` (a directory on `sshd`'s node) at `path` on `node`
    /// with sshfs's defaults, and waits until it answers.
    pub fn start(
        cluster: &Cluster,
        node: &str,
        sshd: &Sshd,
        remote: &Path,
        path: &Path,
    ) -> Result<SshfsMount, String> {
        std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let log = path.with_extension("log");
        let options = format!(
            "IdentityFile={},port={SSH_PORT},BatchMode=yes,StrictHostKeyChecking=no,\
             UserKnownHostsFile=/dev/null,LogLevel=ERROR",
            sshd.key.display()
        );
        let spawn = || -> Result<Daemon, String> {
            Daemon::spawn(
                cluster
                    .command(node, "sshfs")?
                    .arg("-f")
                    .args(["-o", &options])
                    .arg(format!("root@{}:{}", sshd.ip, remote.display()))
                    .arg(path)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?),
                &format!("sshfs on {node}"),
            )
        };
        let mut unmount = cluster.command(node, "fusermount3")?;
        unmount.args(["-u", "-z"]).arg(path);
        let mut mount = SshfsMount {
            path: path.to_path_buf(),
            unmount,
            daemon: spawn()?,
        };
        // sshd may not listen yet: sshfs then exits, and is started again.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let mounted = cluster
                .command(node, "mountpoint")?
                .arg("-q")
                .arg(path)
                .status()
                .is_ok_and(|s| s.success());
            if mounted {
                return Ok(mount);
            }
            if std::time::Instant::now() > until {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "sshfs did not mount {} on {node}: {}",
                    path.display(),
                    said.trim()
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            if mount.daemon.exited() {
                mount.daemon = spawn()?;
            }
        }
    }
}

impl Drop for SshfsMount {
    fn drop(&mut self) {
        let _ = self
            .unmount
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
