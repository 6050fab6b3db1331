//! Bodies in fragments: the blast/window protocol shared by both directions.
//!
//! A body of any size is cut into fragments of `frag_bytes` (the last may be
//! shorter; an empty body is one empty fragment).  The sender blasts up to a
//! window of fragments (4 to 64) without waiting; the receiver acknowledges
//! every few fragments (see [`Incoming::wants_ack`]), on the last fragment and on every duplicate, with a selective ack
//! (`base`: everything below arrived; `mask`: which of the next 64 did).  An
//! ack both slides the window and reveals holes, which the sender fills at
//! once; a hole whose refill is lost is found again by the sender's timer,
//! which resends the first missing fragment as a probe that draws a fresh
//! ack.  Single-fragment bodies, the common case, are never acknowledged by
//! an ack of their own: the reply acknowledges the request, and the next
//! request (or a timeout) acknowledges the reply.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use shoal_wire::Frag;

use smallvec::SmallVec;

use crate::bitset::BitSet;

/// A body in one or more pieces: a reply can be gathered from buffers
/// held elsewhere (a file server's cache of extents, say) and sent without
/// first copying them into one buffer.
#[derive(Debug, Clone, Default)]
pub struct Rope {
    /// Inline for one piece: most bodies are one buffer, and a small
    /// call's body should cost no allocation for its bookkeeping.
    pieces: SmallVec<[Bytes; 1]>,
    /// Where each piece ends in the body.
    ends: SmallVec<[usize; 1]>,
}

impl Rope {
    /// The body made of `pieces`, in order (empty ones are skipped).
    pub fn from_pieces(pieces: impl IntoIterator<Item = Bytes>) -> Rope {
        let mut rope = Rope::default();
        let mut end = 0;
        for p in pieces {
            if !p.is_empty() {
                end += p.len();
                rope.pieces.push(p);
                rope.ends.push(end);
            }
        }
        rope
    }

    /// Bytes in the body.
    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The pieces holding `range` of the body, each cut to it.
    pub fn pieces(&self, range: Range<usize>) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.each(range, |piece, r| out.push(piece.slice(r)));
        out
    }

    /// `range` of the body: borrowed if one piece holds it, else copied.
    pub fn bytes(&self, range: Range<usize>) -> Cow<'_, [u8]> {
        let mut one = None;
        let mut many: Option<Vec<u8>> = None;
        self.each(range, |piece, r| match (&mut one, &mut many) {
            (None, None) => one = Some(&piece[r]),
            (Some(first), None) => {
                let mut v = first.to_vec();
                v.extend_from_slice(&piece[r]);
                many = Some(v);
            }
            (_, Some(v)) => v.extend_from_slice(&piece[r]),
        });
        match (one, many) {
            (_, Some(v)) => Cow::Owned(v),
            (Some(b), None) => Cow::Borrowed(b),
            (None, None) => Cow::Borrowed(&[]),
        }
    }

    /// Calls `f` with each piece overlapping `range` and the part of the
    /// piece (in the piece's own offsets) that falls in it, in order.
    fn each<'a>(&'a self, range: Range<usize>, mut f: impl FnMut(&'a Bytes, Range<usize>)) {
        let mut i = self.ends.partition_point(|&e| e <= range.start);
        while i < self.pieces.len() && range.start < range.end {
            let start = self.ends[i] - self.pieces[i].len();
            if start >= range.end {
                break;
            }
            let from = range.start.max(start) - start;
            let to = range.end.min(self.ends[i]) - start;
            f(&self.pieces[i], from..to);
            i += 1;
        }
    }
}

impl From<Bytes> for Rope {
    fn from(b: Bytes) -> Rope {
        Rope::from_pieces([b])
    }
}

impl From<Vec<u8>> for Rope {
    fn from(v: Vec<u8>) -> Rope {
        Rope::from(Bytes::from(v))
    }
}

impl From<Vec<Bytes>> for Rope {
    fn from(pieces: Vec<Bytes>) -> Rope {
        Rope::from_pieces(pieces)
    }
}

