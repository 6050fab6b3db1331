//! Endpoint channels (`docs/security.md`, "Endpoint channels"): one client
//! endpoint and one server endpoint, sealing to each other with a key
//! their daemons derived from the node session between their two nodes.
//!
//! - [`Root`]: what a node session (or a node's session with itself) gives
//!   endpoint channels: the index a client names, the endpoint root, the
//!   AEAD, and when it stops being usable.
//! - [`Channel`]: one end of one channel: its key, its counter for what it
//!   sends, and a [`ReplayWindow`] for what it opens.  A client's channel
//!   seals class 5 and opens class 6; a server's the other way round, so
//!   no datagram can be reflected back at its sender.
//!
//! The keys come from [`crate::kdf`]: `T(i)` for server endpoint `i`
//! through one session, and `K` for one (node, uid, client) below it.

use shoal_time::Time;

use crate::SessionError;
use crate::aead::{Algorithm, Key};
use crate::datagram::{Header, open_peeked, seal};
use crate::window::ReplayWindow;

/// What endpoint channel keys through one node session derive from.
#[derive(Clone)]
pub struct Root {
    /// The index the server's node knows the session by: what a client
    /// names in its datagrams' headers.
    pub index: u32,
    /// The session's endpoint root.
    pub secret: [u8; 32],
    /// The AEAD the two nodes agreed on.
    pub algorithm: Algorithm,
    /// When the session stops opening anything (the caller's clock).
    pub expires: Time,
}

impl std::fmt::Debug for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Root")
            .field("index", &self.index)
            .field("algorithm", &self.algorithm)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// One end of an endpoint channel.
pub struct Channel {
    key: Key,
    /// Whether this end is the client's.
    client: bool,
    /// The next counter to seal with.
    counter: u64,
    window: ReplayWindow,
}

impl Channel {
    /// The client's end of a channel with key `key`.
    pub fn client(algorithm: Algorithm, key: &[u8; 32]) -> Self {
        Self::new(algorithm, key, true)
    }

    /// The client's end of a channel with key `key` whose first datagram
    /// takes counter `first`: an end made again for a key used before
    /// starts above every counter the earlier one took, so no nonce is
    /// used twice under the key.
    pub fn client_from(algorithm: Algorithm, key: &[u8; 32], first: u64) -> Self {
        Self {
            counter: first,
            ..Self::new(algorithm, key, true)
        }
    }

    /// The server's end of a channel with key `key`.
    pub fn server(algorithm: Algorithm, key: &[u8; 32]) -> Self {
        Self::new(algorithm, key, false)
    }

    fn new(algorithm: Algorithm, key: &[u8; 32], client: bool) -> Self {
        Self {
            key: Key::new(algorithm, key),
            client,
            counter: 0,
            window: ReplayWindow::new(),
        }
    }

    /// Seals the plaintext made of `pieces` into `out` (cleared first):
    /// header, ciphertext, tag.  `receiver` is the session's index on the
    /// server's node, `uid` the sender's, `sender` the client id (from a
    /// client) or the server instance (from a server).
    pub fn seal(
        &mut self,
        receiver: u32,
        uid: u32,
        sender: u64,
        pieces: &[&[u8]],
        out: &mut Vec<u8>,
    ) {
        let header = Header::Endpoint {
            to_client: !self.client,
            receiver,
            uid,
            sender,
            counter: self.counter,
        };
        self.counter += 1;
        seal(&self.key, &header, pieces, out);
    }

    /// Opens a datagram the other end sealed, in place: its header and
    /// plaintext.  A datagram of the wrong direction, one that does not
    /// open, and one whose counter was seen (or is too old) are refused;
    /// the window moves only for one that opened.
    pub fn open<'a>(
        &mut self,
        datagram: &'a mut [u8],
    ) -> Result<(Header, &'a mut [u8]), SessionError> {
        let header = Header::peek(datagram)?;
        self.open_peeked(header, datagram)
    }

    /// [`Channel::open`] of a datagram whose header the caller read
    /// already (with [`Header::peek`]), to choose the channel.
    pub fn open_peeked<'a>(
        &mut self,
        header: Header,
        datagram: &'a mut [u8],
    ) -> Result<(Header, &'a mut [u8]), SessionError> {
        match header {
            Header::Endpoint { to_client, .. } if to_client == self.client => {}
            _ => return Err(SessionError::Malformed("datagram of the wrong direction")),
        }
        if !self.window.check(header.counter()) {
            return Err(SessionError::Replayed);
        }
        let plain = open_peeked(&self.key, &header, datagram)?;
        self.window.accept(header.counter());
        Ok((header, plain))
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("client", &self.client)
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kdf::{channel_key, server_secret};

    fn pair() -> (Channel, Channel) {
        let t = server_secret(&[7; 32], 2, &[3; 16], 99);
        let k = channel_key(&t, 1, 1000, 5);
        (
            Channel::client(Algorithm::ChaCha20Poly1305, &k),
            Channel::server(Algorithm::ChaCha20Poly1305, &k),
        )
    }

    #[test]
    fn a_request_and_its_reply_open_once_each_and_never_reflected() {
        let (mut c, mut s) = pair();
        let mut d = Vec::new();
        c.seal(42, 1000, 5, &[b"ask", b"ing"], &mut d);
        let mut copy = d.clone();
        let (h, plain) = s.open(&mut d).unwrap();
        assert_eq!(plain, b"asking");
        assert_eq!(
            h,
            Header::Endpoint {
                to_client: false,
                receiver: 42,
                uid: 1000,
                sender: 5,
                counter: 0
            }
        );
        // The same datagram again is a replay.
        assert_eq!(
            s.open(&mut copy.clone()).err(),
            Some(SessionError::Replayed)
        );
        // Sent back at the client, it is of the wrong direction.
        assert!(c.open(&mut copy).is_err());
        let mut r = Vec::new();
        s.seal(42, 0, 99, &[b"ok"], &mut r);
        assert_eq!(c.open(&mut r).unwrap().1, b"ok");
    }

    #[test]
    fn a_changed_header_or_body_does_not_open_and_moves_no_window() {
        let (mut c, mut s) = pair();
        let mut d = Vec::new();
        c.seal(42, 1000, 5, &[b"x"], &mut d);
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 1;
            assert!(s.open(&mut bad).is_err(), "byte {i}");
        }
        assert!(s.open(&mut d).is_ok());
        // Another uid's key opens nothing of this channel.
        let t = server_secret(&[7; 32], 2, &[3; 16], 99);
        let mut other = Channel::server(Algorithm::ChaCha20Poly1305, &channel_key(&t, 1, 0, 5));
        let mut d = Vec::new();
        c.seal(42, 0, 5, &[b"y"], &mut d);
        assert_eq!(other.open(&mut d).err(), Some(SessionError::BadTag));
    }
}
