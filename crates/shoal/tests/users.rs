//! Every user command works for an ordinary local user, without root
//! (`docs/security.md`, "Local authority"): on a namespaced cluster whose
//! directory and file services root started, an administrator makes the
//! user's root with `shoal init --user`, and the user, a real account with
//! a home directory, runs `dir`, `file`, `rpc`, `group`, `run`, `ps`,
//! `kill`, `wait` and `make` as themselves; what is the administrator's
//! alone is refused with a clear error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Daemon, TestCluster, fails_with, open_path_to, shoal};
use shoal_cluster::{Cluster, Mode};

const USER: &str = "shoal-user";

struct Site<'a> {
    c: &'a Cluster,
    uid: u32,
    gid: u32,
    home: PathBuf,
    services: Vec<Daemon>,
    admin: tempfile::TempDir,
}

impl Site<'_> {
    fn logs(&self) -> String {
        self.services
            .iter()
            .map(|d| format!("--- {} ({}) ---\n{}\n", d.log.display(), d.node, d.tail()))
            .collect()
    }

    /// `shoal ARGS` on `node` as root, the administrator.
    fn admin(&self, node: &str, args: &[&str]) -> Output {
        self.c
            .command(node, shoal())
            .unwrap()
            .env("SHOAL_CONFIG_DIR", self.admin.path())
            .args(args)
            .output()
            .unwrap()
    }

    /// `shoal ARGS` on `node` as the user, in their home.
    fn user_command(&self, node: &str, program: &Path, args: &[&str]) -> Command {
        let mut cmd = self.c.command(node, "setpriv").unwrap();
        cmd.args(["--reuid", &self.uid.to_string()])
            .args(["--regid", &self.gid.to_string()])
            .args(["--init-groups", "--"])
            .arg(program)
            .args(args)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("SHOAL_NODE", &self.c.node(node).unwrap().socket)
            .env("SHOAL_FILE_CACHE", "off")
            .current_dir(&self.home);
        cmd
    }

    fn user(&self, node: &str, args: &[&str]) -> Output {
        self.user_command(node, &shoal(), args).output().unwrap()
    }

    /// The user's `shoal ARGS`, which must succeed: its standard output.
    fn user_ok(&self, node: &str, args: &[&str]) -> String {
        let out = common::until_ok(
            &format!("{USER}'s shoal {args:?}"),
            || self.user(node, args),
            || self.logs(),
        );
        String::from_utf8(out).unwrap()
    }

    /// The user's `shoal ARGS` in the background, its output in `log`.
    fn user_spawn(&self, node: &str, args: &[&str], log: &Path) -> Child {
        let file = std::fs::File::create(log).unwrap();
        self.user_command(node, &shoal(), args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap()
    }
}

