//! Messages with file descriptors attached, over a Unix stream socket:
//! a little-endian `u32` length, then the bytes; the descriptors travel
//! with the first bytes (`SCM_RIGHTS`).  The daemon hands its spawner
//! each program so, and `shoal make`'s shell hands `shoal make` each
//! recipe line with its standard streams.

use std::os::fd::RawFd;

/// Sends `body` as one message (its length first) with `fds` attached to
/// its first byte.
pub fn send_with_fds(sock: RawFd, body: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let len = (body.len() as u32).to_le_bytes();
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = [
        libc::iovec {
            iov_base: len.as_ptr() as *mut libc::c_void,
            iov_len: len.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    // SAFETY: a msghdr over live buffers; CMSG_* stay within `control`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The fds went with the first byte; the rest is plain bytes.
        let mut sent = n as usize;
        while sent < len.len() + body.len() {
            let rest = if sent < len.len() {
                &len[sent..]
            } else {
                &body[sent - len.len()..]
            };
            let n = libc::send(sock, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL);
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            sent += n as usize;
        }
    }
    Ok(())
}

/// Receives one message: its bytes (after the length) and the fds that
/// came with it (close-on-exec).  `None` when the sender is gone, or
/// announced more than `max` bytes.
pub fn receive(sock: RawFd, max: usize) -> Option<(Vec<u8>, Vec<RawFd>)> {
    let mut len = [0u8; 4];
    // Aligned as a `cmsghdr` must be.
    let mut control = [0u64; 32];
    let mut iov = libc::iovec {
        iov_base: len.as_mut_ptr().cast(),
        iov_len: 4,
    };
    let mut fds = Vec::new();
    // SAFETY: a msghdr over live buffers; CMSG_* stay within `control`.
    let got = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL);
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                fds.extend((0..count).map(|i| data.add(i).read_unaligned()));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        // Fds that did not fit were closed by the kernel: the message is
        // not whole.
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            -1
        } else {
            n
        }
    };
    let len = u32::from_le_bytes(len) as usize;
    if got != 4 || len > max {
        for fd in fds {
            // SAFETY: closing the fds that came with a message refused.
            unsafe { libc::close(fd) };
        }
        return None;
    }
    let mut body = vec![0u8; len];
    let mut at = 0;
    while at < body.len() {
        // SAFETY: reading into the rest of `body`.
        let n = unsafe { libc::read(sock, body[at..].as_mut_ptr().cast(), body.len() - at) };
        if n <= 0 {
            for fd in fds {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
            }
            return None;
        }
        at += n as usize;
    }
    Some((body, fds))
}

/// `body` with its length first: a message without descriptors, to write
/// as it is.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + body.len());
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// Receives one message that brings no descriptors: its bytes.  `None`
/// as for [`receive`], or if descriptors came with it (they are closed).
pub fn receive_plain(sock: RawFd, max: usize) -> Option<Vec<u8>> {
    let (body, fds) = receive(sock, max)?;
    let plain = fds.is_empty();
    for fd in fds {
        // SAFETY: closing the fds that came with a message refused.
        unsafe { libc::close(fd) };
    }
    plain.then_some(body)
}
