//! The on-disk format: the sled trees and keys raft-store uses, and the
//! envelope every stored value is wrapped in.
//!
//! **Envelope.** Every value raft-store writes (a log entry, the vote, the
//! committed log id, the purge marker, snapshot meta and snapshot data)
//! starts with one byte, the format version ([`FORMAT_VERSION`]), followed by
//! the payload. A log entry's payload starts with a second byte, the
//! application model's format ([`crate::StateModel::FORMAT_VERSION`]), since
//! the entry carries the model's commands; then comes the rest: bincode (fixed-width integers, little-endian, the encoding of
//! `bincode::serialize`) for Raft records, the model's own bytes
//! ([`crate::StateModel::encode`]) for snapshot data. A reader checks the
//! byte before it decodes anything: another version is
//! [`StoreError::UnsupportedVersion`], an empty, truncated or garbled value
//! (including trailing bytes) is [`StoreError::Corrupt`], each naming the
//! value, its tree and its key.
//!
//! **Store marker.** The `meta` tree's `format` key holds the version byte
//! alone. A new database gets it when first opened; a database with data
//! but no marker was written before records carried a version and is
//! refused ([`StoreError::Unversioned`]): its records would be misread.

use durable_sled::DurableDb;
use std::fmt::Display;
use std::path::Path;

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::StoreError;

/// Format version of every value raft-store writes (the envelope's first
/// byte, and the store marker). Bump it when any stored encoding changes.
pub const FORMAT_VERSION: u8 = 2;

/// The tree of log entries, keyed by big-endian `u64` index.
pub(crate) const TREE_LOG: &str = "log";
/// The tree of the vote, committed id, purge marker and store marker.
pub(crate) const TREE_META: &str = "meta";
/// The tree of the latest snapshot (meta and data).
pub(crate) const TREE_SNAPSHOT: &str = "snapshot";
/// Key of the store marker in [`TREE_META`].
pub(crate) const KEY_FORMAT: &str = "format";

/// The one bincode configuration for stored records: the encoding of
/// `bincode::serialize`, refusing trailing bytes.
fn options() -> impl Options {
    bincode::DefaultOptions::new().with_fixint_encoding()
}

/// `value` in the envelope: version byte, then bincode.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    let mut out = vec![FORMAT_VERSION];
    options().serialize_into(&mut out, value)?;
    Ok(out)
}

/// A log entry in the envelope: version byte, the model's format byte
/// `model`, then bincode.
pub(crate) fn encode_entry<T: Serialize>(value: &T, model: u8) -> Result<Vec<u8>, bincode::Error> {
    let mut out = vec![FORMAT_VERSION, model];
    options().serialize_into(&mut out, value)?;
    Ok(out)
}

/// Decodes a log entry written by [`encode_entry`] with the model format
/// `model`; an entry of another model format is
/// [`StoreError::UnsupportedVersion`].
pub(crate) fn decode_entry<T: DeserializeOwned>(
    bytes: &[u8],
    model: u8,
    index: u64,
) -> Result<T, StoreError> {
    const WHAT: &str = "log entry";
    let body = decode_raw(bytes, WHAT, TREE_LOG, &index)?;
    match body.split_first() {
        Some((&found, rest)) if found == model => deserialize(rest, WHAT, TREE_LOG, &index),
        Some((&found, _)) => Err(StoreError::UnsupportedVersion {
            what: "log entry's model format",
            tree: TREE_LOG,
            key: index.to_string(),
            found,
            supported: model,
        }),
        None => Err(StoreError::Corrupt {
            what: WHAT,
            tree: TREE_LOG,
            key: index.to_string(),
            detail: "no model format byte".into(),
        }),
    }
}

/// Opaque bytes (snapshot data) in the envelope.
pub(crate) fn encode_raw(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(bytes);
    out
}

/// Decodes a value written by [`encode`]; `what`, `tree` and `key` name it
/// in the error.
pub(crate) fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    tree: &'static str,
    key: &dyn Display,
) -> Result<T, StoreError> {
    deserialize(decode_raw(bytes, what, tree, key)?, what, tree, key)
}

/// Bincode of `body`, all of it.
fn deserialize<T: DeserializeOwned>(
    body: &[u8],
    what: &'static str,
    tree: &'static str,
    key: &dyn Display,
) -> Result<T, StoreError> {
    // A limit of the body's length makes a garbled length prefix an error
    // instead of an allocation.
    options()
        .with_limit(body.len() as u64)
        .deserialize(body)
        .map_err(|e| StoreError::Corrupt {
            what,
            tree,
            key: key.to_string(),
            detail: e.to_string(),
        })
}

