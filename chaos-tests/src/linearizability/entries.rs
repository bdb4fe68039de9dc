//! The data structures both searches run on: the operations' call and
//! return entries as a doubly linked list in time order (taken out and put
//! back as operations are linearized and undone), the bit set of
//! linearized operations, and a fast hasher for the search's maps.

use std::hash::{BuildHasherDefault, Hasher};

use super::model::Operation;

#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) is_call: bool,
    /// The operation, as an index into the list the entries were built from.
    pub(super) op: usize,
    /// For a call: index of its return entry.
    pub(super) matching: usize,
    pub(super) prev: usize,
    pub(super) next: usize,
}

pub(super) const NIL: usize = usize::MAX;

/// The call and return entries of operations `which` (indices into `ops`),
/// as a doubly linked list in time order behind a sentinel head (entry 0).
/// At equal times calls come first (an operation that starts when another
/// ends may be ordered either way); unknown-outcome operations return at
/// the end of time.
pub(super) fn build_entries<I, O>(ops: &[Operation<I, O>], which: &[usize]) -> Vec<Entry> {
    let n = which.len();
    let mut ev: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (l, &i) in which.iter().enumerate() {
        let op = &ops[i];
        ev.push((op.call, true, l));
        ev.push((op.ret.map_or(u64::MAX, |r| r.max(op.call)), false, l));
    }
    ev.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut entries: Vec<Entry> = Vec::with_capacity(2 * n + 1);
    entries.push(Entry {
        is_call: false,
        op: NIL,
        matching: NIL,
        prev: NIL,
        next: if ev.is_empty() { NIL } else { 1 },
    });
    let mut ret_pos = vec![NIL; n];
    for (k, (_, is_call, op)) in ev.iter().enumerate() {
        let idx = k + 1;
        entries.push(Entry {
            is_call: *is_call,
            op: *op,
            matching: NIL,
            prev: idx - 1,
            next: if k + 1 < ev.len() { idx + 1 } else { NIL },
        });
        if !is_call {
            ret_pos[*op] = idx;
        }
    }
    for e in entries.iter_mut().skip(1) {
        if e.is_call {
            e.matching = ret_pos[e.op];
        }
    }
    entries
}

/// Takes call entry `i` and its return out of the list.
pub(super) fn lift(entries: &mut [Entry], i: usize) {
    let (p, nx) = (entries[i].prev, entries[i].next);
    entries[p].next = nx;
    if nx != NIL {
        entries[nx].prev = p;
    }
    let m = entries[i].matching;
    let (mp, mn) = (entries[m].prev, entries[m].next);
    entries[mp].next = mn;
    if mn != NIL {
        entries[mn].prev = mp;
    }
}

/// Puts back what the matching [`lift`] took out (in reverse order).
pub(super) fn unlift(entries: &mut [Entry], i: usize) {
    let m = entries[i].matching;
    let (mp, mn) = (entries[m].prev, entries[m].next);
    entries[mp].next = m;
    if mn != NIL {
        entries[mn].prev = m;
    }
    let (p, nx) = (entries[i].prev, entries[i].next);
    entries[p].next = i;
    if nx != NIL {
        entries[nx].prev = i;
    }
}

/// Fixed-size bit set used as part of the memo key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Bits(pub(super) Vec<u64>);

impl Bits {
    pub(super) fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    pub(super) fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    pub(super) fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    pub(super) fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    pub(super) fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub(super) fn is_subset(&self, other: &Bits) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & !b == 0)
    }
}

/// A multiply-rotate hasher for the search's maps: their keys are states,
/// bit sets and small numbers made by the checker itself, so speed matters
/// and resistance to crafted collisions does not.
#[derive(Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

impl FastHasher {
    #[inline]
    pub(super) fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        // Spread the last word's bits into the low bits the table uses.
        self.0 ^ (self.0 >> 32)
    }
}

pub(super) type Fast = BuildHasherDefault<FastHasher>;
