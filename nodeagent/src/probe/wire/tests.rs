//! Unit tests of `probe::wire`.

use super::*;

fn sample() -> Probe {
    Probe {
        index: 1,
        rail: 3,
        from: 7,
        to: 9,
        seq: 42,
        records: [
            Record::Tx {
                seq: 41,
                ts: [i64::MIN, i64::MAX],
            },
            Record::Rx {
                seq: 40,
                ts: [-5, 1_700_000_000_000_000_000],
            },
        ]
        .into_iter()
        .collect(),
        settled: SETTLED_VALID | 0b1000_0101,
    }
}

#[test]
fn round_trips() {
    let p = sample();
    let b = p.encode();
    assert_eq!(Probe::decode(&b).unwrap(), p);
    let mut frame = vec![0xAA; 42];
    frame.extend_from_slice(&b);
    assert_eq!(Probe::decode_frame_tail(&frame).unwrap(), p);
}

#[test]
fn refuses_malformed_packets() {
    let b = sample().encode();
    assert_eq!(Probe::decode(&b[..100]), Err(WireError::Length(100)));
    let mut x = b;
    x[0] = b'X';
    assert_eq!(Probe::decode(&x), Err(WireError::Magic));
    let mut x = b;
    x[4] = 2;
    assert_eq!(Probe::decode(&x), Err(WireError::Version(2)));
    let mut x = b;
    x[5] = 2;
    assert_eq!(Probe::decode(&x), Err(WireError::Index(2)));
    let mut x = b;
    x[7] = 5;
    assert_eq!(Probe::decode(&x), Err(WireError::Records(5)));
    let mut x = b;
    x[HEADER_LEN] = 9;
    assert_eq!(Probe::decode(&x), Err(WireError::Tag(9)));
    let mut x = b;
    x[16..24].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(Probe::decode(&x), Err(WireError::ZeroSeq));
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A cheap deterministic fuzz: random packets decode or fail cleanly.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..20_000 {
        let mut b = [0u8; PACKET_LEN];
        for byte in b.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        let _ = Probe::decode(&b);
    }
}
