//! The frame codec of a path: length-prefixed, versioned frames with
//! zero-copy decoding (the wire format is in the [module overview](super)).

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Largest payload of a `Data` frame this codec ever accepts (64 MiB).
/// Connections configure their own limit up to this.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Payload limit to pass to [`Frame::decode`] while waiting for the `Hello`
/// that opens a path: nothing but a control frame is expected, so an
/// unauthenticated peer cannot make us buffer more than a control frame.
pub const HELLO_MAX_PAYLOAD: usize = 0;

/// The wire version this module writes and accepts.
pub const WIRE_VERSION: u8 = 1;

/// Bytes of a `Data` frame before its payload (see [`encode_data_header`]).
pub const DATA_HEADER_LEN: usize = LEN_FIELD + PREAMBLE + 8;

/// Size of the length prefix.
const LEN_FIELD: usize = 4;
/// Version and kind bytes, counted by the length prefix.
const PREAMBLE: usize = 2;

const KIND_HELLO: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_ACK: u8 = 3;
const KIND_PING: u8 = 4;
const KIND_PONG: u8 = 5;

/// Length-field values of the fixed-size frames.
const HELLO_LEN: usize = PREAMBLE + 8 + 4 + 8;
const U64_FRAME_LEN: usize = PREAMBLE + 8;
const DATA_MIN_LEN: usize = PREAMBLE + 8;

/// The byte stream does not hold a valid frame. The stream cannot be
/// resynchronised: drop the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is too small to hold even the version and kind.
    #[error("frame length {len} is shorter than the {PREAMBLE}-byte preamble")]
    TooShort { len: usize },
    /// The length prefix exceeds the largest frame the receiver accepts.
    #[error("frame length {len} exceeds the limit of {max} bytes")]
    Oversized { len: usize, max: usize },
    /// A `Data` payload exceeds the receiver's payload limit.
    #[error("data payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge { len: usize, max: usize },
    /// The frame is of a wire version this side does not speak.
    #[error("unsupported wire version {version} (this side speaks {WIRE_VERSION})")]
    UnsupportedVersion { version: u8 },
    /// The frame kind byte is not one of the known kinds.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A known kind with a length it cannot have.
    #[error("{kind} frame with invalid length {len}")]
    BadLength { kind: &'static str, len: usize },
}

/// A frame on a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// First frame of each side on a new path: which connection, which
    /// migration epoch, and how far this side delivered.
    Hello {
        conn_id: u64,
        epoch: u32,
        delivered_through: u64,
    },
    /// One application message.
    Data { seq: u64, payload: Bytes },
    /// Cumulative acknowledgement.
    Ack { delivered_through: u64 },
    /// Liveness probe; answered by `Pong` with the same nonce.
    Ping { nonce: u64 },
    /// Answer to `Ping`.
    Pong { nonce: u64 },
}

/// Result of [`Frame::decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A complete frame, removed from the buffer.
    Frame(Frame),
    /// The buffer holds no complete frame yet (and is unchanged): read more.
    Incomplete,
}

/// Writes the header of a `Data` frame whose `len`-byte payload the caller
/// writes right after it (so a payload is never copied into the frame).
/// Together they equal `Frame::Data { seq, payload }.encode(..)`.
///
/// # Panics
///
/// If `len > MAX_PAYLOAD` (no receiver would accept it; the sender must
/// bound its messages).
pub fn encode_data_header(seq: u64, len: usize, dst: &mut BytesMut) {
    assert!(
        len <= MAX_PAYLOAD,
        "data payload of {len} bytes exceeds MAX_PAYLOAD ({MAX_PAYLOAD})"
    );
    dst.reserve(DATA_HEADER_LEN);
    put_preamble(dst, DATA_MIN_LEN + len, KIND_DATA);
    dst.put_u64(seq);
}

fn put_preamble(dst: &mut BytesMut, len: usize, kind: u8) {
    // Callers bound `len` by MAX_PAYLOAD plus a small header, far below 4 GiB.
    dst.put_u32(len as u32);
    dst.put_u8(WIRE_VERSION);
    dst.put_u8(kind);
}

fn put_u64_frame(dst: &mut BytesMut, kind: u8, v: u64) {
    dst.reserve(LEN_FIELD + U64_FRAME_LEN);
    put_preamble(dst, U64_FRAME_LEN, kind);
    dst.put_u64(v);
}

/// Largest length-field value accepted with payload limit `max_payload`.
fn max_frame_len(max_payload: usize) -> usize {
    HELLO_LEN.max(DATA_MIN_LEN + max_payload)
}

