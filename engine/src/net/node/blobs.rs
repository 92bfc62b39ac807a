//! The step-keyed blobs a node serves (its states for joiners, its momenta
//! for audits), each about a model's size: large ones live in files, so a
//! node's memory stays a small multiple of the model however many it keeps.

use crate::net::msg::{self, Response};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

enum Held {
    Memory(Arc<Vec<u8>>),
    File { path: PathBuf, len: u64 },
}

/// Blobs by step, in memory below `spill_above` bytes and on disk from
/// there on. Files are a cache of what the node would otherwise hold in
/// RAM: removed when pruned or when the store is dropped, and never read
/// back after a crash.
pub(super) struct BlobStore {
    spill_above: usize,
    dir: PathBuf,
    held: BTreeMap<u32, Held>,
}

/// Tells apart the stores of several nodes in one process.
static NEXT_STORE: AtomicU64 = AtomicU64::new(0);

impl BlobStore {
    pub(super) fn new(kind: &str, spill_above: usize) -> Self {
        let n = NEXT_STORE.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cohort-{kind}-{}-{n}", std::process::id()));
        Self {
            spill_above,
            dir,
            held: BTreeMap::new(),
        }
    }

    /// Keeps `blob` for `step`, replacing what was there. A blob that
    /// cannot be written to disk is kept in memory (and logged): serving
    /// it matters more than the memory.
    pub(super) fn insert(&mut self, step: u32, blob: Arc<Vec<u8>>) {
        self.remove(step);
        let held = if blob.len() >= self.spill_above {
            match self.write(step, &blob) {
                Ok(path) => Held::File {
                    path,
                    len: blob.len() as u64,
                },
                Err(e) => {
                    tracing::warn!(step, dir = %self.dir.display(), "blob kept in memory: {e}");
                    Held::Memory(blob)
                }
            }
        } else {
            Held::Memory(blob)
        };
        self.held.insert(step, held);
    }

    fn write(&self, step: u32, blob: &[u8]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("{step}.bin"));
        std::fs::write(&path, blob)?;
        Ok(path)
    }

    pub(super) fn contains(&self, step: u32) -> bool {
        self.held.contains_key(&step)
    }

    /// The whole blob kept for `step`; None when none is, or its file can
    /// no longer be read.
    pub(super) fn read(&self, step: u32) -> Option<Vec<u8>> {
        match self.held.get(&step)? {
            Held::Memory(b) => Some(b.to_vec()),
            Held::File { path, .. } => std::fs::read(path)
                .inspect_err(|e| tracing::warn!(step, "kept blob unreadable: {e}"))
                .ok(),
        }
    }

    /// The part of `step`'s blob that starts at `offset`, as served.
    pub(super) fn part(&self, step: u32, offset: u64) -> Response {
        match self.held.get(&step) {
            Some(Held::Memory(b)) => part_of(b, offset),
            Some(Held::File { path, len }) if offset <= *len => {
                let n = (*len - offset).min(msg::PART as u64) as usize;
                let mut chunk = vec![0; n];
                let read = std::fs::File::open(path).and_then(|mut f| {
                    f.seek(SeekFrom::Start(offset))?;
                    f.read_exact(&mut chunk)
                });
                match read {
                    Ok(()) => Response::Part {
                        total: *len,
                        offset,
                        chunk,
                    },
                    Err(e) => {
                        tracing::warn!(step, "kept blob unreadable: {e}");
                        Response::NotFound
                    }
                }
            }
            _ => Response::NotFound,
        }
    }

    fn remove(&mut self, step: u32) {
        if let Some(Held::File { path, .. }) = self.held.remove(&step) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Keeps only the steps `keep` says yes to.
    pub(super) fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        let gone: Vec<u32> = self.held.keys().copied().filter(|s| !keep(*s)).collect();
        for s in gone {
            self.remove(s);
        }
    }

    /// Drops the oldest blobs until at most `n` are kept.
    pub(super) fn keep_latest(&mut self, n: usize) {
        while self.held.len() > n {
            let Some(&first) = self.held.keys().next() else {
                break;
            };
            self.remove(first);
        }
    }

    pub(super) fn clear(&mut self) {
        self.retain(|_| false);
    }
}

impl Drop for BlobStore {
    fn drop(&mut self) {
        self.clear();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The part of `blob` that starts at `offset`.
pub(super) fn part_of(blob: &[u8], offset: u64) -> Response {
    if offset > blob.len() as u64 {
        return Response::NotFound;
    }
    let start = offset as usize;
    let end = (start + msg::PART).min(blob.len());
    Response::Part {
        total: blob.len() as u64,
        offset,
        chunk: blob[start..end].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(len: usize, seed: u8) -> Arc<Vec<u8>> {
        Arc::new(
            (0..len)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect(),
        )
    }

    /// Reassembles `step`'s blob from its parts, as a downloader does.
    fn download(store: &BlobStore, step: u32) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            match store.part(step, out.len() as u64) {
                Response::Part {
                    total,
                    offset,
                    chunk,
                } => {
                    assert_eq!(offset, out.len() as u64);
                    assert!(chunk.len() == msg::PART || offset + chunk.len() as u64 == total);
                    out.extend_from_slice(&chunk);
                    if out.len() as u64 == total {
                        return out;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn large_blobs_go_to_disk_and_are_served_part_by_part_as_in_memory() {
        let mut disk = BlobStore::new("test", 1000);
        let big = blob(2 * msg::PART + 17, 1);
        let small = blob(999, 2);
        disk.insert(3, big.clone());
        disk.insert(4, small.clone());
        let file = disk.dir.join("3.bin");
        assert!(file.exists(), "a blob over the limit is on disk");
        assert!(!disk.dir.join("4.bin").exists(), "one under it is not");
        assert_eq!(download(&disk, 3), *big);
        assert_eq!(download(&disk, 4), *small);
        assert_eq!(disk.read(3).as_deref(), Some(&big[..]));
        assert_eq!(disk.part(3, big.len() as u64 + 1), Response::NotFound);
        assert_eq!(disk.part(5, 0), Response::NotFound);
        let dir = disk.dir.clone();
        drop(disk);
        assert!(!dir.exists(), "the files go with the store");
    }

    #[test]
    fn pruning_removes_the_files_of_the_blobs_it_drops() {
        let mut s = BlobStore::new("test", 0);
        for step in 0..6 {
            s.insert(step, blob(10, step as u8));
        }
        s.keep_latest(4);
        assert!(!s.contains(1) && s.contains(2));
        assert!(!s.dir.join("1.bin").exists());
        s.retain(|step| step <= 3);
        assert_eq!(s.held.len(), 2);
        assert!(!s.dir.join("4.bin").exists() && s.dir.join("3.bin").exists());
        s.insert(3, blob(12, 9));
        assert_eq!(s.read(3).map(|b| b.len()), Some(12), "replaced");
        s.clear();
        assert!(s.held.is_empty());
        assert!(!s.dir.join("3.bin").exists());
    }
}
