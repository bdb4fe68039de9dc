//! The probe packet: fixed size, little-endian, versioned, validated.
//!
//! Every probe is exactly [`PACKET_LEN`] bytes, so both probes of a coded
//! pair take the same time on the wire and the packet can be found at the
//! end of a transmit timestamp's looped-back frame (the kernel returns the
//! frame with its link, IP and UDP headers in front).
//!
//! ```text
//! 0   magic  "RGP1"         4
//! 4   version (1)           1
//! 5   index in the pair     1   0 or 1
//! 6   rail                  1
//! 7   record count          1   0..=MAX_RECORDS
//! 8   from host id          4
//! 12  to host id            4
//! 16  pair sequence         8   per (from, to, rail), from 1
//! 24  records               MAX_RECORDS × 25: tag (1) + seq (8) + 2 × i64
//! 124 settled rails         4   bit r (r < 31): the sender's NIC on rail r
//!                               has been up long enough for its probes to
//!                               arrive; bit 31: the field is set (agents
//!                               before it wrote 0 here)
//! ```
//!
//! Records piggyback what the two-step protocol needs to close a pair on
//! both sides: a `Tx` record carries the sender's transmit timestamps of
//! one of its earlier pairs (the receiver has the receive timestamps); an
//! `Rx` record returns the receive timestamps of one of the peer's pairs
//! (the peer has the transmit timestamps).

/// Size of every probe packet (UDP payload).
pub const PACKET_LEN: usize = 128;
/// Records per packet.
pub const MAX_RECORDS: usize = 4;
const MAGIC: &[u8; 4] = b"RGP1";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 24;
const RECORD_LEN: usize = 25;
const _: () = assert!(HEADER_LEN + MAX_RECORDS * RECORD_LEN <= PACKET_LEN);

/// Timestamps of one pair, as a record carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The sender's transmit timestamps of its pair `seq`.
    Tx { seq: u64, ts: [i64; 2] },
    /// The receive timestamps of the addressee's pair `seq`.
    Rx { seq: u64, ts: [i64; 2] },
}

/// A probe's records, inline (no allocation per packet).
pub type Records = arrayvec::ArrayVec<Record, MAX_RECORDS>;

/// One decoded probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub index: u8,
    pub rail: u8,
    pub from: u32,
    pub to: u32,
    pub seq: u64,
    pub records: Records,
    /// The sender's settled rails ([`SETTLED_VALID`] and a bit per rail
    /// below [`SETTLED_RAILS`]), or 0 from an agent that does not say.
    pub settled: u32,
}

/// Bit 31 of [`Probe::settled`]: the sender says which rails are settled.
pub const SETTLED_VALID: u32 = 1 << 31;
/// Rails the settled bitmap can name (0..31).
pub const SETTLED_RAILS: u32 = 31;
/// Offset of [`Probe::settled`] in the packet.
const SETTLED_AT: usize = HEADER_LEN + MAX_RECORDS * RECORD_LEN;
const _: () = assert!(SETTLED_AT + 4 <= PACKET_LEN);

/// Why a packet was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The packet is not [`PACKET_LEN`] bytes.
    #[error("probe packet of {0} bytes (want {PACKET_LEN})")]
    Length(usize),
    /// The packet does not start with the probe magic.
    #[error("not a railguard probe (bad magic)")]
    Magic,
    /// The packet is of another probe version.
    #[error("probe version {0} (this agent speaks {VERSION})")]
    Version(u8),
    /// The probe index is neither 0 nor 1.
    #[error("probe index {0} (want 0 or 1)")]
    Index(u8),
    /// The packet claims more than [`MAX_RECORDS`] records.
    #[error("{0} records (at most {MAX_RECORDS})")]
    Records(u8),
    /// A record has an unknown tag.
    #[error("unknown record tag {0}")]
    Tag(u8),
    /// The pair sequence is 0 (sequences start at 1).
    #[error("pair sequence 0")]
    ZeroSeq,
}

impl Probe {
    /// Encodes into a full-size packet.
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = self.index;
        b[6] = self.rail;
        b[7] = self.records.len() as u8;
        b[8..12].copy_from_slice(&self.from.to_le_bytes());
        b[12..16].copy_from_slice(&self.to.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        for (i, r) in self.records.iter().enumerate() {
            let o = HEADER_LEN + i * RECORD_LEN;
            let (tag, seq, ts) = match *r {
                Record::Tx { seq, ts } => (1u8, seq, ts),
                Record::Rx { seq, ts } => (2u8, seq, ts),
            };
            b[o] = tag;
            b[o + 1..o + 9].copy_from_slice(&seq.to_le_bytes());
            b[o + 9..o + 17].copy_from_slice(&ts[0].to_le_bytes());
            b[o + 17..o + 25].copy_from_slice(&ts[1].to_le_bytes());
        }
        b[SETTLED_AT..SETTLED_AT + 4].copy_from_slice(&self.settled.to_le_bytes());
        b
    }

    /// Decodes and validates a packet (the UDP payload).
    pub fn decode(b: &[u8]) -> Result<Probe, WireError> {
        if b.len() != PACKET_LEN {
            return Err(WireError::Length(b.len()));
        }
        if &b[0..4] != MAGIC {
            return Err(WireError::Magic);
        }
        if b[4] != VERSION {
            return Err(WireError::Version(b[4]));
        }
        if b[5] > 1 {
            return Err(WireError::Index(b[5]));
        }
        let n = b[7];
        if usize::from(n) > MAX_RECORDS {
            return Err(WireError::Records(n));
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let i64_at = |o: usize| i64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let seq = u64_at(16);
        if seq == 0 {
            return Err(WireError::ZeroSeq);
        }
        let mut records = Records::new();
        for i in 0..usize::from(n) {
            let o = HEADER_LEN + i * RECORD_LEN;
            let (rseq, ts) = (u64_at(o + 1), [i64_at(o + 9), i64_at(o + 17)]);
            if rseq == 0 {
                return Err(WireError::ZeroSeq);
            }
            records.push(match b[o] {
                1 => Record::Tx { seq: rseq, ts },
                2 => Record::Rx { seq: rseq, ts },
                t => return Err(WireError::Tag(t)),
            });
        }
        Ok(Probe {
            index: b[5],
            rail: b[6],
            from: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            to: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
            seq,
            records,
            settled: u32::from_le_bytes(b[SETTLED_AT..SETTLED_AT + 4].try_into().expect("4 bytes")),
        })
    }

    /// The probe inside a looped-back transmit frame: its last
    /// [`PACKET_LEN`] bytes.
    pub fn decode_frame_tail(frame: &[u8]) -> Result<Probe, WireError> {
        if frame.len() < PACKET_LEN {
            return Err(WireError::Length(frame.len()));
        }
        Self::decode(&frame[frame.len() - PACKET_LEN..])
    }
}

#[cfg(test)]
mod tests;
