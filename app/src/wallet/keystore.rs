//! The keystore: one JSON file holding the wallet's secret (its recovery
//! phrase, or an imported keypair) encrypted with XChaCha20-Poly1305 under
//! a key stretched from the passphrase by Argon2id.
//!
//! - Writes are atomic (temp file, fsync, rename), and the previous good
//!   file is kept as `<name>.bak`, so a crash or a bad disk never loses the
//!   only copy.
//! - A checksum over the file's fields tells corruption (fall back to the
//!   backup) apart from a wrong passphrase (the AEAD tag fails on intact
//!   bytes).
//! - Secrets live in `Zeroizing` buffers and are wiped when dropped.

use super::derive;
use crate::chain::keys;
use anyhow::{Context, Result, anyhow, bail};
use argon2::{Algorithm, Argon2, Params, Version};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use solana_sdk::signature::{Keypair, Signer};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

const VERSION: u8 = 1;

/// What the keystore protects.
pub enum Secret {
    /// A BIP39 phrase: the wallet is its first Solana account.
    Phrase(Zeroizing<String>),
    /// An imported keypair (Solana CLI file): 64 bytes.
    Keypair(Zeroizing<Vec<u8>>),
}

impl Secret {
    pub fn keypair(&self) -> Result<Keypair> {
        match self {
            Secret::Phrase(p) => derive::keypair_from_phrase(p, 0),
            Secret::Keypair(b) => {
                Keypair::try_from(b.as_slice()).map_err(|_| anyhow!("stored keypair is invalid"))
            }
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Secret::Phrase(_) => "phrase",
            Secret::Keypair(_) => "keypair",
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Secret::Phrase(p) => p.as_bytes(),
            Secret::Keypair(b) => b,
        }
    }
}

/// Argon2id cost. The default (64 MiB, 3 passes) takes well under a
/// second on a desktop; tests use a cheap one. Stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kdf {
    pub m_kib: u32,
    pub t: u32,
    pub p: u32,
}