/// Sender side of one body.
#[derive(Debug, Clone)]
pub struct Outgoing {
    body: Rope,
    frag_bytes: usize,
    count: u32,
    window: u32,
    acked: BitSet,
    /// Fragments refilled since the last timeout, so one hole is refilled
    /// once per round, not once per ack.
    refilled: BitSet,
    /// First fragment not yet acknowledged.
    base: u32,
    /// First fragment never sent.
    next_new: u32,
}

impl Outgoing {
    /// Prepares `body` for sending in fragments of `frag_bytes`, at most
    /// `window` unacknowledged at a time.
    pub fn new(body: impl Into<Rope>, frag_bytes: usize, window: u32) -> Self {
        let body = body.into();
        assert!(frag_bytes > 0 && window > 0);
        let count = body.len().div_ceil(frag_bytes).max(1);
        let count = u32::try_from(count).expect("body too large for u32 fragments");
        Self {
            body,
            frag_bytes,
            count,
            window,
            acked: BitSet::new(count),
            refilled: BitSet::new(count),
            base: 0,
            next_new: 0,
        }
    }

    /// Fragments in the body.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes in the body.
    pub fn total_len(&self) -> u64 {
        self.body.len() as u64
    }

    /// Fragment `index` and its bytes (copied only if they span pieces).
    pub fn fragment(&self, index: u32) -> (Frag, Cow<'_, [u8]>) {
        (self.frag(index), self.body.bytes(self.range(index)))
    }

    /// Fragment `index` and where its bytes are in the body.
    pub fn frag(&self, index: u32) -> Frag {
        Frag {
            index,
            count: self.count,
        }
    }

    /// Where fragment `index`'s bytes are in the body.
    pub fn range(&self, index: u32) -> Range<usize> {
        let len = self.body.len();
        let start = (index as usize * self.frag_bytes).min(len);
        start..(start + self.frag_bytes).min(len)
    }

    /// The body.
    pub fn body(&self) -> &Rope {
        &self.body
    }

    /// Fragments to send at the start: the first window.
    pub fn start(&mut self) -> Range<u32> {
        self.advance()
    }

    /// Whether nothing has been sent yet.
    pub fn is_fresh(&self) -> bool {
        self.next_new == 0
    }

    /// Whether every fragment has been acknowledged.
    pub fn is_acked(&self) -> bool {
        self.base >= self.count
    }

    /// Applies an acknowledgement; returns the fragments to send now: holes
    /// the ack reveals, then new fragments the window admits.  Returns
    /// whether the ack made progress alongside.
    pub fn on_ack(&mut self, base: u32, mask: u64) -> (Vec<u32>, bool) {
        let base = base.min(self.count);
        let mut progress = false;
        while self.base < base {
            progress |= self.acked.set(self.base);
            self.base += 1;
        }
        let mut highest = None;
        for i in 0..64u32 {
            let idx = base.saturating_add(1).saturating_add(i);
            if idx >= self.count {
                break;
            }
            if mask & (1 << i) != 0 {
                progress |= self.acked.set(idx);
                highest = Some(idx);
            }
        }
        while self.base < self.count && self.acked.get(self.base) {
            self.base += 1;
        }
        if !progress {
            // An ack that tells nothing new comes from the receiver's
            // timer: holes refilled before may have been lost again.
            self.refilled.clear_all();
        }
        let mut send = Vec::new();
        if let Some(highest) = highest {
            for idx in self.base..highest {
                if !self.acked.get(idx) && idx < self.next_new && self.refilled.set(idx) {
                    send.push(idx);
                }
            }
        }
        send.extend(self.advance());
        if send.is_empty() && !progress && self.base < self.next_new {
            // An ack that tells nothing new is the receiver's timer asking
            // for what it misses: resend the first hole.
            send.push(self.base);
        }
        (send, progress)
    }

    /// After a timeout: the fragment to resend as a probe (the first one not
    /// acknowledged, or the last one if all are), and a fresh refill round.
    pub fn probe(&mut self) -> u32 {
        self.refilled.clear_all();
        if self.base < self.count {
            self.base
        } else {
            self.count - 1
        }
    }

