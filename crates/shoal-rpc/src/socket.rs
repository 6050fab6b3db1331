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
fn set_force(socket: &Socket, bytes: usize) -> io::Result<()> {
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
pub fn try_recv(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Sets a read timeout, at least one microsecond (zero would mean
/// "forever").
pub fn set_timeout(socket: &UdpSocket, timeout: Duration) -> io::Result<()> {
    socket.set_read_timeout(Some(timeout.max(Duration::from_micros(1))))
}

/// Whether an error is a receive timeout, or a signal that cut a wait
/// short: either way, look at the timers and wait again.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}
