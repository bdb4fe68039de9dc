//! The error of opening or reading the store outside openraft's own calls
//! (inside them it is the source of openraft's `StorageError`).

/// Errors opening or reading the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled could not open or read the database.
    #[error("sled database error at {path}: {source}")]
    Sled {
        /// The directory that was being opened.
        path: String,
        /// The underlying sled error.
        #[source]
        source: sled::Error,
    },
    /// The model could not restore itself from the snapshot data, or the
    /// snapshot's data is missing although its meta is present.
    #[error("stored {what} could not be decoded: {detail}")]
    Decode {
        /// Which value (e.g. `snapshot data`).
        what: &'static str,
        /// Decoder message.
        detail: String,
    },
    /// A stored value carries a format version this build does not read
    /// (written by a newer railguard, or damaged in its first byte).
    #[error(
        "stored {what} at {tree}/{key} has format version {found}; \
         this build reads only version {supported}"
    )]
    UnsupportedVersion {
        /// Which value (e.g. `log entry`).
        what: &'static str,
        /// The sled tree holding it.
        tree: &'static str,
        /// Its key in that tree (a log index, or the key's name).
        key: String,
        /// The version byte found.
        found: u8,
        /// The version this build writes and reads.
        supported: u8,
    },
    /// A stored value is empty, truncated or garbled.
    #[error("stored {what} at {tree}/{key} is corrupt: {detail}")]
    Corrupt {
        /// Which value (e.g. `vote`).
        what: &'static str,
        /// The sled tree holding it.
        tree: &'static str,
        /// Its key in that tree (a log index, or the key's name).
        key: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The database holds data but no format marker: it was written before
    /// stored values carried a format version, and this build refuses it
    /// rather than misread it.
    #[error(
        "raft data directory {path} was written by a railguard without store format \
         versions and cannot be read by this build; restore it with the release that \
         wrote it, or remove this node from the cluster and add it back with an empty \
         directory"
    )]
    Unversioned {
        /// The directory that was being opened.
        path: String,
    },
}
