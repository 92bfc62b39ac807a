//! The node's own record of a job, saved after every applied step: its
//! points table, the table each epoch ended with and its model hashes, so
//! a restarted node picks up where it was.

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
    /// Epochs fully trained.
    pub(super) trained: u32,
    /// Each epoch's credits by member key, as the shared state last had
    /// them (saved after every step, so an epoch trained but not yet
    /// settled when the node stopped still counts).
    #[serde(default)]
    pub(super) credits: BTreeMap<u32, BTreeMap<String, u64>>,
    /// Every member's points so far: the sum of `credits` over the epochs
    /// not skipped.
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
    pub(super) fn drop_epoch(&mut self, e: u32) {
        self.credits.remove(&e);
        self.settled.remove(&e);
        self.points = self.total();
        self.skipped.insert(e);
    }

    /// Every epoch's credits added up.
    fn total(&self) -> BTreeMap<String, u64> {
        let mut points = BTreeMap::new();
        for (m, c) in self.credits.values().flatten() {
            *points.entry(m.clone()).or_insert(0) += c;
        }
        points
    }

    /// Takes epoch `e`'s credits as the shared state has them after a step
    /// (`credits[i]`: steps that credited `members[i]`); whether the points
    /// changed. The engine reports them after every step it applies and
    /// every state it loads, so a rewind, a restart or a download replaces
    /// whatever an abandoned history credited: the table always equals the
    /// one every member on this history attests.
    pub(super) fn credit(&mut self, e: u32, members: &[Pubkey], credits: &[u32]) -> bool {
        let table: BTreeMap<String, u64> = members
            .iter()
            .zip(credits)
            .filter(|(_, c)| **c > 0)
            .map(|(m, c)| (m.to_string(), u64::from(*c)))
            .collect();
        if self.credits.get(&e) == Some(&table) {
            return false;
        }
        self.credits.insert(e, table);
        self.points = self.total();
        true
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

/// The Merkle ledger of a points table. A member with no points is no
/// leaf, so every witness builds the same root whether or not its table
/// names that member.
pub(super) fn ledger_of(points: &BTreeMap<String, u64>) -> Result<ContributionLedger> {
    let mut l = ContributionLedger::default();
    for (k, p) in points.iter().filter(|(_, p)| **p > 0) {
        l.credit(
            Pubkey::from_str(k).map_err(|_| anyhow!("bad key in state"))?,
            *p,
        )?;
    }
    Ok(l)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn points(local: &Local, members: &[Pubkey]) -> Vec<u64> {
        members
            .iter()
            .map(|m| local.points.get(&m.to_string()).copied().unwrap_or(0))
            .collect()
    }

    #[test]
    fn a_state_loaded_after_a_rewind_replaces_what_an_abandoned_history_credited() {
        let members: Vec<Pubkey> = (0..3).map(|_| Pubkey::new_unique()).collect();
        let mut local = Local::default();
        assert!(local.credit(0, &members, &[2, 2, 2]));
        local.settled.insert(0, local.points.clone());
        // Epoch 1: this node applied two steps of a history that left
        // member 2 out, then loaded the state every other member has, in
        // which both steps credited all three (as in the clean-clone CI run
        // of 2026-12-05, where the node attested 69 points and the others 72).
        assert!(local.credit(1, &members, &[2, 2, 0]));
        assert_eq!(points(&local, &members), [4, 4, 2]);
        assert!(local.credit(1, &members, &[2, 2, 2]));
        assert_eq!(points(&local, &members), [4, 4, 4]);
        // The same credits again change nothing, so nothing is saved.
        assert!(!local.credit(1, &members, &[2, 2, 2]));
    }

    #[test]
    fn an_epoch_trained_but_never_settled_still_counts_after_a_restart() {
        // The node stopped after its last step of epoch 0, before it
        // recorded the epoch as settled; it comes back for epoch 1.
        let members: Vec<Pubkey> = (0..2).map(|_| Pubkey::new_unique()).collect();
        let dir = tempfile::tempdir().unwrap();
        let mut local = Local::default();
        local.credit(0, &members, &[5, 4]);
        local.save(dir.path()).unwrap();
        let mut local = Local::load(dir.path()).unwrap();
        assert!(local.settled.is_empty());
        local.credit(1, &members, &[1, 1]);
        assert_eq!(points(&local, &members), [6, 5]);
    }

    #[test]
    fn a_member_with_no_points_is_no_leaf_of_the_ledger() {
        let m = Pubkey::new_unique().to_string();
        let with_zero: BTreeMap<String, u64> =
            [(m.clone(), 3), (Pubkey::new_unique().to_string(), 0)].into();
        let without: BTreeMap<String, u64> = [(m, 3)].into();
        let root = |t| {
            ledger_of(t)
                .unwrap()
                .attestation(&cohort_program::ID, &Pubkey::default(), 0, [0; 32])
                .unwrap()
                .root
        };
        assert_eq!(root(&with_zero), root(&without));
    }

    #[test]
    fn a_skipped_epoch_drops_its_points_and_the_next_counts_from_the_last_settled_one() {
        let members: Vec<Pubkey> = (0..2).map(|_| Pubkey::new_unique()).collect();
        let mut local = Local::default();
        local.credit(0, &members, &[3, 1]);
        local.settled.insert(0, local.points.clone());
        local.credit(1, &members, &[2, 2]);
        local.settled.insert(1, local.points.clone());
        local.drop_epoch(1);
        assert_eq!(points(&local, &members), [3, 1]);
        local.credit(2, &members, &[1, 0]);
        assert_eq!(points(&local, &members), [4, 1]);
    }
}
