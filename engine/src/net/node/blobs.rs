//! The step-keyed blobs a node serves (its states for joiners, its momenta
//! for audits), each about a model's size: large ones live in files, so a
//! node's memory stays a small multiple of the model however many it keeps.

use crate::net::msg::{self, Response};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

enum Held {
    Memory(Arc<Vec<u8>>),
    /// An open file; `path` is None where the file was unlinked once
    /// written (Unix), so it disappears with the process however it ends.
    File {
        file: std::fs::File,
        path: Option<PathBuf>,
        len: u64,
    },
}

/// Blobs by step, in memory below `spill_above` bytes and on disk from
/// there on. Files are a cache of what the node would otherwise hold in
/// RAM: on Unix each is unlinked as soon as it is written and read through
/// its open handle, so even a killed node leaves none behind; elsewhere
/// they are removed when pruned or when the store is dropped.
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
                Ok((file, path)) => Held::File {
                    file,
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

    fn write(&self, step: u32, blob: &[u8]) -> std::io::Result<(std::fs::File, Option<PathBuf>)> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("{step}.bin"));
        let written = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|mut f| f.write_all(blob).map(|()| f));
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                // A half-written file (a full disk) must not stay behind.
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        if cfg!(unix) && std::fs::remove_file(&path).is_ok() {
            return Ok((file, None));
        }
        Ok((file, Some(path)))
    }

    pub(super) fn contains(&self, step: u32) -> bool {
        self.held.contains_key(&step)
    }

    /// The whole blob kept for `step`; None when none is, or its file can
    /// no longer be read.
    pub(super) fn read(&self, step: u32) -> Option<Vec<u8>> {
        match self.held.get(&step)? {
            Held::Memory(b) => Some(b.to_vec()),
            Held::File { file, len, .. } => {
                let mut out = vec![0; *len as usize];
                read_at(file, 0, &mut out)
                    .inspect_err(|e| tracing::warn!(step, "kept blob unreadable: {e}"))
                    .ok()
                    .map(|()| out)
            }
        }
    }

    /// The part of `step`'s blob that starts at `offset`, as served.
    pub(super) fn part(&self, step: u32, offset: u64) -> Response {
        match self.held.get(&step) {
            Some(Held::Memory(b)) => part_of(b, offset),
            Some(Held::File { file, len, .. }) if offset <= *len => {
                let n = (*len - offset).min(msg::PART as u64) as usize;
                let mut chunk = vec![0; n];
                match read_at(file, offset, &mut chunk) {
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
        if let Some(Held::File {
            path: Some(path), ..
        }) = self.held.remove(&step)
        {
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

/// Reads `out.len()` bytes of `file` from `offset` (one thread owns the
/// store, so the shared cursor is never raced).
fn read_at(mut file: &std::fs::File, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(out)
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
        let on_disk = |s: &BlobStore, step| matches!(s.held.get(&step), Some(Held::File { .. }));
        assert!(on_disk(&disk, 3), "a blob over the limit is on disk");
        assert!(!on_disk(&disk, 4), "one under it is not");
        if cfg!(unix) {
            assert!(
                !disk.dir.join("3.bin").exists(),
                "unlinked once written: a killed node leaves no file"
            );
        }
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
    fn pruning_drops_blobs_and_leaves_no_file_behind() {
        let mut s = BlobStore::new("test", 0);
        for step in 0..6 {
            s.insert(step, blob(10, step as u8));
        }
        s.keep_latest(4);
        assert!(!s.contains(1) && s.contains(2));
        s.retain(|step| step <= 3);
        assert_eq!(s.held.len(), 2);
        assert_eq!(s.read(3).as_deref(), Some(&blob(10, 3)[..]));
        s.insert(3, blob(12, 9));
        assert_eq!(s.read(3).map(|b| b.len()), Some(12), "replaced");
        s.clear();
        assert!(s.held.is_empty());
        let left = std::fs::read_dir(&s.dir).map_or(0, |d| d.count());
        assert_eq!(left, 0, "no file outlives its blob");
    }
}
