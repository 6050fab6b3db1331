//! The tree mounted twice, as two nodes of one cluster mount it (three
//! in-process node daemons, the metadata service's three replicas, a file
//! server), used through the kernel with ordinary file calls: what one
//! mount writes the other reads at once; names, links, symlinks,
//! renames, permissions, truncation, appends from both mounts, a file
//! unlinked while open elsewhere, names that are not UTF-8, and the
//! errors of bad names; then the primary stops, and a file open on one
//! mount and removed on the other stays readable (the mounts reclaimed
//! their opens at the new primary); extended attributes and capabilities;
//! `fcntl` locks across the mounts.  Needs root and /dev/fuse (as `cargo
//! xtask test` has).

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use shoal_fssvc::MetaReplica;

mod common;

use common::{Setup, errno, lock, primary_of};

const NAME: &str = "fs-mount-test";

#[test]
fn two_mounts_share_one_tree() {
    let Setup {
        nodes: _nodes,
        server,
        service,
        pa,
        pb,
        a,
        b,
    } = Setup::up(NAME);

    // Written on one node, read at once on the other.
    fs::write(pa.join("hello"), b"hello from a\n").unwrap();
    assert_eq!(fs::read(pb.join("hello")).unwrap(), b"hello from a\n");
    fs::write(pb.join("hello"), b"b\n").unwrap();
    assert_eq!(fs::read(pa.join("hello")).unwrap(), b"b\n");

    // Directories, renames across them and over a target, listings.
    fs::create_dir(pa.join("d1")).unwrap();
    fs::create_dir(pa.join("d2")).unwrap();
    fs::write(pa.join("d1/x"), b"x").unwrap();
    fs::write(pa.join("d2/y"), b"y").unwrap();
    fs::rename(pb.join("d1/x"), pb.join("d2/y")).unwrap();
    assert_eq!(fs::read(pa.join("d2/y")).unwrap(), b"x");
    let mut names: Vec<_> = fs::read_dir(pa.join("d2"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, vec![OsStr::new("y")]);
    assert_eq!(fs::read_dir(pb.join("d1")).unwrap().count(), 0);
    assert_eq!(
        errno(fs::remove_dir(pa.join("d2")).unwrap_err()),
        libc::ENOTEMPTY
    );
    assert_eq!(fs::metadata(pa.join("d2")).unwrap().nlink(), 2);

    // Links, symlinks, permissions, truncation.
    fs::hard_link(pa.join("d2/y"), pa.join("d2/z")).unwrap();
    assert_eq!(fs::metadata(pb.join("d2/y")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("d2/z", pa.join("s")).unwrap();
    assert_eq!(fs::read_link(pb.join("s")).unwrap(), Path::new("d2/z"));
    assert_eq!(fs::read(pb.join("s")).unwrap(), b"x");
    fs::set_permissions(pa.join("hello"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(pb.join("hello")).unwrap().mode() & 0o7777,
        0o600
    );
    let f = OpenOptions::new()
        .write(true)
        .open(pb.join("hello"))
        .unwrap();
    f.set_len(1).unwrap();
    drop(f);
    assert_eq!(fs::read(pa.join("hello")).unwrap(), b"b");

    // Appends from both mounts: every line, in one order for both.
    let mut fa = OpenOptions::new()
        .create(true)
        .append(true)
        .open(pa.join("log"))
        .unwrap();
    let mut fb = OpenOptions::new()
        .append(true)
        .open(pb.join("log"))
        .unwrap();
    for i in 0..20 {
        fa.write_all(format!("a{i:02}\n").as_bytes()).unwrap();
        fb.write_all(format!("b{i:02}\n").as_bytes()).unwrap();
    }
    drop((fa, fb));
    let log_a = fs::read_to_string(pa.join("log")).unwrap();
    assert_eq!(log_a, fs::read_to_string(pb.join("log")).unwrap());
    assert_eq!(log_a.lines().count(), 40);
    for i in 0..20 {
        assert!(log_a.contains(&format!("a{i:02}\n")) && log_a.contains(&format!("b{i:02}\n")));
    }

    // A file removed on one node while open on the other stays readable
    // there until closed.
    fs::write(pa.join("doomed"), b"still here").unwrap();
    let mut open_b = fs::File::open(pb.join("doomed")).unwrap();
    fs::remove_file(pa.join("doomed")).unwrap();
    assert_eq!(
        errno(fs::metadata(pb.join("doomed")).unwrap_err()),
        libc::ENOENT
    );
    let mut got = Vec::new();
    open_b.rewind().unwrap();
    open_b.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"still here");
    drop(open_b);

    // A file unlinked by the mount that has it open: written and read
    // through the open file at once (the write waits at the primary for
    // the recall the unlink caused, which this mount answers meanwhile).
    for i in 0..5 {
        let path = pa.join(format!("self{i}"));
        let mut f = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        fs::remove_file(&path).unwrap();
        assert_eq!(f.metadata().unwrap().nlink(), 0);
        f.write_all(b"still mine").unwrap();
        let mut got = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"still mine");
    }

    // Names are bytes; bad names get their errno.
    let raw = OsStr::from_bytes(&[0xff, 0xfe, b'n']);
    fs::write(pa.join(raw), b"bytes").unwrap();
    assert_eq!(fs::read(pb.join(raw)).unwrap(), b"bytes");
    let long = "n".repeat(256);
    assert_eq!(
        errno(fs::write(pa.join(&long), b"").unwrap_err()),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno(fs::create_dir(pa.join("hello")).unwrap_err()),
        libc::EEXIST
    );

    // statfs answers.
    let st = statfs_files(&pa);
    assert!(st > 0);

    // A file open on both mounts loses its name; the primary stops. Each
    // mount reclaims its opens at the next primary, within its grace
    // period, so when a closes the file b still reads it; when b closes
    // it too, it is forgotten.
    // A private directory's changes not yet pushed: the new primary takes
    // the mount's tokens back in its grace period, so they are pushed
    // after it, not lost.  (A private directory with names the primary
    // has not heard of is not empty to rmdir.)
    fs::create_dir_all(pa.join("full/inner")).unwrap();
    assert_eq!(
        errno(fs::remove_dir(pa.join("full")).unwrap_err()),
        libc::ENOTEMPTY
    );
    fs::create_dir_all(pa.join("private/deeper")).unwrap();
    fs::write(pa.join("private/deeper/x"), b"made before the crash").unwrap();
    let before = service[0].status()["inodes"].as_u64().unwrap();
    fs::write(pa.join("kept"), b"kept open").unwrap();
    let held_a = fs::File::open(pa.join("kept")).unwrap();
    let mut held_b = fs::File::open(pb.join("kept")).unwrap();
    fs::remove_file(pa.join("kept")).unwrap();
    let first = primary_of(&service);
    let mut service: Vec<Option<MetaReplica>> = service.into_iter().map(Some).collect();
    service[first].take().unwrap().stop();
    drop(held_a);
    // Past the grace period, when names without inodes are looked at.
    std::thread::sleep(shoal_fssvc::primary::GRACE + Duration::from_secs(1));
    let mut got = Vec::new();
    held_b.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"kept open");
    drop(held_b);
    assert_eq!(fs::read(pb.join("hello")).unwrap(), b"b");
    assert_eq!(
        fs::read(pb.join("private/deeper/x")).unwrap(),
        b"made before the crash"
    );
    let before = before + 2;
    let until = Instant::now() + Duration::from_secs(20);
    while service
        .iter()
        .flatten()
        .any(|r| r.status()["inodes"].as_u64() != Some(before))
    {
        assert!(
            Instant::now() < until,
            "the unlinked file was not forgotten after its last close: {:?} inodes, not {before}",
            service
                .iter()
                .flatten()
                .map(|r| r.status()["inodes"].as_u64())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    a.stop().unwrap();
    b.stop().unwrap();
    for r in service.into_iter().flatten() {
        r.stop();
    }
    server.stop().unwrap();
}

/// The names in directory `dir`, sorted (without `.` and `..`).
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn ino(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

/// The inode number directory `dir`'s listing gives its `..`.
fn dot_dot(dir: &Path) -> u64 {
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `path` is a valid C string; the stream is closed below and
    // each entry is read before the next `readdir`.
    unsafe {
        let d = libc::opendir(path.as_ptr());
        assert!(!d.is_null(), "opendir {}", dir.display());
        let mut up = None;
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            if std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_bytes() == b".." {
                up = Some((*e).d_ino);
            }
        }
        libc::closedir(d);
        up.expect("a listing has `..`")
    }
}

/// How many requests of these kinds the primary has served.
fn kinds(service: &[MetaReplica], names: &[&str]) -> u64 {
    let status = service[primary_of(service)].status();
    names
        .iter()
        .map(|n| status["requests_by_kind"][n].as_u64().unwrap_or(0))
        .sum()
}

/// The primary's request count once earlier work's messages stopped
/// arriving (a token returned after a recall answered comes a moment
/// later): two reads 300 ms apart agree.
fn settled(service: &[MetaReplica]) -> u64 {
    let mut last = requests(service);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = requests(service);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Requests the primary handled, leases' renewals aside.
fn requests(service: &[MetaReplica]) -> u64 {
    service[primary_of(service)].status()["requests"]
        .as_u64()
        .unwrap()
}

/// What a mount caches follows its tokens: a second look at a file, and
/// an open and read of it, cost the primary nothing; every change made on
/// the other mount (mode, contents, names, a write to a file held open
/// here) is seen at once.
#[test]
fn caches_follow_tokens() {
    let Setup {
        nodes: _nodes,
        server,
        service,
        pa,
        pb,
        a,
        b,
    } = Setup::up("fs-cache-test");

    fs::create_dir(pa.join("d")).unwrap();
    fs::write(pa.join("d/f"), b"one").unwrap();
    // b looks at the file and reads it: its tokens come with the answers.
    assert_eq!(fs::metadata(pb.join("d/f")).unwrap().len(), 3);
    assert_eq!(fs::read(pb.join("d/f")).unwrap(), b"one");
    // A read that reached the mount makes the kernel ask for the access
    // time at the next stat (FUSE does so whatever the mount options).
    assert_eq!(fs::metadata(pb.join("d/f")).unwrap().len(), 3);
    let before = settled(&service);
    for _ in 0..50 {
        assert_eq!(fs::metadata(pb.join("d/f")).unwrap().len(), 3);
    }
    assert_eq!(fs::read(pb.join("d/f")).unwrap(), b"one");
    assert_eq!(
        requests(&service),
        before,
        "a cached stat, open, read and close reached the primary"
    );

    // Every change on a is seen on b at once.
    fs::set_permissions(pa.join("d/f"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(pb.join("d/f")).unwrap().mode() & 0o777, 0o600);
    fs::write(pa.join("d/f"), b"two!").unwrap();
    assert_eq!(fs::read(pb.join("d/f")).unwrap(), b"two!");
    assert_eq!(fs::metadata(pb.join("d/f")).unwrap().len(), 4);
    fs::rename(pa.join("d/f"), pa.join("d/g")).unwrap();
    assert_eq!(
        errno(fs::metadata(pb.join("d/f")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(fs::read(pb.join("d/g")).unwrap(), b"two!");
    fs::hard_link(pa.join("d/g"), pa.join("d/h")).unwrap();
    assert_eq!(fs::metadata(pb.join("d/g")).unwrap().nlink(), 2);
    fs::remove_file(pa.join("d/g")).unwrap();
    assert_eq!(
        errno(fs::metadata(pb.join("d/g")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(fs::metadata(pb.join("d/h")).unwrap().nlink(), 1);

    // A file b holds open, with its pages cached, is written on a: b's
    // next read through the same descriptor sees the new bytes.
    fs::write(pa.join("d/k"), b"aaaa").unwrap();
    let mut held = fs::File::open(pb.join("d/k")).unwrap();
    let mut got = String::new();
    held.read_to_string(&mut got).unwrap();
    assert_eq!(got, "aaaa");
    let mut w = OpenOptions::new().write(true).open(pa.join("d/k")).unwrap();
    w.write_all(b"bb").unwrap();
    held.rewind().unwrap();
    got.clear();
    held.read_to_string(&mut got).unwrap();
    assert_eq!(got, "bbaa");
    w.write_all(b"c").unwrap();
    held.rewind().unwrap();
    got.clear();
    held.read_to_string(&mut got).unwrap();
    assert_eq!(got, "bbca");
    drop(w);
    drop(held);

    // Writes under a's Write token stay in a until written back: they
    // cost the primary nothing; b's open recalls the token, and a writes
    // the file back before answering, so b reads every byte.
    let mut f = fs::File::create(pa.join("d/w")).unwrap();
    let before = settled(&service);
    for i in 0..100u8 {
        f.write_all(&[i; 4096]).unwrap();
    }
    assert_eq!(
        requests(&service),
        before,
        "cached writes reached the primary"
    );
    drop(f);
    let got = fs::read(pb.join("d/w")).unwrap();
    assert_eq!(got.len(), 100 * 4096);
    assert!(
        got.chunks(4096)
            .enumerate()
            .all(|(i, c)| c.iter().all(|b| *b == i as u8))
    );
    // And back: b's Write, then a's read; an fsync commits it first.
    let mut f = OpenOptions::new().write(true).open(pb.join("d/w")).unwrap();
    f.write_all(b"from b").unwrap();
    f.set_len(10).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(pa.join("d/w")).unwrap(), b"from b\0\0\0\0");

    // In a directory this mount made and nobody else looked at (private),
    // names change in the mount alone: a temporary file, made, written,
    // closed and unlinked, costs the primary nothing, and nor does a
    // directory made in it.
    fs::create_dir(pa.join("t")).unwrap();
    let inodes = service[primary_of(&service)].status()["inodes"]
        .as_u64()
        .unwrap();
    let before = settled(&service);
    for i in 0..10 {
        let p = pa.join(format!("t/tmp{i}"));
        fs::write(&p, [i as u8; 4096]).unwrap();
        assert!(fs::metadata(pa.join("t")).unwrap().is_dir());
        assert_eq!(fs::read(&p).unwrap(), [i as u8; 4096]);
        // The kernel keeps a private directory's listing across opens,
        // and drops it at each change of its names.
        assert_eq!(listing(&pa.join("t")), [format!("tmp{i}")]);
        assert_eq!(listing(&pa.join("t")), [format!("tmp{i}")]);
        fs::remove_file(&p).unwrap();
        assert!(fs::metadata(pa.join("t")).unwrap().is_dir());
        assert!(listing(&pa.join("t")).is_empty());
    }
    // A directory moved to another parent lists its new parent as `..`,
    // though its own listing was kept.
    fs::create_dir_all(pa.join("t/from/inner")).unwrap();
    fs::create_dir(pa.join("t/to")).unwrap();
    assert_eq!(dot_dot(&pa.join("t/from/inner")), ino(&pa.join("t/from")));
    fs::rename(pa.join("t/from/inner"), pa.join("t/to/inner")).unwrap();
    assert_eq!(dot_dot(&pa.join("t/to/inner")), ino(&pa.join("t/to")));
    fs::remove_dir(pa.join("t/to/inner")).unwrap();
    fs::remove_dir(pa.join("t/to")).unwrap();
    fs::remove_dir(pa.join("t/from")).unwrap();
    fs::create_dir_all(pa.join("t/sub/deeper")).unwrap();
    fs::write(pa.join("t/sub/deeper/kept"), b"kept").unwrap();
    fs::write(pa.join("t/same"), b"same").unwrap();
    fs::rename(pa.join("t/same"), pa.join("t/moved")).unwrap();
    fs::set_permissions(pa.join("t/moved"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        requests(&service) - before,
        0,
        "a change in a private directory reached the primary"
    );
    let seen_on_a = fs::metadata(pa.join("t")).unwrap();
    // The other mount looks: the changes are pushed first, and it sees
    // the tree as this mount showed it, times and all.
    let seen_on_b = fs::metadata(pb.join("t")).unwrap();
    assert_eq!(
        (seen_on_b.mtime(), seen_on_b.mtime_nsec(), seen_on_b.nlink()),
        (seen_on_a.mtime(), seen_on_a.mtime_nsec(), seen_on_a.nlink())
    );
    assert_eq!(fs::read(pb.join("t/sub/deeper/kept")).unwrap(), b"kept");
    assert_eq!(fs::read(pb.join("t/moved")).unwrap(), b"same");
    assert_eq!(
        fs::metadata(pb.join("t/moved")).unwrap().mode() & 0o777,
        0o640
    );
    let mut names: Vec<_> = fs::read_dir(pb.join("t"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["moved", "sub"]);
    assert_eq!(
        service[primary_of(&service)].status()["inodes"].as_u64(),
        Some(inodes + 4),
        "the temporary files reached the primary"
    );
    // Shared now: the listing this mount kept while the directory was
    // private shows what the other mount changes in it.
    assert_eq!(listing(&pa.join("t")), ["moved", "sub"]);
    fs::write(pb.join("t/from-b"), b"b").unwrap();
    assert_eq!(listing(&pa.join("t")), ["from-b", "moved", "sub"]);
    fs::remove_file(pb.join("t/from-b")).unwrap();
    assert_eq!(listing(&pa.join("t")), ["moved", "sub"]);

    // In a directory another mount made (and so shared): a temporary file
    // costs a lookup, a create that opens it, and an unlink that makes
    // the primary forget it at once, with no recall.
    fs::create_dir(pb.join("s")).unwrap();
    let _ = fs::metadata(pa.join("s")).unwrap();
    let inodes = service[primary_of(&service)].status()["inodes"]
        .as_u64()
        .unwrap();
    let names = ["lookup", "create_open", "unlink", "open", "getattr"];
    settled(&service);
    let before = kinds(&service, &names);
    let returns = kinds(&service, &["return"]);
    for i in 0..10 {
        let p = pa.join(format!("s/tmp{i}"));
        fs::write(&p, [i as u8; 4096]).unwrap();
        assert!(fs::metadata(pa.join("s")).unwrap().is_dir());
        fs::remove_file(&p).unwrap();
        assert!(fs::metadata(pa.join("s")).unwrap().is_dir());
    }
    assert_eq!(
        kinds(&service, &names) - before,
        10 * 3,
        "a temporary file cost other than a lookup, a create and an unlink"
    );
    // The kernel sends a file's release without waiting for it, so an
    // unlink may reach the mount while the release is still on its way:
    // the mount then tells the primary the file may be open, and the
    // primary keeps it until that close, recalling the mount's token.
    // Never more than once a file, and nothing is kept after.
    assert!(kinds(&service, &["return"]) - returns <= 10);
    // Such a file goes once its late close has arrived: wait for the
    // mount and the primary to fall quiet before counting.
    settled(&service);
    assert_eq!(
        service[primary_of(&service)].status()["inodes"].as_u64(),
        Some(inodes),
        "an unlinked temporary file was kept"
    );
    // The same name again and again: the mount knows it removed it, and
    // answers the kernel's lookup itself.
    settled(&service);
    let before = kinds(&service, &names);
    let returns = kinds(&service, &["return"]);
    for i in 0..10 {
        let p = pa.join("s/same");
        fs::write(&p, [i as u8; 4096]).unwrap();
        fs::remove_file(&p).unwrap();
    }
    assert_eq!(
        kinds(&service, &names) - before,
        1 + 10 * 2,
        "a temporary file made again cost other than a create and an unlink"
    );
    assert!(kinds(&service, &["return"]) - returns <= 10);
    // Made on the other mount, the name is there at once.
    fs::write(pb.join("s/same"), b"from b").unwrap();
    assert_eq!(fs::read(pa.join("s/same")).unwrap(), b"from b");

    // An absent name is asked for once: the kernel keeps it as absent
    // until the other mount makes it.
    assert_eq!(
        errno(fs::metadata(pa.join("s/later")).unwrap_err()),
        libc::ENOENT
    );
    let before = settled(&service);
    for _ in 0..10 {
        assert_eq!(
            errno(fs::metadata(pa.join("s/later")).unwrap_err()),
            libc::ENOENT
        );
    }
    assert_eq!(requests(&service), before, "an absent name was asked again");
    fs::write(pb.join("s/later"), b"made").unwrap();
    assert_eq!(fs::read(pa.join("s/later")).unwrap(), b"made");

    a.stop().unwrap();
    b.stop().unwrap();
    for r in service {
        r.stop();
    }
    server.stop().unwrap();
}

/// Extended attributes are the tree's, seen from every mount;
/// `user.shoal.cap` gives a capability by which any program reads the
/// file (its latest bytes, a mount's unwritten changes included) without
/// a mount, and `user.shoal.content` the current version's contents on
/// the file servers.
#[test]
fn extended_attributes_and_capabilities() {
    let Setup {
        nodes,
        server,
        service,
        pa,
        pb,
        a,
        b,
    } = Setup::up("fs-xattr-test");
    let (fa, fb) = (pa.join("f"), pb.join("f"));
    fs::write(&fa, b"one").unwrap();

    // Set on one mount, read and listed on the other; the service's own
    // names are not listed, and cannot be set.
    xattr::set(&fa, "user.color", b"blue").unwrap();
    assert_eq!(
        xattr::get(&fb, "user.color").unwrap(),
        Some(b"blue".to_vec())
    );
    let names: Vec<_> = xattr::list(&fb).unwrap().collect();
    assert_eq!(names, vec![OsStr::new("user.color")]);
    xattr::set(&fb, "trusted.t", b"root's").unwrap();
    assert_eq!(
        xattr::get(&fa, "trusted.t").unwrap(),
        Some(b"root's".to_vec())
    );
    xattr::remove(&fa, "user.color").unwrap();
    assert_eq!(xattr::get(&fb, "user.color").unwrap(), None);
    assert_eq!(
        xattr::remove(&fb, "user.color").map_err(errno),
        Err(libc::ENODATA)
    );
    assert_eq!(
        xattr::set(&fa, "user.shoal.cap", b"x").map_err(errno),
        Err(libc::EPERM)
    );
    assert_eq!(
        xattr::set(&fa, "security.x", b"x").map_err(errno),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(xattr::get(&fa, "security.capability").unwrap(), None);

    // a writes (under its Write token: the bytes stay in a's mount); a
    // program on the third node, with no mount, reads them by capability.
    let text = xattr::get(&fb, "user.shoal.cap").unwrap().unwrap();
    let cap: shoal_cap::Capability = String::from_utf8(text).unwrap().parse().unwrap();
    assert!(
        cap.rights()
            .contains(shoal_cap::Rights::READ | shoal_cap::Rights::WRITE)
    );
    let mut f = OpenOptions::new().write(true).open(&fa).unwrap();
    f.write_all(b"two!").unwrap();
    let mut by_cap = shoal_fssvc::FsClient::for_capability(&nodes.ctx[2], &cap).unwrap();
    assert_eq!(by_cap.cap_read(&cap, 0, 100).unwrap(), b"two!");
    assert_eq!(by_cap.cap_stat(&cap).unwrap().size, 4);
    drop(f);

    // Restricted offline to no right to read, or forged: refused.
    let stat_only = cap.restrict(shoal_cap::Rights::NONE).unwrap();
    assert_eq!(by_cap.cap_stat(&stat_only).unwrap().size, 4);
    let denied = shoal_fs::op::Failure::Fs(shoal_fs::FsError::Access);
    assert_eq!(by_cap.cap_read(&stat_only, 0, 100), Err(denied.clone()));
    let mut forged = cap.to_string().into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
    let forged: shoal_cap::Capability = String::from_utf8(forged).unwrap().parse().unwrap();
    assert_eq!(by_cap.cap_read(&forged, 0, 100), Err(denied));

    // The content version's capabilities: the file servers' copy of what
    // the file holds now.
    let content = xattr::get(&fb, "user.shoal.content").unwrap().unwrap();
    let caps: Vec<shoal_cap::Capability> = String::from_utf8(content)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(caps.len(), 1, "one copy is configured");
    let mut files = shoal_bulletsvc::FileClient::new(&nodes.ctx[2]).unwrap();
    assert_eq!(files.read_all(&caps).unwrap(), b"two!");

    a.stop().unwrap();
    b.stop().unwrap();
    for r in service {
        r.stop();
    }
    server.stop().unwrap();
}

/// `F_GETLK`: the type, start, length and process of a lock in the way of
/// a `typ` lock on `len` bytes from `start`.
fn lock_in_the_way(f: &fs::File, typ: i32, start: i64, len: i64) -> (i32, i64, i64, i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: as in `lock`; fcntl writes the answer into `fl`.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) },
        0
    );
    (i32::from(fl.l_type), fl.l_start, fl.l_len, fl.l_pid)
}

/// `fcntl` locks hold across nodes: a lock taken on one mount keeps the
/// other's out, byte ranges split and share as POSIX says, a waiting lock
/// is given when the holder's process closes the file, and a lock held
/// when the primary stops is reclaimed at the next one.
#[test]
fn fcntl_locks_hold_across_mounts() {
    let Setup {
        nodes: _nodes,
        server,
        service,
        pa,
        pb,
        a,
        b,
    } = Setup::up("fs-lock-test");
    fs::write(pa.join("locked"), [7u8; 100]).unwrap();
    let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
    let (fa, fb) = (rw(&pa.join("locked")), rw(&pb.join("locked")));
    let (w, r, un) = (libc::F_WRLCK, libc::F_RDLCK, libc::F_UNLCK);

    // a's write lock on the whole file keeps b out, and b sees it.
    lock(&fa, w, 0, 0, false).unwrap();
    assert_eq!(lock(&fb, w, 50, 10, false), Err(libc::EAGAIN));
    assert_eq!(lock(&fb, r, 0, 1, false), Err(libc::EAGAIN));
    let (typ, start, len, pid) = lock_in_the_way(&fb, r, 0, 0);
    assert_eq!((typ, start, len), (w, 0, 0));
    assert_eq!(pid as u32, std::process::id());

    // a keeps a read lock on bytes 0..50 and lets the rest go: readers
    // share, and b may write past a's range, not into it.
    lock(&fa, r, 0, 50, false).unwrap();
    lock(&fa, un, 50, 0, false).unwrap();
    lock(&fb, r, 0, 10, false).unwrap();
    lock(&fb, w, 50, 0, false).unwrap();
    assert_eq!(lock(&fb, w, 40, 20, false), Err(libc::EAGAIN));
    assert_eq!(lock_in_the_way(&fa, w, 70, 5), (w, 50, 0, pid));
    assert_eq!(lock_in_the_way(&fa, r, 10, 30).0, un, "nothing in the way");

    // a waits for bytes 60..70, which b holds; it gets them once b's
    // process closes any descriptor of the file (POSIX drops its locks).
    let fa2 = fa.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let got = lock(&fa2, w, 60, 10, true);
        tx.send(got).unwrap();
        fa2
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "given while b holds it"
    );
    drop(fs::File::open(pb.join("locked")).unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(Ok(())));
    let fa2 = waiter.join().unwrap();
    assert_eq!(lock(&fb, w, 65, 1, false), Err(libc::EAGAIN));

    // The primary stops; a reclaims its locks at the next one, so b is
    // still kept out after the grace period.
    let first = primary_of(&service);
    let mut service: Vec<Option<MetaReplica>> = service.into_iter().map(Some).collect();
    service[first].take().unwrap().stop();
    std::thread::sleep(shoal_fssvc::primary::GRACE + Duration::from_secs(1));
    assert_eq!(lock(&fb, w, 65, 1, false), Err(libc::EAGAIN));
    lock(&fb, r, 0, 10, false).unwrap();
    // a's close of its descriptors lets b in.
    drop(fa2);
    lock(&fb, w, 65, 1, false).unwrap();
    drop(fa);
    drop(fb);

    a.stop().unwrap();
    b.stop().unwrap();
    for r in service.into_iter().flatten() {
        r.stop();
    }
    server.stop().unwrap();
}

/// Whether another process (Python's `lockf`, an `fcntl` lock) could take
/// a write lock on all of `path` without waiting.
fn another_process_locks(path: &Path) -> bool {
    let status = std::process::Command::new("python3")
        .args([
            "-c",
            "import fcntl, sys\nf = open(sys.argv[1], 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        ])
        .arg(path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("python3");
    status.success()
}

/// `fcntl` locks on a file in a directory a mount made (private) are the
/// mount's to decide: they keep its node's other processes out without a
/// message to the primary, and go to the primary, still held, when another
/// mount looks at the file, before that look is answered.
#[test]
fn fcntl_locks_on_a_private_file_go_to_the_primary_when_another_mount_looks() {
    let Setup {
        nodes: _nodes,
        server,
        service,
        pa,
        pb,
        a,
        b,
    } = Setup::up("fs-plock-test");
    let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
    let (w, r, un) = (libc::F_WRLCK, libc::F_RDLCK, libc::F_UNLCK);
    fs::create_dir(pa.join("mine")).unwrap();
    let path = pa.join("mine/locked");
    fs::write(&path, [7u8; 100]).unwrap();
    let fa = rw(&path);
    lock(&fa, w, 10, 20, false).unwrap();
    assert_eq!(lock_in_the_way(&fa, r, 0, 0).0, un, "a process's own lock");
    assert!(
        !another_process_locks(&path),
        "a's lock keeps a's node's other processes out"
    );
    lock(&fa, un, 10, 20, false).unwrap();
    assert!(another_process_locks(&path), "released");
    lock(&fa, w, 0, 0, false).unwrap();

    // b opens the file: the privacy ends, and a's lock is the primary's.
    let fb = rw(&pb.join("mine/locked"));
    assert_eq!(lock(&fb, w, 50, 1, false), Err(libc::EAGAIN));
    let (typ, start, len, _) = lock_in_the_way(&fb, r, 0, 0);
    assert_eq!((typ, start, len), (w, 0, 0));
    lock(&fa, un, 0, 0, false).unwrap();
    lock(&fb, w, 50, 1, false).unwrap();
    // b's lock, kept by the primary now, keeps a's node out too.
    assert_eq!(lock(&fa, w, 0, 0, false), Err(libc::EAGAIN));
    drop(fa);
    drop(fb);

    a.stop().unwrap();
    b.stop().unwrap();
    for r in service {
        r.stop();
    }
    server.stop().unwrap();
}

/// The file system's inode count as statfs(2) reports it (`stat -f`).
fn statfs_files(p: &Path) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%c"])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "stat -f: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// An open for writing only skips the kernel's page cache, and every
/// other view of the file stays coherent: a descriptor open for reading
/// and a mapping of the file on the same mount see each write at once,
/// and so does the other mount after the close.  A write by an ordinary
/// user drops the file's set-id bits, through a write-only open (the
/// kernel asks in the write) and through a read-write one (the kernel
/// asks for the mode change first, as the writer).
#[test]
fn writes_through_write_only_opens_stay_coherent() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let setup = Setup::up("fs-direct-test");
    // This kernel drops its pages of a direct write's range (Linux 6.6 and
    // later): writes through write-only opens skip its page cache.
    assert!(setup.a.direct_writes() && setup.b.direct_writes());
    let (pa, pb) = (setup.pa.clone(), setup.pb.clone());

    // A temporary file (made, written through a write-only open, closed
    // and unlinked within the write-back delay) in a directory only this
    // mount looked at costs neither the primary nor the file server a
    // request.  Nothing else is dirty yet, so any request would be its.
    fs::create_dir(pa.join("t")).unwrap();
    let before = (settled(&setup.service), file_server_requests(&setup.server));
    for i in 0..10 {
        let p = pa.join(format!("t/tmp{i}"));
        fs::write(&p, [i as u8; 4096]).unwrap();
        fs::remove_file(&p).unwrap();
    }
    assert_eq!(
        (
            requests(&setup.service),
            file_server_requests(&setup.server)
        ),
        before,
        "temporary files reached the primary or the file server"
    );

    let f = pa.join("f");
    fs::write(&f, vec![b'a'; 16384]).unwrap();
    let reader = fs::File::open(&f).unwrap();
    let mut seen = vec![0u8; 16384];
    reader.read_exact_at(&mut seen, 0).unwrap();
    // SAFETY: a shared read-only mapping of 16 KiB of an open file, read
    // only while both live, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            16384,
            libc::PROT_READ,
            libc::MAP_SHARED,
            reader.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: the mapping is 16 KiB long and lives until the munmap.
    let mapped = |at: usize| unsafe { *(map as *const u8).add(at) };
    assert_eq!(mapped(5000), b'a');
    let writer = OpenOptions::new().write(true).open(&f).unwrap();
    writer.write_all_at(&[b'b'; 4096], 4096).unwrap();
    let mut got = [0u8; 4];
    reader.read_exact_at(&mut got, 5000).unwrap();
    assert_eq!(&got, b"bbbb", "a read through an open descriptor");
    assert_eq!(mapped(5000), b'b', "a read through a mapping");
    drop(writer);
    let mut appender = OpenOptions::new().append(true).open(&f).unwrap();
    appender.write_all(b"tail").unwrap();
    drop(appender);
    reader.read_exact_at(&mut got, 16384).unwrap();
    assert_eq!(&got, b"tail");
    // SAFETY: unmapping what was mapped above.
    assert_eq!(unsafe { libc::munmap(map, 16384) }, 0);
    let there = fs::read(pb.join("f")).unwrap();
    assert_eq!(there.len(), 16388);
    assert_eq!(&there[4096..4100], b"bbbb");
    assert_eq!(&there[16384..], b"tail");

    // An ordinary user's writes drop the set-id bits.
    let parent = pa.parent().unwrap();
    fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&pa, fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |script: &str| {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["--", "sh", "-c", script])
            .output()
            .expect("setpriv (util-linux)");
        assert!(out.status.success(), "{script}: {out:?}");
    };
    let s = pa.join("setid");
    fs::write(&s, b"x").unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    fs::set_permissions(&s, fs::Permissions::from_mode(0o6777)).unwrap();
    as_nobody(&format!("printf y >> {}", s.display()));
    assert_eq!(mode(&s), 0o777, "after a write-only open's write");
    assert_eq!(mode(&pb.join("setid")), 0o777);
    fs::set_permissions(&s, fs::Permissions::from_mode(0o4766)).unwrap();
    as_nobody(&format!("exec 3<>{}; printf z >&3", s.display()));
    assert_eq!(mode(&s), 0o766, "after a read-write open's write");
    assert_eq!(fs::read(&s).unwrap(), b"zy");
    // Root's writes keep them.
    fs::set_permissions(&s, fs::Permissions::from_mode(0o4777)).unwrap();
    OpenOptions::new()
        .append(true)
        .open(&s)
        .unwrap()
        .write_all(b"!")
        .unwrap();
    assert_eq!(mode(&s), 0o4777);
    drop(reader);
    setup.down();
}

/// The requests `server` has received, administration aside.
fn file_server_requests(server: &shoal_bulletsvc::FileServer) -> u64 {
    match server.store().stats() {
        shoal_bullet::Answer::Report { figures, .. } => {
            figures
                .iter()
                .find(|f| f.0 == "requests")
                .expect("a request count")
                .1
        }
        other => panic!("{other:?}"),
    }
}
