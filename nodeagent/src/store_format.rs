//! Format versions of the agent's sled trees, kept in the outbox
//! database's `meta` tree under `format/<tree>` (bincode `u32`).
//!
//! A tree is opened with the version this agent writes: a tree with no
//! version yet is stamped (empty) or reported as format 1 (written before
//! versions were kept, for the caller to migrate); a version this agent
//! does not know is an error naming the tree and the database, never a
//! silent default.

/// The tree holding the versions.
const META_TREE: &str = "meta";

/// A tree's format could not be established.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The database could not be read or written.
    #[error("database {path}: format of tree `{tree}`: {source}")]
    Sled {
        /// The database directory.
        path: String,
        /// The tree whose format was asked for.
        tree: String,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// The stored version is not one this agent reads.
    #[error("database {path}: tree `{tree}` has format {found}; this agent reads {known:?}")]
    Unknown {
        /// The database directory.
        path: String,
        /// The tree.
        tree: String,
        /// The version found (`None`: the record is not a version).
        found: String,
        /// The versions this agent reads.
        known: Vec<u32>,
    },
}

fn key(tree: &str) -> Vec<u8> {
    format!("format/{tree}").into_bytes()
}

/// How a sled error on `tree` of the database at `path` reads.
fn sled_err<'a>(path: &'a str, tree: &'a str) -> impl Fn(sled::Error) -> FormatError + 'a {
    move |source| FormatError::Sled {
        path: path.to_owned(),
        tree: tree.to_owned(),
        source,
    }
}

/// The versions' tree of `db`, and the name of `tree`.
fn meta_of(
    db: &sled::Db,
    path: &str,
    tree: &sled::Tree,
) -> Result<(sled::Tree, String), FormatError> {
    let name = String::from_utf8_lossy(&tree.name()).into_owned();
    let meta = db.open_tree(META_TREE).map_err(sled_err(path, &name))?;
    Ok((meta, name))
}

/// The format of `tree` in `db` (at `path`): `current` if stamped so or
/// if the tree is empty and unstamped (it is stamped now), 1 if it holds
/// records but no stamp. Any stamp outside `known` is an error.
pub fn open(
    db: &sled::Db,
    path: &str,
    tree: &sled::Tree,
    current: u32,
    known: &[u32],
) -> Result<u32, FormatError> {
    let (meta, name) = meta_of(db, path, tree)?;
    let unknown = |found: String| FormatError::Unknown {
        path: path.to_owned(),
        tree: name.clone(),
        found,
        known: known.to_vec(),
    };
    match meta.get(key(&name)).map_err(sled_err(path, &name))? {
        Some(b) => {
            let v: u32 = bincode::deserialize(&b).map_err(|_| unknown(format!("{b:?}")))?;
            if known.contains(&v) {
                Ok(v)
            } else {
                Err(unknown(v.to_string()))
            }
        }
        None if tree.is_empty() => {
            stamp(db, path, tree, current)?;
            Ok(current)
        }
        None => Ok(1),
    }
}

/// Records that `tree` now holds format `version` (after a migration).
pub fn stamp(
    db: &sled::Db,
    path: &str,
    tree: &sled::Tree,
    version: u32,
) -> Result<(), FormatError> {
    let (meta, name) = meta_of(db, path, tree)?;
    let b = bincode::serialize(&version).expect("a u32 encodes");
    meta.insert(key(&name), b).map_err(sled_err(path, &name))?;
    Ok(())
}
