//! FUSE over io_uring (Linux 6.14+; added to this copy of fuser by shoal).
//!
//! The kernel keeps one request queue per possible CPU and puts each
//! request on the queue of the CPU its caller runs on.  A queue is served
//! by workers pinned to that CPU, each with an io_uring of its own and one
//! registered *entry*: a header buffer and a payload buffer the kernel
//! writes a request into, and reads the reply from.  An entry is free only
//! while its worker waits, so a request never waits behind another one on
//! the same worker.
//!
//! A request arrives as a completion of the entry's command; the worker
//! lays it out as `/dev/fuse` would have delivered it and dispatches it
//! through fuser's usual path.  The payload is received behind room for the
//! two headers, so only the headers are copied.  The reply, sent through
//! [`RingSender`] from whichever thread gives it, is kept until dispatch is
//! over (the request's bytes may still be borrowed until then), then copied
//! into the entry and committed with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`,
//! which also hands the entry back for the next request.
//!
//! A reply that is not given during dispatch (a blocking lock answered
//! later from another thread) is waited for.  The queue must not be left
//! without a worker meanwhile, and the kernel hands a request that found
//! no free entry only to the next commit on its queue (registering an
//! entry does not fetch it): so the worker first makes sure its queue has
//! as many workers that are not waiting as it started with, starting one
//! if not, and then makes a request of its own on its CPU (a `statfs`),
//! whose commit fetches whatever was left waiting.
//!
//! Forgets, interrupts and notifications keep using `/dev/fuse`.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::thread::JoinHandle;
use std::thread::Thread;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::passthrough::BackingId;
use crate::request::RequestWithSender;
use crate::request::Sink;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, then
/// `struct fuse_uring_ent_in_out` (flags, commit_id, payload_sz, ...).
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER: usize = 288;
/// Room in front of the payload for the two headers.
const ROOM: usize = IN_HEADER + OP_IN;

#[repr(C, align(8))]
struct Header([u8; HEADER]);

/// Whether this kernel lets this process use io_uring with the 128-byte
/// submissions FUSE's commands need.
pub(crate) fn available() -> bool {
    match ring() {
        Ok(_) => true,
        Err(e) => {
            warn!("FUSE over io_uring is not available here: {e}");
            false
        }
    }
}

fn ring() -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .setup_defer_taskrun()
        .build(4)
}

/// The queues' count: one per possible CPU, as the kernel has them.
fn queues() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            let last = s.trim().rsplit(['-', ',']).next()?;
            last.parse::<usize>().ok().map(|n| n + 1)
        })
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The reply half of an entry, shared with whoever replies.
#[derive(Debug)]
struct Slot {
    /// The reply as `/dev/fuse` would take it: out header, then arguments.
    reply: Mutex<Vec<u8>>,
    replied: AtomicBool,
    worker: Thread,
    /// For backing files (passthrough), which still go through the device.
    device: ChannelSender,
    /// The payload buffer's size: a longer reply cannot be committed.
    payload: usize,
}

/// Sends a reply into a ring entry.
#[derive(Clone, Debug)]
pub(crate) struct RingSender(Arc<Slot>);

impl RingSender {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let slot = &*self.0;
        let total: usize = data.iter().map(|d| d.len()).sum();
        let mut reply = slot.reply.lock();
        reply.clear();
        for d in data {
            reply.extend_from_slice(d);
        }
        let result = if total < OUT_HEADER || total - OUT_HEADER > slot.payload {
            // Answer the request with EIO rather than leave it unanswered.
            let unique = reply.get(8..16).map_or([0; 8], |u| u.try_into().unwrap());
            reply.clear();
            reply.extend_from_slice(&eio(unique));
            Err(io::Error::other(format!(
                "a reply of {total} bytes does not fit a ring entry"
            )))
        } else {
            Ok(())
        };
        drop(reply);
        slot.replied.store(true, Ordering::Release);
        slot.worker.unpark();
        result
    }

    pub(crate) fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<BackingId> {
        self.0.device.open_backing(fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { self.0.device.wrap_backing(id) }
    }
}

/// What every worker of a session shares.
pub(crate) struct Pool<FS: Filesystem> {
    filesystem: Arc<FilesystemHolder<FS>>,
    ch: Channel,
    allowed: SessionACL,
    session_owner: nix::unistd::Uid,
    /// Where the file system is mounted, for the request a worker makes to
    /// drain its queue (none: from a descriptor, not drained).
    mountpoint: Option<PathBuf>,
    /// The largest payload the kernel may put in an entry.
    payload: usize,
    /// Workers each queue keeps that are not waiting for a reply.
    per_queue: usize,
    queues: Vec<Queue>,
    started: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<io::Result<()>>>>,
}

/// A queue's workers: how many, and how many wait for a reply given later.
#[derive(Default)]
struct Queue {
    workers: AtomicUsize,
    waiting: AtomicUsize,
}

