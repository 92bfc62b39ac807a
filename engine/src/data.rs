//! Training data: a byte-level corpus identified by its content hash, a
//! held-out validation split, and batches that anyone can recompute from the
//! epoch seed — who trained on what is public.

use crate::error::EngineError;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

const BUNDLED: &[u8] = include_bytes!("../data/kjv.txt.gz");
/// One twentieth of the corpus, at its end, is never trained on.
const VALIDATION_FRACTION: usize = 20;

#[derive(Debug, Clone)]
pub struct Corpus {
    bytes: Arc<Vec<u8>>,
    /// blake3 of the bytes: the job's dataset id.
    pub id: [u8; 32],
    split: usize,
    pub name: String,
}

impl Corpus {
    /// The bundled public-domain corpus (King James Bible, 4.1 MB).
    pub fn bundled() -> Result<Self, EngineError> {
        let mut out = Vec::with_capacity(4_200_000);
        flate2::read::GzDecoder::new(BUNDLED)
            .read_to_end(&mut out)
            .map_err(|e| EngineError::Data(format!("bundled corpus is corrupt: {e}")))?;
        Self::from_bytes(out, "kjv (bundled)")
    }

    /// A UTF-8 file, or a folder of them (read recursively in path order,
    /// joined by newlines, so the id does not depend on directory listing order).
    pub fn from_path(path: &Path) -> Result<Self, EngineError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| EngineError::Data(format!("{}: {e}", path.display())))?;
        let mut files = Vec::new();
        if meta.is_dir() {
            collect_files(path, &mut files)?;
            files.sort();
        } else {
            files.push(path.to_path_buf());
        }
        let mut bytes = Vec::new();
        for f in &files {
            let data =
                std::fs::read(f).map_err(|e| EngineError::Data(format!("{}: {e}", f.display())))?;
            std::str::from_utf8(&data).map_err(|e| {
                EngineError::Data(format!("{} is not UTF-8 text: {e}", f.display()))
            })?;
            if !bytes.is_empty() {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(&data);
        }
        Self::from_bytes(bytes, &path.display().to_string())
    }

    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Self, EngineError> {
        std::str::from_utf8(&bytes)
            .map_err(|e| EngineError::Data(format!("{name} is not UTF-8 text: {e}")))?;
        if bytes.len() < 4096 {
            return Err(EngineError::Data(format!(
                "{name} has {} bytes; at least 4096 are needed",
                bytes.len()
            )));
        }
        let id = *blake3::hash(&bytes).as_bytes();
        let split = bytes.len() - bytes.len() / VALIDATION_FRACTION;
        Ok(Self {
            bytes: Arc::new(bytes),
            id,
            split,
            name: name.to_string(),
        })
    }

    pub fn train(&self) -> &[u8] {
        &self.bytes[..self.split]
    }

    pub fn validation(&self) -> &[u8] {
        &self.bytes[self.split..]
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

fn collect_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<(), EngineError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| EngineError::Data(format!("{}: {e}", dir.display())))?;
    for e in entries {
        let p = e?.path();
        if p.is_dir() {
            collect_files(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

/// Which slice of the data member `member` trains on at `(epoch, step)`:
/// `batch` window starts in the training split, drawn from
/// `blake3(seed, epoch, step, member)`.
pub fn batch_offsets(
    seed: &[u8; 32],
    epoch: u32,
    step: u32,
    member: u32,
    batch: usize,
    seq_len: usize,
    train_len: usize,
) -> Vec<usize> {
    let mut h = blake3::Hasher::new_keyed(seed);
    h.update(b"cohort-batch-v1");
    h.update(&epoch.to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(&member.to_le_bytes());
    let mut xof = h.finalize_xof();
    let span = (train_len - seq_len - 1) as u64;
    (0..batch)
        .map(|_| {
            let mut b = [0u8; 8];
            xof.fill(&mut b);
            (u64::from_le_bytes(b) % span) as usize
        })
        .collect()
}

/// Inputs and next-byte targets for windows starting at `offsets`, row-major
/// `[offsets.len(), seq_len]`.
pub fn windows(data: &[u8], offsets: &[usize], seq_len: usize) -> (Vec<u8>, Vec<u8>) {
    let mut x = Vec::with_capacity(offsets.len() * seq_len);
    let mut y = Vec::with_capacity(offsets.len() * seq_len);
    for &o in offsets {
        x.extend_from_slice(&data[o..o + seq_len]);
        y.extend_from_slice(&data[o + 1..o + seq_len + 1]);
    }
    (x, y)
}

/// Fixed, evenly spaced validation windows: the same for every node and run.
pub fn validation_offsets(val_len: usize, seq_len: usize, count: usize) -> Vec<usize> {
    let span = val_len - seq_len - 1;
    (0..count).map(|i| i * span / count.max(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_corpus_has_a_stable_id_and_split() {
        let c = Corpus::bundled().unwrap();
        assert_eq!(c.len(), 4_153_205);
        assert!(c.train().starts_with(b"Genesis 1"));
        assert_eq!(c.train().len() + c.validation().len(), c.len());
        assert_eq!(
            c.id,
            *blake3::hash(&[c.train(), c.validation()].concat()).as_bytes()
        );
    }

    #[test]
    fn batches_are_recomputable_and_distinct_per_member() {
        let seed = [7u8; 32];
        let a = batch_offsets(&seed, 1, 2, 3, 8, 64, 10_000);
        assert_eq!(a, batch_offsets(&seed, 1, 2, 3, 8, 64, 10_000));
        assert_ne!(a, batch_offsets(&seed, 1, 2, 4, 8, 64, 10_000));
        assert_ne!(a, batch_offsets(&seed, 1, 3, 3, 8, 64, 10_000));
        assert!(a.iter().all(|&o| o + 65 <= 10_000));
    }

    #[test]
    fn folders_and_bad_input() {
        let dir = std::env::temp_dir().join(format!("cohort-data-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("b.txt"), "b".repeat(3000)).unwrap();
        std::fs::write(dir.join("sub/a.txt"), "a".repeat(3000)).unwrap();
        let c = Corpus::from_path(&dir).unwrap();
        assert_eq!(c.len(), 6001);
        assert!(
            c.train().starts_with(b"bbb"),
            "sorted by path: b.txt before sub/a.txt"
        );
        std::fs::write(dir.join("bad.bin"), [0xff, 0xfe, 0x00]).unwrap();
        let e = Corpus::from_path(&dir).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
        let e = Corpus::from_path(&dir.join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        assert!(
            Corpus::from_bytes(b"tiny".to_vec(), "tiny")
                .unwrap_err()
                .to_string()
                .contains("at least 4096")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
