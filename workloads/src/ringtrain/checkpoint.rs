//! Checkpoint files: `<dir>/step-<N>/rank-<r>.ckpt`.
//!
//! Layout (little-endian): the 8-byte magic `RGCKPT\0\1`, then the run's
//! identity (seed, input, hidden, output, batch, world, rank, learning
//! rate and momentum as f32 bits), the step, the data cursor, the
//! parameter count, the parameters, the momentum buffer, and a CRC32 of
//! everything before it. A file is written to a temporary name, fsync'd,
//! renamed into place, and the directories are fsync'd, so a crash leaves
//! either the whole file or none. Loading checks the size, the CRC and
//! every identity field, and names the first field that differs.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::model::Shape;

const MAGIC: &[u8; 8] = b"RGCKPT\0\x01";
/// Bytes before the parameters.
const HEAD: usize = 8 + 8 + 4 * 8 + 8 + 8 + 8;

/// What must match for a checkpoint to belong to this run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Identity {
    pub seed: u64,
    pub shape: Shape,
    pub batch: u32,
    pub world: u32,
    pub rank: u32,
    pub lr: f32,
    pub momentum: f32,
}

/// A rank's training state at a step boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// Steps completed.
    pub step: u64,
    /// Next data position (the step of the next batch).
    pub cursor: u64,
    pub params: Vec<f32>,
    pub velocity: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or durably writing the checkpoint file failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a whole checkpoint of this shape (bad magic,
    /// wrong length, CRC mismatch); the run must not resume from it.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The checkpoint is intact but of another run (`field` of its
    /// identity differs): a configuration error.
    #[error(
        "checkpoint {path} belongs to another run: {field} is {found}, this run has {expected}"
    )]
    Mismatch {
        path: PathBuf,
        field: &'static str,
        found: String,
        expected: String,
    },
}

/// `<dir>/step-<step>/rank-<rank>.ckpt`.
pub fn path(dir: &Path, step: u64, rank: u32) -> PathBuf {
    dir.join(format!("step-{step}"))
        .join(format!("rank-{rank}.ckpt"))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn file_len(params: usize) -> usize {
    HEAD + 8 * params + 4
}

/// Serialises `state` (no I/O).
pub fn encode(id: &Identity, state: &State) -> Vec<u8> {
    let n = state.params.len();
    assert_eq!(n, state.velocity.len(), "momentum length");
    let mut b = Vec::with_capacity(file_len(n));
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&id.seed.to_le_bytes());
    for v in [
        id.shape.input as u32,
        id.shape.hidden as u32,
        id.shape.output as u32,
        id.batch,
        id.world,
        id.rank,
        id.lr.to_bits(),
        id.momentum.to_bits(),
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&state.step.to_le_bytes());
    b.extend_from_slice(&state.cursor.to_le_bytes());
    b.extend_from_slice(&(n as u64).to_le_bytes());
    for v in state.params.iter().chain(&state.velocity) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Parses and checks a checkpoint's bytes against this run.
pub fn decode(
    path: &Path,
    bytes: &[u8],
    id: &Identity,
    step: u64,
) -> Result<State, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mismatch = |field: &'static str, found: String, expected: String| {
        Err(CheckpointError::Mismatch {
            path: path.to_path_buf(),
            field,
            found,
            expected,
        })
    };
    if bytes.len() < HEAD + 4 || &bytes[..8] != MAGIC {
        return Err(corrupt(
            "not a ringtrain checkpoint (bad magic or too short)".into(),
        ));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let crc = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8"));
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4"));
    let seed = u64_at(8);
    if seed != id.seed {
        return mismatch("seed", seed.to_string(), id.seed.to_string());
    }
    let fields: [(&'static str, u32, u32); 6] = [
        ("input", u32_at(16), id.shape.input as u32),
        ("hidden", u32_at(20), id.shape.hidden as u32),
        ("output", u32_at(24), id.shape.output as u32),
        ("batch", u32_at(28), id.batch),
        ("world size", u32_at(32), id.world),
        ("rank", u32_at(36), id.rank),
    ];
    for (field, found, expected) in fields {
        if found != expected {
            return mismatch(field, found.to_string(), expected.to_string());
        }
    }
    let (lr, mu) = (f32::from_bits(u32_at(40)), f32::from_bits(u32_at(44)));
    if lr.to_bits() != id.lr.to_bits() {
        return mismatch("learning rate", lr.to_string(), id.lr.to_string());
    }
    if mu.to_bits() != id.momentum.to_bits() {
        return mismatch("momentum", mu.to_string(), id.momentum.to_string());
    }
    let (found_step, cursor, n) = (u64_at(48), u64_at(56), u64_at(64));
    if found_step != step {
        return mismatch("step", found_step.to_string(), step.to_string());
    }
    let want = id.shape.params();
    if n != want as u64 || bytes.len() != file_len(want) {
        return Err(corrupt(format!(
            "{} bytes for {n} parameters; this shape has {want} ({} bytes)",
            bytes.len(),
            file_len(want)
        )));
    }
    if cursor != found_step {
        return Err(corrupt(format!(
            "data cursor {cursor} does not match step {found_step}"
        )));
    }
    let floats = |at: usize| -> Vec<f32> {
        body[at..at + 4 * want]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect()
    };
    Ok(State {
        step: found_step,
        cursor,
        params: floats(HEAD),
        velocity: floats(HEAD + 4 * want),
    })
}

fn fsync_dir(dir: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Writes `state` durably to [`path`]`(dir, state.step, id.rank)` and
/// returns that path.
pub fn write(dir: &Path, id: &Identity, state: &State) -> Result<PathBuf, CheckpointError> {
    let target = path(dir, state.step, id.rank);
    let step_dir = target.parent().expect("has a parent").to_path_buf();
    let new_dir = !step_dir.exists();
    std::fs::create_dir_all(&step_dir).map_err(io(&step_dir))?;
    if new_dir {
        fsync_dir(dir)?;
    }
    let tmp = step_dir.join(format!("rank-{}.ckpt.tmp-{}", id.rank, std::process::id()));
    let bytes = encode(id, state);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&target)(e));
    }
    fsync_dir(&step_dir)?;
    Ok(target)
}

