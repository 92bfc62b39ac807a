//! The node's own record of a job, saved after every applied step: the
//! contributors it credited, its points table per epoch and its model
//! hashes, so a restarted node picks up where it was.

use anyhow::{Context, Result, anyhow, bail};
use cohort_engine::ledger::ContributionLedger;
use serde::{Deserialize, Serialize};
use solana_sdk::pubkey::Pubkey;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The node's own record for one job, saved after every applied step.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Local {
    /// Each credited step's contributors (member indices), applied here or
    /// backfilled. A step applied again after a rewind replaces its entry.
    pub(super) contributors: BTreeMap<u32, Vec<u32>>,
    /// Epochs fully trained.
    pub(super) trained: u32,
    pub(super) points: BTreeMap<String, u64>,
    /// The points table as each epoch ended: what that epoch's witnesses
    /// attested, so a claim mid-job proves against the latest root.
    #[serde(default)]
    pub(super) settled: BTreeMap<u32, BTreeMap<String, u64>>,
    pub(super) model_hash: BTreeMap<u32, String>,
    /// Epochs skipped on chain, whose points were dropped.
    #[serde(default)]
    pub(super) skipped: std::collections::BTreeSet<u32>,
}

impl Local {
    /// Forgets epoch `e`'s contributions: it was skipped, so the points
    /// table goes back to what the last epoch before it ended with.
    pub(super) fn drop_epoch(&mut self, e: u32, steps_per_epoch: u32) {
        let from = e.saturating_mul(steps_per_epoch);
        let to = from.saturating_add(steps_per_epoch);
        self.contributors.retain(|s, _| !(from..to).contains(s));
        self.settled.remove(&e);
        self.points = self
            .settled
            .range(..e)
            .next_back()
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        self.skipped.insert(e);
    }

    fn path(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }
    pub(super) fn load(dir: &Path) -> Result<Self> {
        let p = Self::path(dir);
        if !p.exists() {
            return Ok(Self::default());
        }
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is corrupt", p.display()))
    }
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        let p = Self::path(dir);
        let tmp = crate::chain::keys::stage(&p, &serde_json::to_vec(self)?)?;
        std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))
    }
    pub(super) fn ledger(&self) -> Result<ContributionLedger> {
        ledger_of(&self.points)
    }
}

pub(super) fn ledger_of(points: &BTreeMap<String, u64>) -> Result<ContributionLedger> {
    let mut l = ContributionLedger::default();
    for (k, p) in points {
        l.credit(
            Pubkey::from_str(k).map_err(|_| anyhow!("bad key in state"))?,
            *p,
        )?;
    }
    Ok(l)
}

/// Records `step`'s contributors and moves points to match; whether
/// anything changed.
pub(super) fn credit(
    local: &mut Local,
    members: &[Pubkey],
    step: u32,
    contributors: &[u32],
) -> bool {
    if local.contributors.get(&step).map(Vec::as_slice) == Some(contributors) {
        return false;
    }
    let old = local.contributors.insert(step, contributors.to_vec());
    let mut tally = |c: &u32, up: bool| {
        if let Some(m) = members.get(*c as usize) {
            let p = local.points.entry(m.to_string()).or_insert(0);
            *p = if up { *p + 1 } else { p.saturating_sub(1) };
        }
    };
    for c in old.iter().flatten() {
        tally(c, false);
    }
    for c in contributors {
        tally(c, true);
    }
    true
}

pub(super) fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn parse_hex(s: &str) -> Result<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        bail!("bad hash in local state");
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow!("bad hash in local state"))?;
    }
    Ok(out)
}
