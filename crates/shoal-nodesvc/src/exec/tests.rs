//! The exec service's unit tests: programs started, read, written,
//! signalled, stopped and forgotten, with the daemon's settings.

use super::*;
use shoal_wire::NodeId;

fn id(seq: u64) -> ProcId {
    ProcId {
        home: NodeId(1),
        seq,
    }
}

fn spec(argv: &[&str], cwd: &str) -> StartSpec {
    StartSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec!["PATH=/usr/bin:/bin".into()],
        cwd: cwd.into(),
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        umask: 0o022,
        ..StartSpec::default()
    }
}

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// An exec service as the daemon makes it: namespaces when root.
fn exec() -> Arc<Exec> {
    Arc::new(Exec::new(root(), NodeId(1), crate::RemoteRoot::Allow, names()).unwrap())
}

/// Carries out `request` and waits for its answer.
fn call(exec: &Arc<Exec>, request: ExecRequest) -> ExecReply {
    let (tx, rx) = std::sync::mpsc::channel();
    exec.dispatch(
        request,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.recv_timeout(Duration::from_secs(30)).expect("an answer")
}

fn start(exec: &Arc<Exec>, id: ProcId, spec: StartSpec) {
    match call(
        exec,
        ExecRequest::Start {
            id,
            spec,
            grant: Vec::new(),
        },
    ) {
        ExecReply::Started { .. } => {}
        other => panic!("{other:?}"),
    }
}

/// Reads until the end: both streams and how the program ended.
fn drain(exec: &Arc<Exec>, id: ProcId) -> (Vec<u8>, Vec<u8>, Ended) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match call(
            exec,
            ExecRequest::Read {
                id,
                max: 1 << 20,
                wait_ms: 500,
            },
        ) {
            ExecReply::Output {
                stdout,
                stderr,
                ended,
                ..
            } => {
                out.extend(stdout);
                err.extend(stderr);
                if let Some(e) = ended {
                    return (out, err, e);
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_program_runs_with_its_home_s_settings_and_ends() {
    let exec = exec();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let start = ExecRequest::Start {
        grant: Vec::new(),
        id: id(1),
        spec: spec(&["sh", "-c", "pwd; read x; echo got $x >&2; exit 7"], d),
    };
    assert!(matches!(call(&exec, start), ExecReply::Started { .. }));
    assert_eq!(exec.count(), 1);
    let write = ExecRequest::Write {
        id: id(1),
        data: b"line\n".to_vec(),
        close: true,
    };
    assert_eq!(call(&exec, write), ExecReply::Done);
    let (out, err, ended) = drain(&exec, id(1));
    assert_eq!(out, format!("{d}\n").into_bytes());
    assert_eq!(err, b"got line\n");
    assert_eq!(ended, Ended::Exited(7));
    assert_eq!(
        exec.count(),
        0,
        "an ended program read to its end is forgotten"
    );
}

#[test]
fn what_cannot_start_is_refused_with_the_reason() {
    let exec = exec();
    let refused = |r: ExecReply| match r {
        ExecReply::Error(e) => e,
        other => panic!("{other:?}"),
    };
    let e = refused(call(
        &exec,
        ExecRequest::Start {
            grant: Vec::new(),
            id: id(2),
            spec: spec(&["true"], "/no/such/dir"),
        },
    ));
    assert!(
        e.contains("change directory: No such file or directory"),
        "{e}"
    );
    let e = refused(call(
        &exec,
        ExecRequest::Start {
            grant: Vec::new(),
            id: id(3),
            spec: spec(&["no-such-program-anywhere"], "/"),
        },
    ));
    assert!(e.contains("cannot start no-such-program-anywhere"), "{e}");
    let e = refused(call(
        &exec,
        ExecRequest::Signal {
            id: id(4),
            signal: 15,
        },
    ));
    // Named as ps names it: the home's name, not its node id.
    assert!(e.contains("no process n1.4 here"), "{e}");
}

#[test]
fn a_program_whose_home_is_gone_is_killed_and_forgotten() {
    let exec = exec();
    let start = ExecRequest::Start {
        grant: Vec::new(),
        id: id(6),
        spec: spec(&["sleep", "30"], "/"),
    };
    assert!(matches!(call(&exec, start), ExecReply::Started { .. }));
    exec.sweep(|_| true);
    assert_eq!(exec.count(), 1, "a live home's program stays");
    exec.sweep(|home| home != NodeId(1));
    let until = Instant::now() + Duration::from_secs(5);
    while exec.count() > 0 {
        assert!(Instant::now() < until, "the program was not forgotten");
        std::thread::sleep(Duration::from_millis(20));
        exec.sweep(|home| home != NodeId(1));
    }
}

#[test]
fn a_signal_reaches_the_program_s_group() {
    let exec = exec();
    let start = ExecRequest::Start {
        grant: Vec::new(),
        id: id(5),
        spec: spec(&["sh", "-c", "sleep 30 & wait"], "/"),
    };
    assert!(matches!(call(&exec, start), ExecReply::Started { .. }));
    let signal = ExecRequest::Signal {
        id: id(5),
        signal: libc::SIGTERM,
    };
    assert_eq!(call(&exec, signal), ExecReply::Done);
    let (_, _, ended) = drain(&exec, id(5));
    assert_eq!(ended, Ended::Killed(libc::SIGTERM));
}

#[test]
fn a_program_gets_its_home_s_host_name_limits_and_a_pid_namespace() {
    let exec = exec();
    let mut spec = spec(
        &[
            "sh",
            "-c",
            "echo $$; hostname; ulimit -n; ulimit -Hn; ps -e -o pid= | wc -l",
        ],
        "/",
    );
    spec.hostname = "home-of-the-test".into();
    spec.rlimits = vec![shoal_pool::exec::Rlimit {
        resource: libc::RLIMIT_NOFILE,
        soft: 77,
        hard: 99,
    }];
    start(&exec, id(7), spec);
    let (out, err, ended) = drain(&exec, id(7));
    assert_eq!(ended, Ended::Exited(0), "{}", String::from_utf8_lossy(&err));
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[2..4], ["77", "99"], "limits forwarded: {out}");
    if root() {
        // The watcher is pid 1; the program is 2; ps sees only these
        // two and itself (and the pipe's wc).
        assert_eq!(lines[0], "2", "{out}");
        assert_eq!(lines[1], "home-of-the-test", "{out}");
        assert!(lines[4].trim().parse::<u32>().unwrap() <= 4, "{out}");
    } else {
        assert_ne!(lines[0], "2", "{out}");
        assert_ne!(lines[1], "home-of-the-test", "{out}");
    }
}

#[test]
fn a_program_on_a_terminal_sees_one_and_its_size_changes() {
    let exec = exec();
    let mut spec = spec(
        &[
            "sh",
            "-c",
            "test -t 0 && test -t 1 && echo tty; stty size; read x; stty size; echo got $x",
        ],
        "/",
    );
    spec.tty = Some(shoal_pool::exec::WinSize {
        rows: 30,
        cols: 100,
    });
    start(&exec, id(8), spec);
    // Wait for the first size before changing it.
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains("30 100") {
        match call(
            &exec,
            ExecRequest::Read {
                id: id(8),
                max: 1 << 20,
                wait_ms: 500,
            },
        ) {
            ExecReply::Output { stdout, .. } => out.extend(stdout),
            other => panic!("{other:?}"),
        }
    }
    let resize = ExecRequest::Resize {
        id: id(8),
        size: shoal_pool::exec::WinSize {
            rows: 40,
            cols: 120,
        },
    };
    assert_eq!(call(&exec, resize), ExecReply::Done);
    let write = ExecRequest::Write {
        id: id(8),
        data: b"word\n".to_vec(),
        close: false,
    };
    assert_eq!(call(&exec, write), ExecReply::Done);
    let (rest, err, ended) = drain(&exec, id(8));
    out.extend(rest);
    let out = String::from_utf8_lossy(&out);
    assert!(err.is_empty(), "a terminal is one stream");
    assert_eq!(ended, Ended::Exited(0), "{out}");
    assert!(out.contains("tty\r\n30 100\r\n"), "{out:?}");
    // The terminal echoes the input, then the program's output.
    assert!(out.contains("40 120\r\ngot word\r\n"), "{out:?}");
}

#[test]
fn a_stop_typed_at_the_terminal_is_reported_and_undone() {
    let exec = exec();
    // The stop comes while the shell reads (a stop typed while a shell
    // forks stops the child before its exec, and the shell, blocked in
    // vfork, cannot stop: the same on a local terminal).
    let mut spec = spec(&["sh", "-c", "echo ready; read x; echo done $x"], "/");
    spec.tty = Some(shoal_pool::exec::WinSize { rows: 24, cols: 80 });
    start(&exec, id(9), spec);
    let read = || match call(
        &exec,
        ExecRequest::Read {
            id: id(9),
            max: 1 << 20,
            wait_ms: 500,
        },
    ) {
        ExecReply::Output {
            stdout, stopped, ..
        } => (stdout, stopped),
        other => panic!("{other:?}"),
    };
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains("ready") {
        out.extend(read().0);
    }
    // Ctrl-Z, as a terminal's user types it.
    let ctrl_z = ExecRequest::Write {
        id: id(9),
        data: vec![0x1a],
        close: false,
    };
    assert_eq!(call(&exec, ctrl_z), ExecReply::Done);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < until, "the stop was not reported");
        let (o, st) = read();
        out.extend(o);
        if st == Some(libc::SIGTSTP) {
            break;
        }
    }
    let cont = ExecRequest::Signal {
        id: id(9),
        signal: libc::SIGCONT,
    };
    assert_eq!(call(&exec, cont), ExecReply::Done);
    let write = ExecRequest::Write {
        id: id(9),
        data: b"go\n".to_vec(),
        close: false,
    };
    assert_eq!(call(&exec, write), ExecReply::Done);
    let (rest, _, ended) = drain(&exec, id(9));
    assert!(String::from_utf8_lossy(&rest).contains("done go"));
    assert_eq!(ended, Ended::Exited(0));
}

#[test]
fn a_stopped_program_is_not_hung_up_for_its_silent_home() {
    let exec = exec();
    start(&exec, id(10), spec(&["sleep", "30"], "/"));
    let signal = |s| {
        call(
            &exec,
            ExecRequest::Signal {
                id: id(10),
                signal: s,
            },
        )
    };
    let stopped = || exec.procs.lock()[&id(10)].output.0.lock().stopped;
    let age = |p: &mut Proc| p.last_read = Instant::now() - 2 * LEASE;
    assert_eq!(signal(libc::SIGSTOP), ExecReply::Done);
    let until = Instant::now() + Duration::from_secs(5);
    while stopped().is_none() {
        assert!(Instant::now() < until, "the stop was not seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    age(exec.procs.lock().get_mut(&id(10)).unwrap());
    exec.sweep(|_| true);
    assert!(
        exec.procs.lock()[&id(10)].hung_up.is_none(),
        "hung up while stopped"
    );
    assert_eq!(signal(libc::SIGCONT), ExecReply::Done);
    while stopped().is_some() {
        assert!(Instant::now() < until, "the continue was not seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    age(exec.procs.lock().get_mut(&id(10)).unwrap());
    exec.sweep(|_| true);
    assert!(
        exec.procs.lock()[&id(10)].hung_up.is_some(),
        "a silent home hangs up"
    );
    let (_, _, ended) = drain(&exec, id(10));
    assert_eq!(ended, Ended::Killed(libc::SIGHUP));
}

/// Writes to programs that never read, and reads of programs that never
/// write, are handed off: the caller gets its thread back while they
/// wait, and another program is served meanwhile.
#[test]
fn stuck_writes_and_quiet_reads_hold_no_thread() {
    let exec = exec();
    let mut pending = Vec::new();
    for i in 0..6 {
        start(&exec, id(100 + i), spec(&["sleep", "30"], "/"));
        // More than a pipe holds: this write cannot finish while the
        // program does not read.
        let (tx, rx) = std::sync::mpsc::channel();
        exec.dispatch(
            ExecRequest::Write {
                id: id(100 + i),
                data: vec![0; 8 << 20],
                close: false,
            },
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        let (rtx, rrx) = std::sync::mpsc::channel();
        exec.dispatch(
            ExecRequest::Read {
                id: id(100 + i),
                max: 1 << 20,
                wait_ms: 2000,
            },
            Box::new(move |r| {
                let _ = rtx.send(r);
            }),
        );
        pending.push((rx, rrx));
    }
    // No write can be done yet, and yet another program runs to its end
    // (the calls above returned, each leaving its request behind).
    for (write, _) in &pending {
        assert!(write.try_recv().is_err(), "the write cannot be done yet");
    }
    start(&exec, id(200), spec(&["sh", "-c", "echo served"], "/"));
    let (out, _, ended) = drain(&exec, id(200));
    assert_eq!((out, ended), (b"served\n".to_vec(), Ended::Exited(0)));
    // The quiet reads end empty when their wait is over; the writes end
    // once their programs are gone.
    for (_, read) in &pending {
        let r = read.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(
            matches!(&r, ExecReply::Output { stdout, ended: None, .. } if stdout.is_empty()),
            "{r:?}"
        );
    }
    for i in 0..6 {
        call(
            &exec,
            ExecRequest::Signal {
                id: id(100 + i),
                signal: libc::SIGKILL,
            },
        );
    }
    for (write, _) in &pending {
        assert_eq!(
            write.recv_timeout(Duration::from_secs(30)).unwrap(),
            ExecReply::Done
        );
    }
}

/// A start runs only with a grant its home made, clamped to it; a remote
/// root is squashed unless the node allows it.
#[test]
fn starts_are_clamped_to_their_home_s_grant() {
    use shoal_pool::exec::{Grant, Rlimit};
    let home = NodeId(1);
    let caller = |node: NodeId, uid: u32| shoal_rpc::Caller {
        node,
        uid,
        client: shoal_wire::ClientId(7),
    };
    // The "sealed" grant is its plaintext behind the node that made it.
    let opener = |sealed: &[u8]| -> Result<(NodeId, Vec<u8>), String> {
        let (node, plain) = sealed.split_first().ok_or("no grant")?;
        Ok((NodeId(u64::from(*node)), plain.to_vec()))
    };
    let sealed = |by: u8, g: &Grant| [vec![by], g.encode()].concat();
    let user = Grant {
        id: id(1),
        uid: 1000,
        gid: 100,
        groups: vec![100, 27],
        hard: vec![(libc::RLIMIT_NOFILE, 512)],
    };
    let start = |uid: u32, grant: Vec<u8>| {
        let mut s = spec(&["true"], "/");
        s.uid = uid;
        s.gid = 100;
        s.groups = vec![27, 4];
        s.rlimits = vec![Rlimit {
            resource: libc::RLIMIT_NOFILE,
            soft: 4096,
            hard: 65_536,
        }];
        ExecRequest::Start {
            id: id(1),
            spec: s,
            grant,
        }
    };
    let exec = Exec::new(false, NodeId(2), crate::RemoteRoot::Squash, names()).unwrap();

    let mut r = start(1000, sealed(1, &user));
    exec.authorize(caller(home, 1000), &mut r, &opener).unwrap();
    let ExecRequest::Start { spec, .. } = &r else {
        unreachable!()
    };
    assert_eq!(spec.groups, vec![27], "a group the process lacked was kept");
    assert_eq!((spec.rlimits[0].soft, spec.rlimits[0].hard), (512, 512));

    let before = exec.refused();
    // No grant; a grant another node made; another process's grant.
    for (mut r, why) in [
        (start(1000, Vec::new()), "start grant is refused"),
        (start(1000, sealed(3, &user)), "not its home's"),
        (
            start(
                1000,
                sealed(
                    1,
                    &Grant {
                        id: id(2),
                        ..user.clone()
                    },
                ),
            ),
            "is for process",
        ),
    ] {
        let e = exec
            .authorize(caller(home, 1000), &mut r, &opener)
            .unwrap_err();
        assert!(e.contains(why), "{e}");
    }
    assert_eq!(exec.refused(), before + 3);

    // Root on the home: squashed here, kept where remote root is allowed.
    let root_grant = Grant {
        uid: 0,
        gid: 0,
        groups: vec![0],
        ..user.clone()
    };
    let as_root = |exec: &Exec| {
        let mut r = start(0, sealed(1, &root_grant));
        if let ExecRequest::Start { spec, .. } = &mut r {
            spec.gid = 0;
        }
        exec.authorize(caller(home, 0), &mut r, &opener).unwrap();
        match r {
            ExecRequest::Start { spec, .. } => (spec.uid, spec.groups),
            _ => unreachable!(),
        }
    };
    let (nobody, nogroup) = crate::account::nobody();
    assert_eq!(as_root(&exec), (nobody, vec![nogroup]));
    let allowing = Exec::new(false, NodeId(2), crate::RemoteRoot::Allow, names()).unwrap();
    assert_eq!(as_root(&allowing).0, 0);

    // Review 3, L11: a squashed root's program runs as nobody but is its
    // home's root's: a `nobody` of the home may not signal it.
    assert!(root(), "running a program as nobody needs root");
    let exec = Arc::new(Exec::new(root(), NodeId(2), crate::RemoteRoot::Squash, names()).unwrap());
    let mut s = self::spec(&["sleep", "30"], "/");
    (s.uid, s.gid, s.groups) = (0, 0, vec![0]);
    let mut r = ExecRequest::Start {
        id: id(2),
        spec: s,
        grant: sealed(
            1,
            &Grant {
                id: id(2),
                ..root_grant.clone()
            },
        ),
    };
    exec.authorize(caller(home, 0), &mut r, &opener).unwrap();
    assert!(matches!(call(&exec, r), ExecReply::Started { .. }));
    let mut signal = ExecRequest::Signal {
        id: id(2),
        signal: libc::SIGKILL,
    };
    let refused = exec.authorize(caller(home, nobody), &mut signal, &opener);
    assert!(refused.is_err_and(|e| e.contains("uid 0's")));
    exec.authorize(caller(home, 0), &mut signal, &opener)
        .unwrap();
    assert_eq!(call(&exec, signal), ExecReply::Done);
}

/// Review 3, L7: a start's program and working directory are looked up by
/// the program's own process, as its user: in a directory the user may
/// not search, what is there and what is not fail alike.
#[test]
fn a_start_tells_a_user_nothing_of_places_they_cannot_see() {
    use std::os::unix::fs::PermissionsExt;
    assert!(root(), "starting a program as nobody needs root");
    let tmp = tempfile::tempdir().unwrap();
    let hidden = tmp.path().join("hidden");
    std::fs::create_dir_all(hidden.join("sub")).unwrap();
    std::fs::copy("/bin/true", hidden.join("x")).unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exec = exec();
    let (nobody, nogroup) = crate::account::nobody();
    let mut seq = 10;
    let mut error = |argv: &str, cwd: &str| {
        seq += 1;
        let mut s = spec(&[argv], cwd);
        (s.uid, s.gid, s.groups) = (nobody, nogroup, vec![nogroup]);
        match call(
            &exec,
            ExecRequest::Start {
                grant: Vec::new(),
                id: id(seq),
                spec: s,
            },
        ) {
            ExecReply::Error(e) => e.replace(argv, "PROGRAM"),
            other => panic!("{other:?}"),
        }
    };
    let path = |p: &str| hidden.join(p).display().to_string();
    let there = error(&path("x"), "/");
    let absent = error(&path("y"), "/");
    assert_eq!(there, absent);
    assert!(there.contains("Permission denied"), "{there}");
    let there = error("true", &path("sub"));
    let absent = error("true", &path("nosuch"));
    assert_eq!(there, absent);
    assert!(there.contains("change directory"), "{there}");
}

/// The names table of a node `n2` that knows `n1` (the homes the tests
/// use).
fn names() -> Arc<crate::names::Names> {
    let names = crate::names::Names::new(NodeId(2), "n2");
    names.learn(NodeId(1), "n1");
    Arc::new(names)
}