    fn advance(&mut self) -> Range<u32> {
        let limit = self.base.saturating_add(self.window).min(self.count);
        let from = self.next_new;
        if from < limit {
            self.next_new = limit;
        }
        from..limit
    }
}

impl Drop for Outgoing {
    /// A large body nobody else holds goes back to the pool, so the next
    /// large body (a reply, a request) reuses its pages.
    fn drop(&mut self) {
        for piece in std::mem::take(&mut self.body.pieces) {
            crate::pool::give_bytes(piece);
        }
    }
}

/// Whether fragment `frag` of a body of `total_len` bytes, carrying
/// `payload`, is the whole body: its only fragment, exactly as long as the
/// body.  Such a body needs no reassembly (an [`Incoming`] would accept it
/// and complete with `payload` as it is).
pub fn is_whole(frag: Frag, total_len: u64, payload: &[u8]) -> bool {
    frag.count == 1 && frag.index == 0 && total_len == payload.len() as u64
}

/// Receiver side of one body.
#[derive(Debug, Clone)]
pub struct Incoming {
    total_len: u64,
    count: u32,
    frag_bytes: Option<usize>,
    data: Vec<u8>,
    received: BitSet,
    received_count: u32,
    /// First fragment not yet received.
    base: u32,
    /// Highest fragment received.
    highest: u32,
}

/// What adding a fragment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// A fragment not seen before.
    New,
    /// A fragment not seen before that filled a hole below others.
    Refill,
    /// A fragment already held.
    Duplicate,
    /// A fragment inconsistent with the others: ignored.
    Invalid,
}

impl Incoming {
    /// Starts reassembling a body of `total_len` bytes in `count` fragments.
    /// `None` if it would exceed `max_bytes` or the two do not fit together.
    pub fn new(total_len: u64, count: u32, max_bytes: u64) -> Option<Self> {
        if total_len > max_bytes || count == 0 || (count as u64) > total_len.max(1) {
            return None;
        }
        Some(Self {
            total_len,
            count,
            frag_bytes: None,
            data: crate::pool::take(usize::try_from(total_len).ok()?),
            received: BitSet::new(count),
            received_count: 0,
            base: 0,
            highest: 0,
        })
    }

    /// Fragments in the body.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes in the whole body.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// Adds one fragment.
    pub fn add(&mut self, frag: Frag, total_len: u64, payload: &[u8]) -> Added {
        let start = match self.place(frag, total_len, payload.len()) {
            Ok(start) => start,
            Err(added) => return added,
        };
        self.data[start..start + payload.len()].copy_from_slice(payload);
        self.mark(frag.index)
    }

    /// Checks fragment `frag` of `len` bytes against the body: where its
    /// bytes go, or why it is not added.
    fn place(&mut self, frag: Frag, total_len: u64, len: usize) -> Result<usize, Added> {
        if frag.count != self.count || total_len != self.total_len || frag.index >= self.count {
            return Err(Added::Invalid);
        }
        if self.received.get(frag.index) {
            return Err(Added::Duplicate);
        }
        let last = frag.index == self.count - 1;
        let frag_bytes = match self.frag_bytes {
            Some(f) => f,
            None if self.count == 1 => len.max(1),
            None if last => {
                // (count-1) * f + len == total_len
                let rest = self.total_len.saturating_sub(len as u64);
                let n = (self.count - 1) as u64;
                if rest == 0 || !rest.is_multiple_of(n) {
                    return Err(Added::Invalid);
                }
                (rest / n) as usize
            }
            None => len,
        };
        if frag_bytes == 0
            || (len as u64) > self.total_len
            || self.total_len.div_ceil(frag_bytes as u64).max(1) != self.count as u64
        {
            return Err(Added::Invalid);
        }
        let start = frag.index as u64 * frag_bytes as u64;
        let expected = if last {
            self.total_len.checked_sub(start)
        } else {
            Some(frag_bytes as u64)
        };
        if expected != Some(len as u64)
            || (last && (len > frag_bytes || (self.count > 1 && len == 0)))
        {
            return Err(Added::Invalid);
        }
        let start = start as usize;
        if self.data.get(start..start + len).is_none() {
            return Err(Added::Invalid);
        }
        self.frag_bytes = Some(frag_bytes);
        Ok(start)
    }

