//! `cohort wallet new|import|address|export-keypair`: the keystore from the
//! command line, for servers and for people who prefer a terminal. The
//! passphrase comes from `COHORT_PASSPHRASE` (never from a flag, which
//! would land in shell history).

use super::derive;
use super::keystore::{self, Kdf, Secret};
use crate::chain::keys;
use crate::cli::Flags;
use anyhow::{Context, Result, anyhow, bail};
use solana_sdk::signature::Signer;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

pub const USAGE: &str = "\
Usage (the passphrase is read from COHORT_PASSPHRASE):
  cohort wallet new [--words 12|24] [--file PATH]      create a wallet; shows its phrase once
  cohort wallet import --phrase-file F [--file PATH]   from a 12/24-word recovery phrase
  cohort wallet import --keypair F [--file PATH]       from a Solana CLI keypair file
  cohort wallet address [--file PATH]                  unlock and print the address
  cohort wallet export-keypair OUT [--file PATH]       write a Solana CLI keypair file (for `cohort node --keypair`)
The wallet file defaults to ~/.cohort/wallet.json.
";

fn passphrase() -> Result<Zeroizing<String>> {
    std::env::var("COHORT_PASSPHRASE")
        .map(Zeroizing::new)
        .map_err(|_| anyhow!("set COHORT_PASSPHRASE to the wallet's passphrase"))
}

fn file(f: &Flags) -> PathBuf {
    f.str("file")
        .map(PathBuf::from)
        .unwrap_or_else(|| keys::home().join("wallet.json"))
}

/// Never overwrites a wallet: its phrase may exist nowhere else.
fn must_be_new(path: &Path) -> Result<()> {
    if keystore::exists(path) {
        bail!(
            "{} already holds a wallet; pass another --file",
            path.display()
        );
    }
    Ok(())
}

/// Creates a wallet; returns (address, phrase).
pub fn create(path: &Path, words: usize, pass: &str) -> Result<(String, Zeroizing<String>)> {
    must_be_new(path)?;
    let phrase = derive::new_phrase(words)?;
    let addr = keystore::save(path, &Secret::Phrase(phrase.clone()), pass, Kdf::default())?;
    Ok((addr, phrase))
}

pub fn import_phrase(path: &Path, phrase: &str, pass: &str) -> Result<String> {
    must_be_new(path)?;
    let phrase = derive::parse_phrase(phrase)?;
    keystore::save(path, &Secret::Phrase(phrase), pass, Kdf::default())
}

pub fn import_keypair(path: &Path, keypair: &Path, pass: &str) -> Result<String> {
    must_be_new(path)?;
    let k = keys::load(keypair)?;
    keystore::save(
        path,
        &Secret::Keypair(Zeroizing::new(k.to_bytes().to_vec())),
        pass,
        Kdf::default(),
    )
}

pub fn main(args: &[String]) -> Result<()> {
    let Some(cmd) = args.first() else {
        print!("{USAGE}");
        return Ok(());
    };
    let rest = &args[1..];
    match cmd.as_str() {
        "new" => {
            let f = Flags::parse(rest, "cohort wallet new", &["words", "file"])?;
            let words: usize = f.get("words")?.unwrap_or(12);
            let (addr, phrase) = create(&file(&f), words, &passphrase()?)?;
            println!("wallet {addr} created in {}", file(&f).display());
            println!(
                "recovery phrase (write it down; it is not shown again):\n  {}",
                *phrase
            );
            Ok(())
        }
        "import" => {
            let f = Flags::parse(
                rest,
                "cohort wallet import",
                &["phrase-file", "keypair", "file"],
            )?;
            let pass = passphrase()?;
            let addr = match (f.str("phrase-file"), f.str("keypair")) {
                (Some(p), None) => {
                    let text = Zeroizing::new(
                        std::fs::read_to_string(p).with_context(|| format!("cannot read {p}"))?,
                    );
                    import_phrase(&file(&f), &text, &pass)?
                }
                (None, Some(k)) => import_keypair(&file(&f), Path::new(k), &pass)?,
                _ => bail!("pass exactly one of --phrase-file or --keypair"),
            };
            println!("wallet {addr} imported into {}", file(&f).display());
            Ok(())
        }
        "address" => {
            let f = Flags::parse(rest, "cohort wallet address", &["file"])?;
            let u = keystore::load(&file(&f), &passphrase()?)?;
            if u.recovered {
                eprintln!("note: the wallet file was damaged; the previous good copy was restored");
            }
            println!("{}", u.address);
            Ok(())
        }
        "export-keypair" => {
            let f = Flags::parse(rest, "cohort wallet export-keypair", &["file"])?;
            let [out] = f.words.as_slice() else {
                bail!("usage: cohort wallet export-keypair OUT [--file PATH]");
            };
            let u = keystore::load(&file(&f), &passphrase()?)?;
            let k = u.secret.keypair()?;
            keys::save(Path::new(out), &k)?;
            println!("wrote {} for {}", out, k.pubkey());
            Ok(())
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown wallet command `{other}`; run `cohort wallet help`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wallets_are_created_imported_and_never_overwritten() {
        let d = std::env::temp_dir().join(format!("cohort-wcli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let w = d.join("wallet.json");
        let (addr, phrase) = create(&w, 24, "a long passphrase").unwrap();
        assert_eq!(phrase.split(' ').count(), 24);
        assert_eq!(
            keystore::load(&w, "a long passphrase").unwrap().address,
            addr
        );
        let e = create(&w, 12, "a long passphrase").unwrap_err().to_string();
        assert!(e.contains("already holds a wallet"), "{e}");
        // The same phrase imported elsewhere is the same wallet.
        let again = import_phrase(
            &d.join("b.json"),
            &format!("  {}\n", phrase.to_uppercase()),
            "another pass",
        )
        .unwrap();
        assert_eq!(again, addr);
        // A Solana CLI keypair file round-trips through the keystore.
        let kp = d.join("id.json");
        let k = keys::load_or_create(&kp).unwrap();
        let imported = import_keypair(&d.join("c.json"), &kp, "third passphrase").unwrap();
        assert_eq!(imported, k.pubkey().to_string());
        let e = import_phrase(&d.join("d.json"), "not a phrase at all", "passphrase!").unwrap_err();
        assert!(e.to_string().contains("invalid recovery phrase"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