impl<FS: Filesystem> Pool<FS> {
    /// Starts `per_queue` workers on every queue.
    pub(crate) fn start(
        filesystem: Arc<FilesystemHolder<FS>>,
        ch: Channel,
        allowed: SessionACL,
        session_owner: nix::unistd::Uid,
        mountpoint: Option<PathBuf>,
        payload: usize,
        per_queue: usize,
    ) -> io::Result<Arc<Self>> {
        let queues = queues();
        let per_queue = per_queue.max(1);
        let pool = Arc::new(Pool {
            filesystem,
            ch,
            allowed,
            session_owner,
            mountpoint,
            payload,
            per_queue,
            queues: (0..queues).map(|_| Queue::default()).collect(),
            started: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        });
        for qid in 0..queues {
            for _ in 0..per_queue {
                pool.spawn(qid as u16, None)?;
            }
        }
        debug!("FUSE over io_uring: {queues} queues, {per_queue} workers each");
        Ok(pool)
    }

    /// Starts a worker on queue `qid`; `registered` hears once its entry is
    /// free for requests (or it failed).
    fn spawn(self: &Arc<Self>, qid: u16, registered: Option<mpsc::Sender<()>>) -> io::Result<()> {
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        self.queues[usize::from(qid)]
            .workers
            .fetch_add(1, Ordering::AcqRel);
        let pool = self.clone();
        let handle = thread::Builder::new()
            .name(format!("fuser-ring-{qid}.{n}"))
            .spawn(move || {
                let result = pool.work(qid, registered);
                pool.queues[usize::from(qid)]
                    .workers
                    .fetch_sub(1, Ordering::AcqRel);
                if let Err(e) = &result {
                    error!("FUSE ring worker on queue {qid}: {e}");
                }
                result
            })?;
        self.threads.lock().push(handle);
        Ok(())
    }

    /// Waits for every worker, including those started meanwhile.
    pub(crate) fn join(&self) -> io::Result<()> {
        let mut result = Ok(());
        loop {
            let Some(handle) = self.threads.lock().pop() else {
                return result;
            };
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = result.and(Err(e)),
                Err(_) => result = result.and(Err(io::Error::other("a ring worker panicked"))),
            }
        }
    }

    /// Waits for the reply to the request in hand, given later from another
    /// thread, keeping the queue served meanwhile (see the module's notes).
    fn wait_for_reply(self: &Arc<Self>, qid: u16, slot: &Slot) -> io::Result<()> {
        let queue = &self.queues[usize::from(qid)];
        let waiting = queue.waiting.fetch_add(1, Ordering::AcqRel) + 1;
        if queue
            .workers
            .load(Ordering::Acquire)
            .saturating_sub(waiting)
            < self.per_queue
        {
            let (tx, rx) = mpsc::channel();
            self.spawn(qid, Some(tx))?;
            let _ = rx.recv();
        }
        if let Some(at) = &self.mountpoint {
            // A request from this CPU; its commit fetches any request left
            // waiting for a free entry.
            let _ = nix::sys::statfs::statfs(at.as_path());
        }
        while !slot.replied.load(Ordering::Acquire) {
            thread::park();
        }
        queue.waiting.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    fn work(self: &Arc<Self>, qid: u16, registered: Option<mpsc::Sender<()>>) -> io::Result<()> {
        pin(qid as usize);
        let se = SessionEventLoop {
            thread_name: thread::current().name().unwrap_or("fuser-ring").to_string(),
            ch: self.ch.clone(),
            filesystem: self.filesystem.clone(),
            allowed: self.allowed,
            session_owner: self.session_owner,
        };
        let mut ring = ring()?;
        let device = self.ch.as_fd().as_raw_fd();
        let mut header = Box::new(Header([0; HEADER]));
        // u64s, for the alignment fuser's parser expects of a request.
        let mut data = vec![0u64; (ROOM + self.payload).div_ceil(8)];
        let iov = [
            libc::iovec {
                iov_base: header.0.as_mut_ptr().cast(),
                iov_len: HEADER,
            },
            libc::iovec {
                // SAFETY: ROOM is within `data`.
                iov_base: unsafe { data.as_mut_ptr().cast::<u8>().add(ROOM) }.cast(),
                iov_len: self.payload,
            },
        ];
        let slot = Arc::new(Slot {
            reply: Mutex::new(Vec::new()),
            replied: AtomicBool::new(false),
            worker: thread::current(),
            device: self.ch.sender(),
            payload: self.payload,
        });
        let sender = RingSender(slot.clone());
        // SAFETY: the iovecs and the buffers they point to live as long as
        // this function, which ends only once the kernel stopped using them
        // (the entry's command failed or was torn down).
        let done = unsafe { queue(&mut ring, device, qid, CMD_REGISTER, 0, Some(&iov)) }
            .and_then(|()| ring.submit().map(drop));
        if let Some(tx) = registered {
            let _ = tx.send(());
        }
        done?;
        loop {
            // Submits the last request's commit, if any, and waits for the
            // next request: one system call per request.
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            let Some(cqe) = ring.completion().next() else {
                continue;
            };
            let res = cqe.result();
            if res < 0 {
                return match -res {
                    // The connection ended (unmount, abort).
                    libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED => Ok(()),
                    e => Err(io::Error::from_raw_os_error(e)),
                };
            }
            // SAFETY: the kernel is done writing the entry until the commit
            // below; nothing else refers to these buffers.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), data.len() * 8)
            };
            let h = &header.0;
            let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
            let commit_id =
                u64::from_ne_bytes(h[ENT_IN_OUT + 8..ENT_IN_OUT + 16].try_into().unwrap());
            let payload_sz =
                u32::from_ne_bytes(h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].try_into().unwrap())
                    as usize;
            let op_in = len.checked_sub(IN_HEADER + payload_sz);
            slot.replied.store(false, Ordering::Relaxed);
            match op_in {
                Some(op_in) if op_in <= OP_IN && payload_sz <= self.payload => {
                    let start = ROOM - IN_HEADER - op_in;
                    bytes[start..start + IN_HEADER].copy_from_slice(&h[..IN_HEADER]);
                    bytes[start + IN_HEADER..ROOM].copy_from_slice(&h[OP_IN..OP_IN + op_in]);
                    let request = &bytes[start..ROOM + payload_sz];
                    match RequestWithSender::new(Sink::Ring(sender.clone()), request) {
                        Some(req) => req.dispatch(&se),
                        None => error_reply(&sender, &h[8..16]),
                    }
                }
                _ => {
                    error!("a ring request of {len} bytes with {payload_sz} of payload");
                    error_reply(&sender, &h[8..16]);
                }
            }
            if !slot.replied.load(Ordering::Acquire) {
                self.wait_for_reply(qid, &slot)?;
            }
            let reply = slot.reply.lock();
            let header_out = &mut header.0;
            header_out[..OUT_HEADER].copy_from_slice(&reply[..OUT_HEADER]);
            let args = &reply[OUT_HEADER..];
            bytes[ROOM..ROOM + args.len()].copy_from_slice(args);
            header_out[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
                .copy_from_slice(&(args.len() as u32).to_ne_bytes());
            drop(reply);
            // SAFETY: as for the registration.  Submitted at the top of
            // the loop.
            unsafe {
                queue(
                    &mut ring,
                    device,
                    qid,
                    CMD_COMMIT_AND_FETCH,
                    commit_id,
                    None,
                )?
            };
        }
    }
}