fn kind_name(kind: u8) -> &'static str {
    match kind {
        KIND_HELLO => "hello",
        KIND_DATA => "data",
        KIND_ACK => "ack",
        KIND_PING => "ping",
        KIND_PONG => "pong",
        _ => "unknown",
    }
}

impl Frame {
    /// Short name of the frame kind, for logs and errors.
    pub fn kind(&self) -> &'static str {
        kind_name(self.kind_byte())
    }

    fn kind_byte(&self) -> u8 {
        match self {
            Frame::Hello { .. } => KIND_HELLO,
            Frame::Data { .. } => KIND_DATA,
            Frame::Ack { .. } => KIND_ACK,
            Frame::Ping { .. } => KIND_PING,
            Frame::Pong { .. } => KIND_PONG,
        }
    }

    /// Bytes [`encode`](Self::encode) appends.
    pub fn encoded_len(&self) -> usize {
        LEN_FIELD
            + match self {
                Frame::Hello { .. } => HELLO_LEN,
                Frame::Data { payload, .. } => DATA_MIN_LEN + payload.len(),
                Frame::Ack { .. } | Frame::Ping { .. } | Frame::Pong { .. } => U64_FRAME_LEN,
            }
    }

    /// Appends the frame to `dst`. (`Data` copies its payload; use
    /// [`encode_data_header`] to write the payload separately.)
    ///
    /// # Panics
    ///
    /// If a `Data` payload exceeds [`MAX_PAYLOAD`].
    pub fn encode(&self, dst: &mut BytesMut) {
        match self {
            Frame::Hello {
                conn_id,
                epoch,
                delivered_through,
            } => {
                dst.reserve(LEN_FIELD + HELLO_LEN);
                put_preamble(dst, HELLO_LEN, KIND_HELLO);
                dst.put_u64(*conn_id);
                dst.put_u32(*epoch);
                dst.put_u64(*delivered_through);
            }
            Frame::Data { seq, payload } => {
                encode_data_header(*seq, payload.len(), dst);
                dst.extend_from_slice(payload);
            }
            Frame::Ack { delivered_through } => put_u64_frame(dst, KIND_ACK, *delivered_through),
            Frame::Ping { nonce } => put_u64_frame(dst, KIND_PING, *nonce),
            Frame::Pong { nonce } => put_u64_frame(dst, KIND_PONG, *nonce),
        }
    }

    /// Decodes the first frame of `src`, accepting `Data` payloads up to
    /// `max_payload` bytes (capped at [`MAX_PAYLOAD`]).
    ///
    /// On success the frame's bytes are removed from `src`; a `Data` payload
    /// is a zero-copy slice of them. [`Decoded::Incomplete`] leaves `src`
    /// unchanged. Errors are reported as soon as the header shows them
    /// (an oversized length is rejected without waiting for the body), and
    /// also leave `src` unchanged; the stream is then unusable.
    pub fn decode(src: &mut BytesMut, max_payload: usize) -> Result<Decoded, FrameError> {
        let max_payload = max_payload.min(MAX_PAYLOAD);
        if src.len() < LEN_FIELD {
            return Ok(Decoded::Incomplete);
        }
        let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        if len < PREAMBLE {
            return Err(FrameError::TooShort { len });
        }
        let max = max_frame_len(max_payload);
        if len > max {
            return Err(FrameError::Oversized { len, max });
        }
        let Some(&version) = src.get(LEN_FIELD) else {
            return Ok(Decoded::Incomplete);
        };
        if version != WIRE_VERSION {
            return Err(FrameError::UnsupportedVersion { version });
        }
        let Some(&kind) = src.get(LEN_FIELD + 1) else {
            return Ok(Decoded::Incomplete);
        };
        let len_ok = match kind {
            KIND_HELLO => len == HELLO_LEN,
            KIND_ACK | KIND_PING | KIND_PONG => len == U64_FRAME_LEN,
            KIND_DATA => {
                if len < DATA_MIN_LEN {
                    false
                } else if len - DATA_MIN_LEN > max_payload {
                    return Err(FrameError::PayloadTooLarge {
                        len: len - DATA_MIN_LEN,
                        max: max_payload,
                    });
                } else {
                    true
                }
            }
            other => return Err(FrameError::UnknownKind(other)),
        };
        if !len_ok {
            return Err(FrameError::BadLength {
                kind: kind_name(kind),
                len,
            });
        }
        if src.len() < LEN_FIELD + len {
            return Ok(Decoded::Incomplete);
        }
        let mut f = src.split_to(LEN_FIELD + len);
        f.advance(LEN_FIELD + PREAMBLE);
        let frame = match kind {
            KIND_HELLO => Frame::Hello {
                conn_id: f.get_u64(),
                epoch: f.get_u32(),
                delivered_through: f.get_u64(),
            },
            KIND_DATA => {
                let seq = f.get_u64();
                Frame::Data {
                    seq,
                    payload: f.freeze(),
                }
            }
            KIND_ACK => Frame::Ack {
                delivered_through: f.get_u64(),
            },
            KIND_PING => Frame::Ping { nonce: f.get_u64() },
            KIND_PONG => Frame::Pong { nonce: f.get_u64() },
            _ => unreachable!("kind validated above"),
        };
        Ok(Decoded::Frame(frame))
    }
}