    /// Counts fragment `index` as received.
    fn mark(&mut self, index: u32) -> Added {
        self.received.set(index);
        self.received_count += 1;
        let filled_hole = index < self.highest;
        self.highest = self.highest.max(index);
        while self.base < self.count && self.received.get(self.base) {
            self.base += 1;
        }
        if filled_hole {
            Added::Refill
        } else {
            Added::New
        }
    }

    /// Whether the sender should hear about this fragment now: every
    /// quarter of a window of at most 16 (so a sender refills long before
    /// the receiver runs dry, and a sender whose window is smaller than
    /// ours, down to 4, never waits for an ack that is not coming), at the
    /// last fragment, and whenever a hole was filled or a duplicate arrived
    /// (both mean the sender is recovering).
    pub fn wants_ack(&self, added: Added, index: u32, window: u32) -> bool {
        match added {
            Added::Invalid => false,
            Added::Duplicate | Added::Refill => true,
            Added::New => {
                self.received_count
                    .is_multiple_of((window.min(16) / 4).max(1))
                    || index == self.count - 1
            }
        }
    }

    /// Whether every fragment arrived.
    pub fn is_complete(&self) -> bool {
        self.received_count == self.count
    }

    /// Fragments received so far.
    pub fn received_count(&self) -> u32 {
        self.received_count
    }

    /// The selective ack describing what arrived: `(base, mask)`.
    pub fn ack_state(&self) -> (u32, u64) {
        let mut mask = 0u64;
        for i in 0..64u32 {
            let idx = self.base.saturating_add(1).saturating_add(i);
            if idx >= self.count {
                break;
            }
            if self.received.get(idx) {
                mask |= 1 << i;
            }
        }
        (self.base, mask)
    }

