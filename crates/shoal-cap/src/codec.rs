//! The little-endian byte codec every shoal format is read with: packets
//! (`shoal-wire`), sealed headers, certificates and signed records
//! (`shoal-session`), the exec service's and the group keys' messages,
//! and the services' requests, entries, logs and snapshots, which carry
//! capabilities.  The reader never panics and never allocates more than
//! the input could hold: every length is checked against the bytes left
//! before anything is reserved.  A format with an error type of its own
//! converts [`DecodeError`] into it ([`DecodeError::is_truncated`],
//! [`DecodeError::is_trailing`]).

#![allow(missing_docs)] // each method is the field it names

use crate::Capability;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what}: {why}")]
pub struct DecodeError {
    /// What was being decoded.
    pub what: &'static str,
    /// What was wrong.
    pub why: &'static str,
}

pub fn bad(what: &'static str, why: &'static str) -> DecodeError {
    DecodeError { what, why }
}

/// Why, when the bytes ran out.
const TRUNCATED: &str = "truncated";
/// Why, when bytes were left over.
const TRAILING: &str = "trailing bytes";

impl DecodeError {
    /// The bytes ran out before the value did.
    pub fn is_truncated(&self) -> bool {
        self.why == TRUNCATED
    }
    /// Bytes were left after the value.
    pub fn is_trailing(&self) -> bool {
        self.why == TRAILING
    }
}

/// Appends fields to a buffer.
pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn raw(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    /// A byte string of at most 65,535 bytes: u16 length, then the bytes.
    pub fn str16(&mut self, b: &[u8]) {
        debug_assert!(b.len() <= u16::MAX as usize);
        self.u16(b.len() as u16);
        self.raw(b);
    }
    /// A text (as [`Writer::str16`]) cut to at most `max` bytes at a
    /// character boundary, as [`Reader::text16`] cuts what it decodes.
    pub fn text16(&mut self, s: &str, max: usize) {
        self.str16(capped(s, max).as_bytes());
    }
    /// A byte string: u32 length, then the bytes.
    pub fn bytes32(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.raw(b);
    }
    pub fn cap(&mut self, c: &Capability) {
        self.raw(&c.to_bytes());
    }
    /// A capability set: u8 count, then 48 bytes each.
    pub fn caps(&mut self, caps: &[Capability]) {
        self.u8(caps.len() as u8);
        for c in caps {
            self.cap(c);
        }
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn capped(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Reads fields from a byte slice.
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(bad(self.what, TRUNCATED));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().unwrap())
    }
    pub fn str16(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    /// A text written by [`Writer::text16`] with the same `max`. Invalid
    /// UTF-8 is replaced, which can lengthen it (three bytes for each
    /// replacement), so it is cut again as the writer cuts: what is
    /// decoded encodes back to the same bytes.
    pub fn text16(&mut self, max: usize) -> Result<String, DecodeError> {
        Ok(capped(&String::from_utf8_lossy(self.str16()?), max).to_string())
    }
    pub fn bytes32(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn cap(&mut self) -> Result<Capability, DecodeError> {
        Capability::from_bytes(self.take(Capability::LEN)?)
            .map_err(|_| bad(self.what, "non-canonical capability"))
    }
    pub fn caps(&mut self) -> Result<Vec<Capability>, DecodeError> {
        let n = self.u8()? as usize;
        self.count(n, Capability::LEN)?;
        (0..n).map(|_| self.cap()).collect()
    }
    /// Checks that `n` items of at least `min` bytes each could follow, so
    /// a hostile count cannot make the caller reserve memory.
    pub fn count(&self, n: usize, min: usize) -> Result<usize, DecodeError> {
        if n.saturating_mul(min.max(1)) > self.buf.len() {
            return Err(bad(self.what, "count larger than the bytes left"));
        }
        Ok(n)
    }
    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// A field that is not what it should be.
    pub fn bad(&self, why: &'static str) -> DecodeError {
        bad(self.what, why)
    }
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(bad(self.what, TRAILING))
        }
    }
}
