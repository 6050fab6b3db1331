//! How the kernel hands a mount its requests: FUSE over io_uring where the
//! kernel has it (a queue per CPU, served on that CPU), `/dev/fuse`
//! otherwise or when asked.
//!
//! Run as root, with `/dev/fuse`: the mount turns the kernel's
//! `enable_uring` switch on when the kernel has one.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use shoal_fuse::{Transport, Tuning};

mod common;

use common::{Setup, lock};

/// Whether this kernel has FUSE over io_uring at all.
fn kernel_has_uring() -> bool {
    Path::new("/sys/module/fuse/parameters/enable_uring").exists()
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// Where the kernel has FUSE over io_uring, mounts use it; locks that
/// wait (answered later, from another thread) never leave a CPU's queue
/// without a worker: more waiters than workers sit on one CPU while that
/// CPU's programs go on using the tree, and every waiter gets the lock
/// once its holder on the other node lets go.
#[test]
fn mounts_are_served_on_the_callers_cpu_and_waiting_locks_hold_no_queue_up() {
    let s = Setup::up("fs-transport-test");
    let (pa, pb) = (s.pa.clone(), s.pb.clone());
    let expected = if kernel_has_uring() {
        Transport::Uring
    } else {
        Transport::Device
    };
    assert_eq!(s.a.transport(), expected);
    assert_eq!(s.b.transport(), expected);

    fs::write(pa.join("locked"), [1u8; 10]).unwrap();
    let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
    let held = rw(&pb.join("locked"));
    lock(&held, libc::F_WRLCK, 0, 0, false).unwrap();

    // Three times as many waiters as a queue has workers, all on CPU 0.
    const WAITERS: usize = 3 * shoal_fuse::URING_THREADS;
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (tx, path) = (tx.clone(), pa.join("locked"));
            std::thread::spawn(move || {
                pin(0);
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .unwrap();
                let got = lock(&f, libc::F_WRLCK, 0, 0, true);
                tx.send((i, got)).unwrap();
            })
        })
        .collect();
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "a lock given while the other node holds it"
    );

    // CPU 0's queue is still served: a program there makes, writes, reads
    // and removes files while every waiter waits.
    let (done_tx, done_rx) = mpsc::channel();
    let work = pa.clone();
    std::thread::spawn(move || {
        pin(0);
        for i in 0..50 {
            let p = work.join(format!("busy{i}"));
            fs::write(&p, format!("{i}")).unwrap();
            assert_eq!(fs::read_to_string(&p).unwrap(), format!("{i}"));
            fs::remove_file(&p).unwrap();
        }
        done_tx.send(()).unwrap();
    });
    assert_eq!(
        done_rx.recv_timeout(Duration::from_secs(30)),
        Ok(()),
        "file operations on CPU 0 stalled behind waiting locks"
    );
    assert!(rx.try_recv().is_err(), "a lock given while still held");

    // The holder lets go: every waiter gets the lock (they are one
    // process, so one owner: POSIX gives it to all of them).
    drop(held);
    let mut got: Vec<usize> = (0..WAITERS)
        .map(|_| {
            let (i, r) = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("every waiter gets the lock");
            assert_eq!(r, Ok(()));
            i
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..WAITERS).collect::<Vec<_>>());
    for w in waiters {
        w.join().unwrap();
    }

    s.down();
}

/// A mount asked not to use io_uring is served through `/dev/fuse`, and
/// works as well.
#[test]
fn a_mount_can_be_served_through_dev_fuse() {
    let tuning = Tuning {
        uring: false,
        ..Tuning::default()
    };
    let s = Setup::up_with("fs-device-test", tuning);
    let (pa, pb) = (&s.pa, &s.pb);
    assert_eq!(s.a.transport(), Transport::Device);
    assert_eq!(s.b.transport(), Transport::Device);
    fs::create_dir(pa.join("d")).unwrap();
    fs::write(pa.join("d/f"), b"through /dev/fuse").unwrap();
    assert_eq!(fs::read(pb.join("d/f")).unwrap(), b"through /dev/fuse");
    fs::remove_file(pb.join("d/f")).unwrap();
    assert!(!pa.join("d/f").exists());

    s.down();
}