    /// The reassembled body.  Call only when complete.
    pub fn into_body(self) -> Vec<u8> {
        debug_assert!(self.is_complete());
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(len: usize, frag: usize, window: u32, drop_every: usize) -> Vec<u8> {
        let body: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut out = Outgoing::new(Bytes::from(body.clone()), frag, window);
        let mut inc = Incoming::new(out.total_len(), out.count(), u64::MAX).unwrap();
        let mut queue: Vec<u32> = out.start().collect();
        let mut sent = 0usize;
        let mut rounds = 0;
        while !inc.is_complete() {
            rounds += 1;
            assert!(rounds < 100_000, "transfer did not converge");
            if queue.is_empty() {
                queue.push(out.probe());
            }
            let mut acks = Vec::new();
            for idx in std::mem::take(&mut queue) {
                sent += 1;
                if drop_every > 0 && sent.is_multiple_of(drop_every) {
                    continue;
                }
                let (f, p) = out.fragment(idx);
                let added = inc.add(f, out.total_len(), &p);
                assert_ne!(added, Added::Invalid);
                if inc.wants_ack(added, idx, window) {
                    acks.push(inc.ack_state());
                }
            }
            for (b, m) in acks {
                queue.extend(out.on_ack(b, m).0);
            }
        }
        let (b, m) = inc.ack_state();
        out.on_ack(b, m);
        assert!(out.is_acked());
        inc.into_body()
    }

    #[test]
    fn bodies_of_many_sizes_arrive_whole() {
        for len in [0, 1, 99, 100, 101, 1000, 12_345] {
            for drop in [0, 3, 7] {
                let expect: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
                assert_eq!(transfer(len, 100, 8, drop), expect, "len {len} drop {drop}");
            }
        }
    }

    proptest::proptest! {
        /// A body in pieces is cut into the same fragments as the body in
        /// one buffer, whether a fragment is taken whole or as pieces.
        #[test]
        fn a_rope_fragments_like_its_bytes(
            len in 0usize..3000,
            cuts in proptest::collection::vec(0usize..3000, 0..12),
            frag in 1usize..700,
        ) {
            let body: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut at: Vec<usize> = cuts.into_iter().map(|c| c.min(len)).collect();
            at.extend([0, len]);
            at.sort_unstable();
            let whole = Bytes::from(body.clone());
            let rope = Rope::from_pieces(at.windows(2).map(|w| whole.slice(w[0]..w[1])));
            proptest::prop_assert_eq!(rope.len(), len);
            let a = Outgoing::new(rope, frag, 8);
            let b = Outgoing::new(body.clone(), frag, 8);
            proptest::prop_assert_eq!(a.count(), b.count());
            for idx in 0..a.count() {
                let (fa, pa) = a.fragment(idx);
                let (fb, pb) = b.fragment(idx);
                proptest::prop_assert_eq!(fa, fb);
                proptest::prop_assert_eq!(&pa[..], &pb[..]);
                let joined: Vec<u8> = a.body().pieces(a.range(idx)).concat();
                proptest::prop_assert_eq!(&joined[..], &pb[..]);
            }
        }

        /// The receivers' shortcut for a body in one datagram takes exactly
        /// what reassembly would have completed at once, with the same
        /// bytes: it changes no outcome, only its cost.
        #[test]
        fn a_whole_body_is_what_reassembly_completes_at_once(
            index in 0u32..3,
            count in 0u32..3,
            total_len in 0u64..40,
            len in 0usize..40,
        ) {
            let payload: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
            let frag = Frag { index, count };
            let completes = Incoming::new(total_len, count, u64::MAX).and_then(|mut inc| {
                (inc.add(frag, total_len, &payload) == Added::New && inc.is_complete())
                    .then(|| inc.into_body())
            });
            if is_whole(frag, total_len, &payload) {
                proptest::prop_assert_eq!(completes, Some(payload));
            } else {
                // Anything else either waits for more fragments or is
                // refused: only a one-fragment body completes at once.
                proptest::prop_assert!(completes.is_none() || count != 1);
            }
        }
    }

    /// Offers `inc` each fragment of `steps` in turn, `(index, count,
    /// total length, fill byte, length)`, and checks what it answers.
    fn offer(inc: &mut Incoming, steps: &[(u32, u32, u64, u8, usize, Added)]) {
        for (i, &(index, count, total, fill, len, want)) in steps.iter().enumerate() {
            let got = inc.add(Frag { index, count }, total, &vec![fill; len]);
            assert_eq!(got, want, "step {i}: fragment {index} of {count}");
        }
    }

    #[test]
    fn inconsistent_fragments_are_rejected() {
        let mut inc = Incoming::new(250, 3, u64::MAX).unwrap();
        offer(
            &mut inc,
            &[
                (0, 3, 250, 0, 100, Added::New),
                (1, 3, 250, 0, 99, Added::Invalid),
                (2, 3, 250, 0, 60, Added::Invalid),
                (2, 4, 250, 0, 50, Added::Invalid),
                (2, 3, 251, 0, 50, Added::Invalid),
                (2, 3, 250, 0, 50, Added::New),
                (0, 3, 250, 0, 100, Added::Duplicate),
            ],
        );
        assert!(!inc.is_complete());
    }

    #[test]
    fn last_fragment_first_fixes_the_fragment_size() {
        let mut inc = Incoming::new(250, 3, u64::MAX).unwrap();
        offer(
            &mut inc,
            &[
                (2, 3, 250, 2, 50, Added::New),
                (0, 3, 250, 0, 100, Added::Refill),
                (1, 3, 250, 1, 100, Added::Refill),
            ],
        );
        let body = inc.into_body();
        assert_eq!(&body[200..], &[2; 50]);
    }

    #[test]
    fn oversized_bodies_are_refused_before_allocating() {
        assert!(Incoming::new(1 << 40, 3, 1 << 30).is_none());
        assert!(Incoming::new(10, 11, u64::MAX).is_none());
        assert!(Incoming::new(10, 0, u64::MAX).is_none());
    }
}