fn wait_for(log: &Path, what: &str, needle: &str) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < until, "{what}: no {needle:?} in {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Root's services: three directory replicas, two file servers, root's
/// own root; the user's account.
fn site(c: &Cluster) -> Site<'_> {
    let (uid, gid) = common::local_user(USER, true);
    let home = PathBuf::from(format!("/home/{USER}"));
    open_path_to(c.dir());
    open_path_to(shoal().parent().unwrap());
    let admin = tempfile::tempdir().unwrap();
    let mut s = Site {
        c,
        uid,
        gid,
        home,
        services: Vec::new(),
        admin,
    };
    let data = s.admin.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    s.services = common::dir_replicas(c, &data);
    common::until_ok("shoal init", || s.admin("n1", &["init"]), || s.logs());
    for i in 1..=2 {
        let server = common::file_server(c, i, &data, s.admin.path(), &[]);
        s.services.push(server);
    }
    let until = Instant::now() + Duration::from_secs(40);
    loop {
        let out = s.admin("n1", &["file", "servers"]);
        let text = String::from_utf8_lossy(&out.stdout);
        if text.lines().filter(|l| l.contains("files=")).count() == 2 {
            break;
        }
        assert!(Instant::now() < until, "servers: {text}\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    s
}

#[test]
fn an_ordinary_user_uses_every_command_as_themselves() {
    let t = TestCluster::up("ud", 48, 3, Mode::Netns);
    let c = t.get();
    let s = site(c);
    let uid = s.uid.to_string();

    // The administrator makes the user's root; the user's own attempt to
    // make someone else's is refused.
    let made = s.admin("n1", &["init", "--user", USER, "--force"]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let saved = s.home.join(".config/shoal/root");
    let meta = std::fs::metadata(&saved).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), s.uid);
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    fails_with(&s.user("n1", &["init", "--user", "root"]), "only root");

    // The replicas' group port is for their peers: whoever knows it could
    // join the group and read and send the replicas' traffic.  Root's
    // peers see it; the user, asking the same replicas, does not.
    let all = |out: Output| String::from_utf8(out.stdout).unwrap();
    let root_sees = all(s.admin("n2", &["dir", "status", "--all", "--json"]));
    assert!(root_sees.contains("\"group_port\":\""), "{root_sees}");
    for args in [
        &["dir", "status", "--all", "--json"][..],
        &["dir", "status", "--json"],
    ] {
        let user_sees = s.user_ok("n2", args);
        assert!(user_sees.contains("\"phase\""), "{user_sees}");
        assert!(!user_sees.contains("\"group_port\":\""), "{user_sees}");
    }

    // status: the node the user's program is attached to.
    let status = s.user_ok("n2", &["status"]);
    assert!(status.contains("node     n2"), "{status}");

    // dir: the user's own tree.
    let listing = s.user_ok("n2", &["dir", "ls"]);
    assert!(listing.contains("fileservers"), "{listing}");
    s.user_ok("n1", &["dir", "mkdir", "docs"]);
    let docs = s.user_ok("n2", &["dir", "lookup", "docs"]);
    let docs = docs.lines().next().unwrap().to_string();
    s.user_ok("n3", &["dir", "put", "docs/again", &docs]);
    s.user_ok("n1", &["dir", "mv", "docs/again", "docs/moved"]);
    assert_eq!(
        s.user_ok("n2", &["dir", "lookup", "docs/moved"]).trim(),
        docs
    );
    s.user_ok("n3", &["dir", "rm", "docs/moved"]);

    // A root the user makes alone works, with a warning that nothing
    // keeps files stored under it.
    let own = s.home.join("own-config");
    let made = s
        .user_command("n1", &shoal(), &["init"])
        .env("SHOAL_CONFIG_DIR", &own)
        .output()
        .unwrap();
    let warned = String::from_utf8_lossy(&made.stderr);
    assert!(made.status.success(), "{warned}");
    assert!(
        warned.contains("age away") && warned.contains(USER),
        "{warned}"
    );
    std::fs::remove_dir_all(&own).unwrap();

    // file: stored on root's servers through the user's root, read back
    // anywhere; administration is refused.
    let source = s.home.join("source.txt");
    let bytes = format!("{USER}'s bytes {}\n", std::process::id());
    std::fs::write(&source, &bytes).unwrap();
    std::os::unix::fs::chown(&source, Some(s.uid), Some(s.gid)).unwrap();
    s.user_ok("n1", &["file", "put", "docs/f", source.to_str().unwrap()]);
    assert_eq!(s.user_ok("n3", &["file", "cat", "docs/f"]), bytes);
    assert!(
        s.user_ok("n2", &["file", "stat", "docs/f"])
            .contains("committed  true")
    );
    assert!(s.user_ok("n2", &["file", "servers"]).contains("fs1"));
    let fsck = s.user("n2", &["file", "fsck"]);
    assert!(!fsck.status.success());
    assert!(
        String::from_utf8_lossy(&fsck.stdout).contains("the operation needs ----a---"),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    // The administrator's object manager reaches the user's file.
    let gc = String::from_utf8(common::until_ok(
        "shoal file gc",
        || s.admin("n1", &["file", "gc", "--no-age"]),
        || s.logs(),
    ))
    .unwrap();
    assert!(gc.contains("touched=2"), "{gc}");
    s.user_ok("n1", &["file", "rm", "docs/f"]);
    fails_with(&s.user("n2", &["file", "cat", "docs/f"]), "not found");

    // rpc: a user's server, called from another node.
    let tmp = tempfile::tempdir().unwrap();
    open_path_to(tmp.path());
    std::os::unix::fs::chown(tmp.path(), Some(s.uid), Some(s.gid)).unwrap();
    let echo_log = tmp.path().join("echo.log");
    let mut echo = s.user_spawn("n2", &["rpc", "serve-echo", "--count", "1"], &echo_log);
    let serving = wait_for(&echo_log, "serve-echo", "serving ");
    let port = serving.split_whitespace().nth(1).unwrap().to_string();
    s.user_ok("n3", &["rpc", "call", &port, "--data", "ping"]);
    assert!(echo.wait().unwrap().success());

    // group: created on one node, sent to from another, seen by a third.
    let group_log = tmp.path().join("group.log");
    let mut member = s.user_spawn("n1", &["group", "create", "--no-input"], &group_log);
    let first = wait_for(&group_log, "group create", "member ");
    let group = first.split_whitespace().nth(1).unwrap().to_string();
    s.user_ok("n2", &["group", "send", &group, "hello-from-n2"]);
    wait_for(&group_log, "group delivery", "hello-from-n2");
    assert!(
        s.user_ok("n3", &["group", "info", &group])
            .contains("normal")
    );
    member.kill().unwrap();
    member.wait().unwrap();

    // run, ps, kill, wait: the user's own programs, as themselves.
    assert_eq!(
        s.user_ok("n1", &["run", "--on", "n2", "--", "id", "-u"])
            .trim(),
        uid
    );
    assert_eq!(
        s.user_ok("n2", &["run", "--any", "--", "id", "-u"]).trim(),
        uid
    );
    let mark = format!("91.{}", std::process::id());
    let mut sleeper = s
        .user_command("n1", &shoal(), &["run", "--on", "n3", "--", "sleep", &mark])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let ps = s.user("n2", &["ps", "--json"]);
        let rows: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap_or_default();
        let row = rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["command"].as_str() == Some(&format!("sleep {mark}")))
            .cloned();
        if let Some(row) = row {
            assert_eq!(row["user"].as_str(), Some(USER), "{row}");
            break row["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < until, "the user's program never showed");
        std::thread::sleep(Duration::from_millis(100));
    };
    s.user_ok("n2", &["kill", &id]);
    let waited = s.user("n3", &["wait", &id]);
    assert_eq!(
        waited.status.code(),
        Some(128 + libc::SIGTERM),
        "{waited:?}"
    );
    sleeper.wait().unwrap();

    // make: recipes run over the cluster as the user, in their directory.
    let project = s.home.join(format!("project-{}", std::process::id()));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("Makefile"),
        "all: a b c\na b c:\n\tid -u > $@\n",
    )
    .unwrap();
    for p in [&project, &project.join("Makefile")] {
        std::os::unix::fs::chown(p, Some(s.uid), Some(s.gid)).unwrap();
    }
    let make = s
        .user_command("n1", &shoal(), &["make", "-j3"])
        .current_dir(&project)
        .output()
        .unwrap();
    assert!(
        make.status.success(),
        "{}",
        String::from_utf8_lossy(&make.stderr)
    );
    for target in ["a", "b", "c"] {
        let made = project.join(target);
        assert_eq!(std::fs::read_to_string(&made).unwrap().trim(), uid);
        let meta = std::fs::metadata(&made).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), s.uid);
    }
    std::fs::remove_dir_all(&project).unwrap();
    std::fs::remove_file(&source).unwrap();
}
