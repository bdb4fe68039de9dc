//! The error of opening or reading the store outside openraft's own calls.

/// Errors opening or reading the store outside openraft's own calls.
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
    /// A stored value could not be decoded (corruption or a format change).
    #[error("stored {what} could not be decoded: {detail}")]
    Decode {
        /// Which value (e.g. `snapshot data`).
        what: &'static str,
        /// Decoder message.
        detail: String,
    },
}