/// Answers the request whose unique id is `unique` (8 bytes) with EIO.
fn error_reply(sender: &RingSender, unique: &[u8]) {
    let unique = unique.try_into().expect("8 bytes");
    let _ = sender.send(&[IoSlice::new(&eio(unique))]);
}

/// The `fuse_out_header` of an EIO answer to request `unique`.
fn eio(unique: [u8; 8]) -> [u8; OUT_HEADER] {
    let mut h = [0; OUT_HEADER];
    h[..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    h[8..].copy_from_slice(&unique);
    h
}

/// Queues one FUSE command, to be submitted by the next `submit`:
/// `struct fuse_uring_cmd_req` in the SQE's command area, and for a
/// registration the entry's two iovecs.
///
/// # Safety
/// The iovecs, and the buffers they describe, must outlive the command.
unsafe fn queue(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    device: i32,
    qid: u16,
    cmd_op: u32,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> io::Result<()> {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(device), cmd_op).cmd(cmd);
    if let Some(iov) = iov {
        op = op.addr(Some(iov.as_ptr() as u64));
    }
    let mut entry = op.build();
    if iov.is_some() {
        set_len(&mut entry, 2);
    }
    // SAFETY: the caller keeps what the entry points to alive.
    unsafe { ring.submission().push(&entry) }
        .map_err(|_| io::Error::other("the ring's submission queue is full"))?;
    Ok(())
}

/// Sets the SQE's `len` (the iovec count), which the io-uring crate's
/// `UringCmd80` does not expose: offset 24 of `struct io_uring_sqe`.
fn set_len(entry: &mut squeue::Entry128, len: u32) {
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is a repr(C) wrapper of the 128-byte SQE, plain
    // bytes with no invalid values; `len` is a u32 at offset 24.
    unsafe {
        let bytes = (entry as *mut squeue::Entry128).cast::<u8>();
        bytes.add(24).cast::<u32>().write_unaligned(len);
    }
}

/// Pins the calling thread to `cpu` (best effort: a cpuset may forbid it).
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < 8 * size_of::<libc::cpu_set_t>() {
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                debug!(
                    "cannot pin a ring worker to CPU {cpu}: {}",
                    io::Error::last_os_error()
                );
            }
        }
    }
}