/// Loads this rank's checkpoint at `step` from `dir`.
pub fn load(dir: &Path, id: &Identity, step: u64) -> Result<State, CheckpointError> {
    let p = path(dir, step, id.rank);
    let meta = std::fs::metadata(&p).map_err(io(&p))?;
    let want = file_len(id.shape.params()) as u64;
    if meta.len() != want {
        return Err(CheckpointError::Corrupt {
            path: p,
            reason: format!(
                "{} bytes; a checkpoint of this shape has {want} (another shape, or truncated)",
                meta.len()
            ),
        });
    }
    let bytes = std::fs::read(&p).map_err(io(&p))?;
    decode(&p, &bytes, id, step)
}

#[cfg(test)]
mod tests {
    use crate::ringtrain::checkpoint::*;

    fn id() -> Identity {
        Identity {
            seed: 3,
            shape: Shape::new(8),
            batch: 4,
            world: 3,
            rank: 1,
            lr: 0.05,
            momentum: 0.9,
        }
    }

    fn state(step: u64) -> State {
        let n = id().shape.params();
        State {
            step,
            cursor: step,
            params: (0..n).map(|i| i as f32 * 0.25 - 3.0).collect(),
            velocity: (0..n).map(|i| -(i as f32) / 7.0).collect(),
        }
    }

    #[test]
    fn round_trip_is_exact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(dir.path(), &id(), &state(12)).expect("write");
        assert_eq!(p, dir.path().join("step-12").join("rank-1.ckpt"));
        let back = load(dir.path(), &id(), 12).expect("load");
        assert_eq!(back, state(12));
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("step-12"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("rank-1.ckpt")]);
    }

    #[test]
    fn a_flipped_bit_is_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(dir.path(), &id(), &state(5)).expect("write");
        let mut bytes = std::fs::read(&p).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        std::fs::write(&p, &bytes).expect("write");
        let e = load(dir.path(), &id(), 5).expect_err("corrupt");
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("checksum"), "{e}");
    }

    #[test]
    fn a_truncated_file_is_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(dir.path(), &id(), &state(5)).expect("write");
        let bytes = std::fs::read(&p).expect("read");
        std::fs::write(&p, &bytes[..bytes.len() - 9]).expect("write");
        let e = load(dir.path(), &id(), 5).expect_err("truncated");
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
    }

    #[test]
    fn another_runs_checkpoint_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), &id(), &state(5)).expect("write");
        let mut other = id();
        other.seed = 4;
        let e = load(dir.path(), &other, 5).expect_err("seed");
        assert!(e.to_string().contains("seed is 3, this run has 4"), "{e}");
        let mut other = id();
        other.batch = 5;
        let e = load(dir.path(), &other, 5).expect_err("batch");
        assert!(e.to_string().contains("batch is 4"), "{e}");
        let mut other = id();
        other.lr = 0.1;
        let e = load(dir.path(), &other, 5).expect_err("lr");
        assert!(e.to_string().contains("learning rate"), "{e}");
        // Another shape: a different size, refused before reading it all.
        let mut other = id();
        other.shape = Shape::new(9);
        let e = load(dir.path(), &other, 5).expect_err("shape");
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
        // Decoding the bytes directly names the field.
        let bytes = encode(&id(), &state(5));
        let e = decode(Path::new("x"), &bytes, &other, 5).expect_err("hidden");
        assert!(e.to_string().contains("hidden is 8, this run has 9"), "{e}");
        // A file under the wrong step directory.
        let e = decode(Path::new("x"), &bytes, &id(), 6).expect_err("step");
        assert!(e.to_string().contains("step is 5"), "{e}");
        // A missing file is an I/O error naming the path.
        let e = load(dir.path(), &id(), 7).expect_err("missing");
        assert!(e.to_string().contains("step-7"), "{e}");
    }
}