#[cfg(test)]
mod tests {
    use crate::seq::frame::*;

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello {
                conn_id: 0xDEAD_BEEF_0000_0001,
                epoch: 7,
                delivered_through: 42,
            },
            Frame::Data {
                seq: 1,
                payload: Bytes::from_static(b"hello world"),
            },
            Frame::Data {
                seq: u64::MAX,
                payload: Bytes::new(),
            },
            Frame::Ack {
                delivered_through: 9,
            },
            Frame::Ping { nonce: 1 },
            Frame::Pong { nonce: u64::MAX },
        ]
    }

    fn encode(f: &Frame) -> BytesMut {
        let mut b = BytesMut::new();
        f.encode(&mut b);
        b
    }

    #[test]
    fn codec_round_trips() {
        for f in samples() {
            let mut b = encode(&f);
            assert_eq!(b.len(), f.encoded_len(), "{f:?}");
            assert_eq!(Frame::decode(&mut b, 1024), Ok(Decoded::Frame(f.clone())));
            assert!(b.is_empty());
        }
    }

    #[test]
    fn codec_layout_is_stable() {
        let b = encode(&Frame::Ack {
            delivered_through: 0x0102,
        });
        assert_eq!(&b[..], &[0, 0, 0, 10, 1, 3, 0, 0, 0, 0, 0, 0, 1, 2]);
        let h = encode(&Frame::Hello {
            conn_id: 1,
            epoch: 2,
            delivered_through: 3,
        });
        assert_eq!(h.len(), 26);
        assert_eq!(&h[..6], &[0, 0, 0, 22, 1, 1]);
        let d = encode(&Frame::Data {
            seq: 5,
            payload: Bytes::from_static(b"xy"),
        });
        assert_eq!(
            &d[..],
            &[0, 0, 0, 12, 1, 2, 0, 0, 0, 0, 0, 0, 0, 5, b'x', b'y']
        );
    }

    #[test]
    fn data_header_plus_payload_equals_encode() {
        let payload = Bytes::from_static(b"zero copy");
        let mut a = BytesMut::new();
        encode_data_header(77, payload.len(), &mut a);
        assert_eq!(a.len(), DATA_HEADER_LEN);
        a.extend_from_slice(&payload);
        assert_eq!(a, encode(&Frame::Data { seq: 77, payload }));
    }

    #[test]
    fn decode_is_zero_copy() {
        let mut b = encode(&Frame::Data {
            seq: 3,
            payload: Bytes::from(vec![7u8; 1000]),
        });
        let base = b.as_ptr() as usize;
        let Ok(Decoded::Frame(Frame::Data { payload, .. })) = Frame::decode(&mut b, 1000) else {
            panic!("expected data");
        };
        assert_eq!(payload.as_ptr() as usize, base + DATA_HEADER_LEN);
    }

    #[test]
    fn decode_several_frames_from_one_buffer() {
        let mut b = BytesMut::new();
        for f in samples() {
            f.encode(&mut b);
        }
        let mut got = Vec::new();
        while let Decoded::Frame(f) = Frame::decode(&mut b, 1024).unwrap() {
            got.push(f);
        }
        assert_eq!(got, samples());
        assert!(b.is_empty());
    }

    #[test]
    fn truncated_input_is_incomplete_and_untouched() {
        for f in samples() {
            let full = encode(&f);
            for cut in 0..full.len() {
                let mut b = BytesMut::from(&full[..cut]);
                assert_eq!(
                    Frame::decode(&mut b, 1024),
                    Ok(Decoded::Incomplete),
                    "{f:?} cut at {cut}"
                );
                assert_eq!(&b[..], &full[..cut]);
            }
        }
    }

    #[test]
    fn oversized_length_rejected_from_header_alone() {
        // A 4-byte header announcing 1 GiB: rejected before any body.
        let mut b = BytesMut::from(&(1u32 << 30).to_be_bytes()[..]);
        assert_eq!(
            Frame::decode(&mut b, 1000),
            Err(FrameError::Oversized {
                len: 1 << 30,
                max: DATA_MIN_LEN + 1000
            })
        );
        assert_eq!(b.len(), 4, "unchanged");
        // Beyond the absolute maximum even if the caller allows more.
        let mut b = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(matches!(
            Frame::decode(&mut b, usize::MAX),
            Err(FrameError::Oversized { .. })
        ));
    }

    #[test]
    fn payload_over_limit_rejected() {
        let mut b = BytesMut::new();
        encode_data_header(1, 101, &mut b);
        assert_eq!(
            Frame::decode(&mut b.clone(), 100),
            Err(FrameError::Oversized {
                len: DATA_MIN_LEN + 101,
                max: DATA_MIN_LEN + 100
            })
        );
        // While waiting for a hello even a small data frame is too big: the
        // limit is the largest control frame, and a payload beyond 0 bytes.
        assert_eq!(
            Frame::decode(&mut b.clone(), HELLO_MAX_PAYLOAD),
            Err(FrameError::Oversized {
                len: DATA_MIN_LEN + 101,
                max: HELLO_LEN
            })
        );
        let mut small = BytesMut::new();
        encode_data_header(1, 5, &mut small);
        assert_eq!(
            Frame::decode(&mut small, HELLO_MAX_PAYLOAD),
            Err(FrameError::PayloadTooLarge { len: 5, max: 0 })
        );
        // A hello still decodes under the hello limit.
        let hello = Frame::Hello {
            conn_id: 1,
            epoch: 1,
            delivered_through: 0,
        };
        assert_eq!(
            Frame::decode(&mut encode(&hello), HELLO_MAX_PAYLOAD),
            Ok(Decoded::Frame(hello))
        );
    }

    #[test]
    fn max_payload_accepted_at_limit() {
        let payload = Bytes::from(vec![1u8; 4096]);
        let f = Frame::Data { seq: 1, payload };
        assert_eq!(
            Frame::decode(&mut encode(&f), 4096),
            Ok(Decoded::Frame(f.clone()))
        );
        assert!(Frame::decode(&mut encode(&f), 4095).is_err());
    }

    #[test]
    #[should_panic(expected = "exceeds MAX_PAYLOAD")]
    fn encoding_beyond_max_payload_panics() {
        encode_data_header(1, MAX_PAYLOAD + 1, &mut BytesMut::new());
    }

    #[test]
    fn unknown_kind_rejected() {
        for kind in [0u8, 6, 0xFF] {
            let mut b = BytesMut::from(&[0, 0, 0, 10, WIRE_VERSION, kind][..]);
            assert_eq!(
                Frame::decode(&mut b, 100),
                Err(FrameError::UnknownKind(kind))
            );
        }
    }

    #[test]
    fn unknown_version_rejected() {
        let mut b = encode(&Frame::Ping { nonce: 1 });
        b[4] = 2;
        assert_eq!(
            Frame::decode(&mut b, 100),
            Err(FrameError::UnsupportedVersion { version: 2 })
        );
        // Detected from the first five bytes.
        let mut b = BytesMut::from(&[0, 0, 0, 10, 0][..]);
        assert_eq!(
            Frame::decode(&mut b, 100),
            Err(FrameError::UnsupportedVersion { version: 0 })
        );
    }

    #[test]
    fn bad_lengths_rejected() {
        let cases: [(u32, u8, &str); 5] = [
            (21, KIND_HELLO, "hello"),
            (23, KIND_HELLO, "hello"),
            (11, KIND_ACK, "ack"),
            (2, KIND_PING, "ping"),
            (9, KIND_DATA, "data"),
        ];
        for (len, kind, name) in cases {
            let mut b = BytesMut::new();
            b.put_u32(len);
            b.put_u8(WIRE_VERSION);
            b.put_u8(kind);
            assert_eq!(
                Frame::decode(&mut b, 100),
                Err(FrameError::BadLength {
                    kind: name,
                    len: len as usize
                })
            );
        }
        for len in [0u32, 1] {
            let mut b = BytesMut::from(&len.to_be_bytes()[..]);
            assert_eq!(
                Frame::decode(&mut b, 100),
                Err(FrameError::TooShort { len: len as usize })
            );
        }
    }

    #[test]
    fn kind_names() {
        let names: Vec<_> = samples().iter().map(Frame::kind).collect();
        assert_eq!(names, ["hello", "data", "data", "ack", "ping", "pong"]);
    }
}
