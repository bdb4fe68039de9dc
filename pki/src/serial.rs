//! [`Serial`]: a certificate serial number, the key of revocation. Written
//! as lowercase hex without separators (`show` prints it, `Revocations`
//! holds it); parsed from hex with optional `:` separators.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::PkiError;

/// RFC 5280 caps serial numbers at 20 bytes.
const MAX_SERIAL_BYTES: usize = 20;

/// A certificate serial number: its big-endian magnitude with leading zero
/// bytes removed, so the same serial always compares equal whatever DER
/// padding it came with.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Serial(Vec<u8>);

impl Serial {
    /// From the DER INTEGER content (as x509 parsers give it); fails on an
    /// empty or over-long serial.
    pub fn from_bytes(bytes: &[u8]) -> Result<Serial, PkiError> {
        let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
        let magnitude = &bytes[start..];
        if bytes.is_empty() || magnitude.len() > MAX_SERIAL_BYTES {
            return Err(PkiError::InvalidSerial(hex(bytes)));
        }
        Ok(Serial(magnitude.to_vec()))
    }

    /// The big-endian magnitude (empty for serial zero).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Display for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("00")
        } else {
            f.write_str(&hex(&self.0))
        }
    }
}

impl FromStr for Serial {
    type Err = PkiError;

    /// Hex digits (either case), optionally separated by `:`; at most 20
    /// bytes once leading zeros are dropped.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PkiError::InvalidSerial(s.chars().take(64).collect());
        let digits: Vec<u8> = s.bytes().filter(|b| *b != b':').collect();
        if digits.is_empty() || digits.len() > 2 * MAX_SERIAL_BYTES + 2 {
            return Err(bad());
        }
        let mut nibbles = Vec::with_capacity(digits.len() + 1);
        if digits.len() % 2 == 1 {
            nibbles.push(0);
        }
        for d in digits {
            nibbles.push(char::from(d).to_digit(16).ok_or_else(bad)? as u8);
        }
        let bytes: Vec<u8> = nibbles.chunks(2).map(|p| (p[0] << 4) | p[1]).collect();
        Serial::from_bytes(&bytes).map_err(|_| bad())
    }
}

impl From<Serial> for String {
    fn from(s: Serial) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for Serial {
    type Error = PkiError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_and_separators_do_not_matter() {
        let a: Serial = "00:7f:01".parse().unwrap();
        let b = Serial::from_bytes(&[0x7f, 0x01]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "7f01");
        assert_eq!("7F01".parse::<Serial>().unwrap(), b);
        assert_eq!("f01".parse::<Serial>().unwrap().to_string(), "0f01");
    }

    #[test]
    fn garbage_is_refused() {
        for s in ["", ":", "xyz", "12 34", &"ab".repeat(21), "0x12"] {
            assert!(s.parse::<Serial>().is_err(), "{s:?}");
        }
        assert!(Serial::from_bytes(&[]).is_err());
    }

    #[test]
    fn serde_is_the_hex_string() {
        let s: Serial = "0a0b".parse().unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "\"0a0b\"");
        assert_eq!(serde_json::from_str::<Serial>(&json).unwrap(), s);
        assert!(serde_json::from_str::<Serial>("\"zz\"").is_err());
    }
}
