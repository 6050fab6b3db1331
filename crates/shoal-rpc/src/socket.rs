//! UDP sockets as shoal wants them: large buffers (a window of fragments
//! must fit), broadcast allowed, and a receive that can poll without
//! blocking for spin-then-block waiting.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// Socket buffer size asked for; the kernel may clamp it (root can
/// exceed `net.core.rmem_max`).
const BUFFER_BYTES: usize = 8 << 20;

/// A UDP socket bound to `addr`, with big buffers.
pub fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_broadcast(true)?;
    for force in [true, false] {
        let r = if force {
            set_force(&socket, BUFFER_BYTES)
        } else {
            socket
                .set_recv_buffer_size(BUFFER_BYTES)
                .and_then(|()| socket.set_send_buffer_size(BUFFER_BYTES))
        };
        if r.is_ok() {
            break;
        }
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// SO_RCVBUFFORCE/SO_SNDBUFFORCE: allowed to root, beyond the sysctl caps.
pub fn set_force(socket: &Socket, bytes: usize) -> io::Result<()> {
    let value = bytes as libc::c_int;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
        // SAFETY: a valid fd and a pointer to a c_int of the right size.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives without blocking: `Ok(None)` if nothing is queued.
pub fn try_recv_from(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<Option<(usize, SocketAddr)>> {
    let got = socket2::SockRef::from(socket).recv_from_with_flags(uninit(buf), libc::MSG_DONTWAIT);
    Ok(nothing_queued(got)?.and_then(|(n, addr)| addr.as_socket().map(|a| (n, a))))
}

/// Receives on a connected socket without blocking: `Ok(None)` if nothing
/// is queued.  The kernel delivers a connected socket only its peer's
/// datagrams, so the sender's address is not asked for.
pub fn try_recv(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<usize>> {
    nothing_queued(socket2::SockRef::from(socket).recv_with_flags(uninit(buf), libc::MSG_DONTWAIT))
}

/// A receive buffer as the socket calls take it.
fn uninit(buf: &mut [u8]) -> &mut [std::mem::MaybeUninit<u8>] {
    // SAFETY: initialized bytes are valid MaybeUninit<u8>; the callee only
    // writes to them.
    unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) }
}

/// A receive that did not block: `Ok(None)` when nothing was queued (or a
/// signal came first).
fn nothing_queued<T>(got: io::Result<T>) -> io::Result<Option<T>> {
    match got {
        Ok(got) => Ok(Some(got)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Fragments a peer can have in flight towards `socket` without
/// overflowing its receive buffer (assuming peers are set up alike): half
/// the buffer, between 4 and 64 fragments.
pub fn window_for(socket: &UdpSocket, frag_bytes: usize) -> u32 {
    let bytes = Socket::from(socket.try_clone().expect("dup a socket"))
        .recv_buffer_size()
        .unwrap_or(BUFFER_BYTES);
    ((bytes / 2) / (frag_bytes + 128)).clamp(4, 64) as u32
}

/// A socket's read timeout, set only when it changes.  Timeouts are
/// rounded up to whole milliseconds: the cores' timers are tens of
/// milliseconds, and a wait that ends up to a millisecond late costs
/// nothing, while a `setsockopt` on every wait costs a system call.
#[derive(Debug, Default)]
pub struct Timeout(Option<Duration>);

impl Timeout {
    /// Makes `socket`'s next receive wait at most about `left`.
    pub fn set(&mut self, socket: &UdpSocket, left: Duration) -> io::Result<()> {
        let ms = left.as_micros().div_ceil(1000).max(1) as u64;
        let rounded = Duration::from_millis(ms);
        if self.0 != Some(rounded) {
            socket.set_read_timeout(Some(rounded))?;
            self.0 = Some(rounded);
        }
        Ok(())
    }
}

/// Polls `socket` for up to `spin` without sleeping, yielding the CPU
/// between polls so that a peer on the same core can run and answer.
pub fn spin_recv(
    socket: &UdpSocket,
    buf: &mut [u8],
    spin: Duration,
) -> io::Result<Option<(usize, SocketAddr)>> {
    spin_with(spin, || try_recv_from(socket, buf))
}

/// Calls `poll` (a receive that does not block) until it gets something
/// or `spin` has passed, yielding the CPU in between.
pub fn spin_with<T>(
    spin: Duration,
    mut poll: impl FnMut() -> io::Result<Option<T>>,
) -> io::Result<Option<T>> {
    if spin.is_zero() {
        return Ok(None);
    }
    // The clock is read only once a poll came back empty: most spins end
    // at the first.
    let mut start = None;
    loop {
        // Yield first: a spinner waits for a datagram that its peer has
        // yet to send, and a peer sharing this CPU sends it only once it
        // runs; a peer on another CPU loses nothing by it.
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
        if let Some(got) = poll()? {
            return Ok(Some(got));
        }
        let now = std::time::Instant::now();
        if now.saturating_duration_since(*start.get_or_insert(now)) >= spin {
            return Ok(None);
        }
    }
}

/// Whether an error is a receive timeout, or a signal that cut a wait
/// short: either way, look at the timers and wait again.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receives_say_who_sent_without_blocking() {
        for any in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(a) = bind(any.parse().unwrap()) else {
                continue; // no IPv6 here
            };
            let b = bind(any.parse().unwrap()).unwrap();
            let mut buf = [0u8; 64];
            assert_eq!(try_recv_from(&a, &mut buf).unwrap(), None);
            b.send_to(b"hello", a.local_addr().unwrap()).unwrap();
            let got = spin_with(Duration::from_secs(1), || try_recv_from(&a, &mut buf)).unwrap();
            assert_eq!(got, Some((5, b.local_addr().unwrap())), "{any}");
            assert_eq!(&buf[..5], b"hello");
            // A connected socket's receive needs no address.
            b.connect(a.local_addr().unwrap()).unwrap();
            a.send_to(b"back", b.local_addr().unwrap()).unwrap();
            let got = spin_with(Duration::from_secs(1), || try_recv(&b, &mut buf)).unwrap();
            assert_eq!(got, Some(4));
            assert_eq!(try_recv(&b, &mut buf).unwrap(), None);
        }
    }
}