/// The payload of a value written by [`encode_raw`] (or [`encode`]), after
/// checking its version byte.
pub(crate) fn decode_raw<'a>(
    bytes: &'a [u8],
    what: &'static str,
    tree: &'static str,
    key: &dyn Display,
) -> Result<&'a [u8], StoreError> {
    match bytes.split_first() {
        Some((&FORMAT_VERSION, body)) => Ok(body),
        Some((&found, _)) => Err(StoreError::UnsupportedVersion {
            what,
            tree,
            key: key.to_string(),
            found,
            supported: FORMAT_VERSION,
        }),
        None => Err(StoreError::Corrupt {
            what,
            tree,
            key: key.to_string(),
            detail: "empty value (no format version byte)".into(),
        }),
    }
}

/// Checks the store marker of the database in `dir`, writing it (flushed)
/// into a database that holds nothing yet.
pub(crate) fn check_store(db: &DurableDb, dir: &Path) -> Result<(), StoreError> {
    let sled_err = |source| StoreError::Sled {
        path: dir.display().to_string(),
        source,
    };
    let meta = db.open_tree(TREE_META).map_err(sled_err)?;
    match meta.get(KEY_FORMAT).map_err(sled_err)? {
        Some(v) => match v.as_ref() {
            [FORMAT_VERSION] => Ok(()),
            [found] => Err(StoreError::UnsupportedVersion {
                what: "store format marker",
                tree: TREE_META,
                key: KEY_FORMAT.into(),
                found: *found,
                supported: FORMAT_VERSION,
            }),
            other => Err(StoreError::Corrupt {
                what: "store format marker",
                tree: TREE_META,
                key: KEY_FORMAT.into(),
                detail: format!("{} bytes where one version byte belongs", other.len()),
            }),
        },
        None => {
            let log = db.open_tree(TREE_LOG).map_err(sled_err)?;
            let snapshot = db.open_tree(TREE_SNAPSHOT).map_err(sled_err)?;
            if !(meta.is_empty() && log.is_empty() && snapshot.is_empty()) {
                return Err(StoreError::Unversioned {
                    path: dir.display().to_string(),
                });
            }
            meta.insert(KEY_FORMAT, &[FORMAT_VERSION][..])
                .map_err(sled_err)?;
            db.flush().map_err(sled_err)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::format::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Rec {
        term: u64,
        name: String,
    }

    fn rec() -> Rec {
        Rec {
            term: 7,
            name: "vote".into(),
        }
    }

    #[test]
    fn current_version_round_trips() {
        let bytes = encode(&rec()).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(&bytes[1..], bincode::serialize(&rec()).unwrap().as_slice());
        assert_eq!(decode::<Rec>(&bytes, "rec", "t", &"k").unwrap(), rec());
        let raw = encode_raw(b"model");
        assert_eq!(decode_raw(&raw, "data", "t", &"k").unwrap(), b"model");
    }

    #[test]
    fn another_version_is_refused_naming_the_place() {
        let mut bytes = encode(&rec()).unwrap();
        bytes[0] = FORMAT_VERSION + 1;
        let e = decode::<Rec>(&bytes, "log entry", "log", &42u64).unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::UnsupportedVersion { found, supported: FORMAT_VERSION, .. }
                    if found == FORMAT_VERSION + 1
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "stored log entry at log/42 has format version {}; this build reads only version {}",
                FORMAT_VERSION + 1,
                FORMAT_VERSION
            )
        );
    }

    #[test]
    fn empty_truncated_and_trailing_values_are_corrupt() {
        let bytes = encode(&rec()).unwrap();
        let mut long = bytes.clone();
        long.push(0);
        let mut huge_len = bytes.clone();
        // The string's length prefix claims 2^64 - 1 bytes.
        huge_len[9..17].copy_from_slice(&[0xff; 8]);
        for bad in [
            &[][..],
            &bytes[..1],
            &bytes[..bytes.len() - 1],
            &long,
            &huge_len,
        ] {
            let e = decode::<Rec>(bad, "vote", "meta", &"vote").unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
            assert!(
                e.to_string()
                    .starts_with("stored vote at meta/vote is corrupt"),
                "{e}"
            );
        }
        assert!(matches!(
            decode_raw(&[], "snapshot data", "snapshot", &"data"),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
