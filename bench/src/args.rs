//! `--key value` flags, with a clear error for anything else.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::str::FromStr;

pub struct Args {
    values: BTreeMap<String, String>,
    allowed: &'static [&'static str],
}

impl Args {
    pub fn parse(raw: &[String], allowed: &'static [&'static str]) -> Result<Self> {
        let mut values = BTreeMap::new();
        let mut it = raw.iter();
        while let Some(k) = it.next() {
            let key = k
                .strip_prefix("--")
                .with_context(|| format!("expected a --flag, got `{k}`"))?;
            if !allowed.contains(&key) {
                bail!(
                    "unknown flag --{key}; this bench takes {}",
                    allowed
                        .iter()
                        .map(|a| format!("--{a}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            let v = it
                .next()
                .with_context(|| format!("--{key} needs a value"))?;
            values.insert(key.to_string(), v.clone());
        }
        Ok(Self { values, allowed })
    }

    pub fn get<T: FromStr>(&self, key: &str, default: T) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        debug_assert!(self.allowed.contains(&key));
        match self.values.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| anyhow::anyhow!("--{key} {v}: {e}")),
        }
    }
}
