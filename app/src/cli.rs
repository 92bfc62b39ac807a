//! Flags shared by the headless commands: which chain, which wallet.

use crate::chain::{Chain, keys};
use anyhow::{Context, Result, anyhow, bail};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::Keypair;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

pub const DEFAULT_URL: &str = "http://127.0.0.1:8899";

/// `--name value` pairs and bare words, checked against what a command takes.
pub struct Flags {
    values: BTreeMap<String, String>,
    pub words: Vec<String>,
}

impl Flags {
    pub fn parse(args: &[String], command: &str, allowed: &[&str]) -> Result<Self> {
        let mut values = BTreeMap::new();
        let mut words = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                if !allowed.contains(&name) {
                    bail!(
                        "unknown option `{a}` for `{command}`; it takes {}",
                        allowed
                            .iter()
                            .map(|f| format!("--{f}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                let v = it.next().ok_or_else(|| anyhow!("{a} needs a value"))?;
                values.insert(name.to_string(), v.clone());
            } else {
                words.push(a.clone());
            }
        }
        Ok(Self { values, words })
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn get<T: FromStr>(&self, name: &str) -> Result<Option<T>>
    where
        T::Err: std::fmt::Display,
    {
        self.values
            .get(name)
            .map(|v| v.parse::<T>().map_err(|e| anyhow!("--{name} `{v}`: {e}")))
            .transpose()
    }

    /// The chain from `--url` (default: a local `cohort localnet`) and
    /// `--program-id` (default: the program this build speaks to).
    pub async fn chain(&self) -> Result<Chain> {
        let url = self.str("url").unwrap_or(DEFAULT_URL);
        let program = match self.str("program-id") {
            Some(p) => Pubkey::from_str(p)
                .map_err(|_| anyhow!("--program-id `{p}` is not a valid address"))?,
            None => cohort_program::ID,
        };
        Chain::connect(url, &program).await
    }

    /// The wallet from `--keypair`, or `<home>/<default>` (created when
    /// missing, so a first run on a local chain just works).
    pub fn keypair(&self, default: &str) -> Result<Keypair> {
        match self.str("keypair") {
            Some(p) => keys::load(&PathBuf::from(p)),
            None => {
                let p = keys::home().join(default);
                keys::load_or_create(&p).with_context(|| format!("wallet {}", p.display()))
            }
        }
    }
}

/// Flags every chain command takes.
pub const CHAIN_FLAGS: [&str; 3] = ["url", "keypair", "program-id"];

pub fn sol_to_lamports(v: f64, name: &str) -> Result<u64> {
    if !(v.is_finite() && v > 0.0 && v < 1e9) {
        bail!("{name} must be a positive amount of SOL, got {v}");
    }
    Ok((v * crate::chain::LAMPORTS_PER_SOL as f64).round() as u64)
}