impl Default for Kdf {
    fn default() -> Self {
        Self {
            m_kib: 64 * 1024,
            t: 3,
            p: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct File {
    version: u8,
    address: String,
    kind: String,
    kdf: Kdf,
    salt: String,
    nonce: String,
    ciphertext: String,
    /// blake3 of every field above: corruption, not a wrong passphrase.
    check: String,
}

impl File {
    fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(&[self.version]);
        for f in [
            &self.address,
            &self.kind,
            &self.salt,
            &self.nonce,
            &self.ciphertext,
        ] {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f.as_bytes());
        }
        for v in [self.kdf.m_kib, self.kdf.t, self.kdf.p] {
            h.update(&v.to_le_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    fn aad(&self) -> Vec<u8> {
        format!(
            "cohort-keystore-v{}:{}:{}",
            self.version, self.kind, self.address
        )
        .into_bytes()
    }
}

/// An opened keystore.
pub struct Unlocked {
    pub secret: Secret,
    pub address: String,
    /// The main file was damaged and the backup was used (and restored).
    pub recovered: bool,
}

fn key(pass: &str, salt: &[u8], kdf: Kdf) -> Result<Zeroizing<[u8; 32]>> {
    let params = Params::new(kdf.m_kib, kdf.t, kdf.p, Some(32))
        .map_err(|e| anyhow!("key derivation settings: {e}"))?;
    let mut out = Zeroizing::new([0u8; 32]);
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into(pass.as_bytes(), salt, &mut out[..])
        .map_err(|e| anyhow!("key derivation: {e}"))?;
    Ok(out)
}

pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".bak");
    path.with_file_name(name)
}

/// Encrypts `secret` under `pass` into `path`, keeping the previous good
/// file as the backup.
pub fn save(path: &Path, secret: &Secret, pass: &str, kdf: Kdf) -> Result<String> {
    if pass.chars().count() < 8 {
        bail!("the passphrase needs at least 8 characters");
    }
    let address = secret.keypair()?.pubkey().to_string();
    let mut salt = [0u8; 16];
    let mut nonce = [0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let mut file = File {
        version: VERSION,
        address: address.clone(),
        kind: secret.kind().into(),
        kdf,
        salt: B64.encode(salt),
        nonce: B64.encode(nonce),
        ciphertext: String::new(),
        check: String::new(),
    };
    let k = key(pass, &salt, kdf)?;
    let cipher = XChaCha20Poly1305::new_from_slice(&k[..]).map_err(|_| anyhow!("cipher key"))?;
    let aad = file.aad();
    let ct = cipher
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: secret.bytes(),
                aad: &aad,
            },
        )
        .map_err(|_| anyhow!("encryption failed"))?;
    file.ciphertext = B64.encode(ct);
    file.check = file.digest();
    let text = serde_json::to_vec_pretty(&file)?;
    let tmp = keys::stage(path, &text)?;
    // Keep the current file as the backup only if it is intact.
    if read(path).is_ok() {
        std::fs::rename(path, backup_path(path))
            .with_context(|| format!("backing up {}", path.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(address)
}

fn read(path: &Path) -> Result<File> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: File =
        serde_json::from_slice(&text).map_err(|_| anyhow!("{} is damaged", path.display()))?;
    if file.version != VERSION {
        bail!(
            "{} has keystore version {}, this build reads {VERSION}",
            path.display(),
            file.version
        );
    }
    if file.check != file.digest() {
        bail!("{} is damaged", path.display());
    }
    Ok(file)
}

fn open(file: &File, pass: &str) -> Result<Secret> {
    let salt = B64
        .decode(&file.salt)
        .map_err(|_| anyhow!("keystore salt"))?;
    let nonce = B64
        .decode(&file.nonce)
        .map_err(|_| anyhow!("keystore nonce"))?;
    let ct = B64
        .decode(&file.ciphertext)
        .map_err(|_| anyhow!("keystore ciphertext"))?;
    if nonce.len() != 24 {
        bail!("keystore nonce has the wrong length");
    }
    let k = key(pass, &salt, file.kdf)?;
    let cipher = XChaCha20Poly1305::new_from_slice(&k[..]).map_err(|_| anyhow!("cipher key"))?;
    let aad = file.aad();
    let plain = Zeroizing::new(
        cipher
            .decrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &ct,
                    aad: &aad,
                },
            )
            .map_err(|_| anyhow!("wrong passphrase"))?,
    );
    let secret = match file.kind.as_str() {
        "phrase" => Secret::Phrase(Zeroizing::new(
            String::from_utf8(plain.to_vec()).map_err(|_| anyhow!("stored phrase is not text"))?,
        )),
        "keypair" => Secret::Keypair(Zeroizing::new(plain.to_vec())),
        other => bail!("unknown secret kind `{other}`"),
    };
    if secret.keypair()?.pubkey().to_string() != file.address {
        bail!("keystore address does not match its secret");
    }
    Ok(secret)
}

/// Opens the keystore; if the main file is damaged, opens the backup and
/// restores it in place.
pub fn load(path: &Path, pass: &str) -> Result<Unlocked> {
    match read(path) {
        Ok(file) => Ok(Unlocked {
            secret: open(&file, pass)?,
            address: file.address,
            recovered: false,
        }),
        Err(main_err) => {
            let bak = backup_path(path);
            let Ok(file) = read(&bak) else {
                return Err(main_err);
            };
            let secret = open(&file, pass)?;
            // Keep the damaged file for inspection; put the good one back.
            let _ = std::fs::rename(path, path.with_extension("damaged"));
            std::fs::copy(&bak, path).with_context(|| format!("restoring {}", path.display()))?;
            Ok(Unlocked {
                secret,
                address: file.address,
                recovered: true,
            })
        }
    }
}

pub fn exists(path: &Path) -> bool {
    path.exists() || backup_path(path).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHEAP: Kdf = Kdf {
        m_kib: 256,
        t: 1,
        p: 1,
    };

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cohort-ks-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_phrase_round_trips_and_a_wrong_passphrase_fails_cleanly() {
        let d = dir("rt");
        let p = d.join("wallet.json");
        let phrase =
            derive::parse_phrase("all all all all all all all all all all all all").unwrap();
        let addr = save(&p, &Secret::Phrase(phrase), "correct horse", CHEAP).unwrap();
        assert_eq!(addr, "14CCvQzQzHCVgZM3j9soPnXuJXh1RmCfwLVUcdfbZVBS");
        let u = load(&p, "correct horse").unwrap();
        assert_eq!(u.address, addr);
        assert!(!u.recovered);
        assert_eq!(u.secret.keypair().unwrap().pubkey().to_string(), addr);
        let e = load(&p, "wrong horse!").err().unwrap().to_string();
        assert_eq!(e, "wrong passphrase");
        assert!(
            save(&p, &u.secret, "short", CHEAP)
                .unwrap_err()
                .to_string()
                .contains("at least 8")
        );
        // The secret is not in the file in the clear.
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.contains("all all"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_corrupted_file_is_detected_and_the_previous_good_copy_is_used() {
        let d = dir("bad");
        let p = d.join("wallet.json");
        let first = Keypair::new();
        save(
            &p,
            &Secret::Keypair(Zeroizing::new(first.to_bytes().to_vec())),
            "passphrase1",
            CHEAP,
        )
        .unwrap();
        let second = Keypair::new();
        save(
            &p,
            &Secret::Keypair(Zeroizing::new(second.to_bytes().to_vec())),
            "passphrase1",
            CHEAP,
        )
        .unwrap();
        // One flipped character in the ciphertext: damaged, not a wrong passphrase.
        let mut text = std::fs::read_to_string(&p).unwrap();
        let at = text.find("\"ciphertext\": \"").unwrap() + 16;
        let c = if &text[at..at + 1] == "A" { "B" } else { "A" };
        text.replace_range(at..at + 1, c);
        std::fs::write(&p, text).unwrap();
        let u = load(&p, "passphrase1").unwrap();
        assert!(u.recovered);
        assert_eq!(u.address, first.pubkey().to_string());
        // Restored in place: the next open needs no recovery.
        assert!(!load(&p, "passphrase1").unwrap().recovered);
        // Truncated with no backup left: a clear error, not a panic.
        std::fs::remove_file(backup_path(&p)).unwrap();
        std::fs::write(&p, "{\"version\":").unwrap();
        assert!(
            load(&p, "passphrase1")
                .err()
                .unwrap()
                .to_string()
                .contains("damaged")
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
