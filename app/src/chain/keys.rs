//! Keypair files in the Solana CLI format (a JSON array of 64 bytes), so a
//! wallet made with `solana-keygen` works here and ours works there.

use anyhow::{Context, Result, bail};
use solana_sdk::signature::Keypair;
use std::path::{Path, PathBuf};

/// `$COHORT_HOME`, else `~/.cohort`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("COHORT_HOME") {
        return PathBuf::from(h);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cohort")
}

pub fn load(path: &Path) -> Result<Keypair> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read keypair file {}", path.display()))?;
    let bytes: Vec<u8> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a keypair file (expected a JSON array of 64 bytes)",
            path.display()
        )
    })?;
    if bytes.len() != 64 {
        bail!(
            "{} holds {} bytes; a keypair file holds 64",
            path.display(),
            bytes.len()
        );
    }
    Keypair::try_from(bytes.as_slice())
        .with_context(|| format!("{} is not a valid ed25519 keypair", path.display()))
}

/// Loads `path`, or creates it with a fresh key when it does not exist.
pub fn load_or_create(path: &Path) -> Result<Keypair> {
    if path.exists() {
        return load(path);
    }
    let k = Keypair::new();
    save(path, &k)?;
    Ok(k)
}

/// Atomic (write, fsync, rename) and readable by the owner only.
pub fn save(path: &Path, k: &Keypair) -> Result<()> {
    let text = serde_json::to_string(&k.to_bytes().to_vec())?;
    let tmp = stage(path, text.as_bytes())?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Writes `bytes` next to `path` in a file only its owner can read, synced
/// to disk, and returns that file's path: renaming it over `path` is the
/// atomic commit (callers may first keep the old file, as the keystore does).
pub fn stage(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(tmp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use solana_sdk::signature::Signer;

    #[test]
    fn keypair_files_round_trip_and_bad_ones_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("cohort-keys-{}", std::process::id()));
        let p = dir.join("id.json");
        let k = load_or_create(&p).unwrap();
        assert_eq!(load(&p).unwrap().pubkey(), k.pubkey());
        std::fs::write(&p, "[1,2,3]").unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("holds 3 bytes"));
        std::fs::write(&p, "hello").unwrap();
        assert!(
            load(&p)
                .unwrap_err()
                .to_string()
                .contains("not a keypair file")
        );
        let e = load(&dir.join("missing.json")).unwrap_err().to_string();
        assert!(e.contains("cannot read keypair file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
