//! What nodes say to each other inside a node session (`shoal-session`
//! seals and opens it): the plaintext's first byte is a [`NodeMsg`] tag,
//! the rest that message's bytes.

/// The kinds of message in a node session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeMsg {
    /// A plaintext packet ([`crate::encode_plain`]): heartbeats.
    Packet = 0,
    /// "My revocation list has this version" (u64, little-endian).
    Revocations = 1,
    /// A signed revocation list, for a peer whose version is older.
    RevocationList = 2,
    /// "Who here serves this?" (a plaintext `Locate`).
    Locate = 3,
    /// The answer to a locate (a plaintext `Here`).
    Here = 4,
    /// "My service map has this version" (u64, little-endian).
    Services = 5,
    /// A signed service map, for a peer whose version is older.
    ServiceMap = 6,
}

impl NodeMsg {
    const ALL: [NodeMsg; 7] = [
        NodeMsg::Packet,
        NodeMsg::Revocations,
        NodeMsg::RevocationList,
        NodeMsg::Locate,
        NodeMsg::Here,
        NodeMsg::Services,
        NodeMsg::ServiceMap,
    ];

    /// A plaintext's tag and the message after it; `None` if it is empty
    /// or its tag is unknown.
    pub fn split(plaintext: &[u8]) -> Option<(NodeMsg, &[u8])> {
        let (&tag, rest) = plaintext.split_first()?;
        let kind = *NodeMsg::ALL.get(usize::from(tag))?;
        Some((kind, rest))
    }

    /// A plaintext of this kind with `body` after the tag.
    pub fn with(self, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(1 + body.len());
        m.push(self as u8);
        m.extend_from_slice(body);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_splits_back_to_its_kind_and_no_other_does() {
        for kind in NodeMsg::ALL {
            assert_eq!(NodeMsg::split(&kind.with(b"xy")), Some((kind, &b"xy"[..])));
        }
        assert_eq!(NodeMsg::split(&[7, 1]), None);
        assert_eq!(NodeMsg::split(&[255]), None);
        assert_eq!(NodeMsg::split(&[]), None);
    }
}
