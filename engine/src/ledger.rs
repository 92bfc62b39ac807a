//! Accepted contributions per member over a job, and what a witness attests.

use cohort_program::merkle::{self, Hash32, MerkleTree};
use solana_program::pubkey::Pubkey;
use std::collections::BTreeMap;

/// Cumulative accepted contributions per node over the whole job. A
/// `BTreeMap` keeps members in key order, so every witness builds the same tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContributionLedger {
    points: BTreeMap<Pubkey, u64>,
}

/// What a witness submits in `attest_epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochAttestation {
    pub epoch: u32,
    pub model_hash: Hash32,
    pub root: Hash32,
    pub total_points: u64,
    pub digest: Hash32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LedgerError {
    #[error("contribution count overflowed for {0}")]
    Overflow(Pubkey),
    #[error("{0} has no contributions in the ledger")]
    UnknownMember(Pubkey),
    #[error("total contribution count overflowed")]
    TotalOverflow,
}

impl ContributionLedger {
    pub fn credit(&mut self, node: Pubkey, points: u64) -> Result<(), LedgerError> {
        let p = self.points.entry(node).or_insert(0);
        *p = p.checked_add(points).ok_or(LedgerError::Overflow(node))?;
        Ok(())
    }

    pub fn points(&self, node: &Pubkey) -> u64 {
        self.points.get(node).copied().unwrap_or(0)
    }

    fn tree(&self) -> Result<(Vec<(Pubkey, u64)>, MerkleTree), LedgerError> {
        let entries: Vec<(Pubkey, u64)> = self.points.iter().map(|(k, v)| (*k, *v)).collect();
        let tree = MerkleTree::new(&entries).ok_or(LedgerError::TotalOverflow)?;
        Ok((entries, tree))
    }

    pub fn attestation(
        &self,
        program_id: &Pubkey,
        job: &Pubkey,
        epoch: u32,
        model_hash: Hash32,
    ) -> Result<EpochAttestation, LedgerError> {
        let (_, tree) = self.tree()?;
        let root = tree.root();
        let total_points = tree.total();
        Ok(EpochAttestation {
            epoch,
            model_hash,
            root,
            total_points,
            digest: merkle::epoch_digest(program_id, job, epoch, &model_hash, &root, total_points),
        })
    }

    /// `(cumulative points, proof)` for a member's `claim`.
    pub fn proof(&self, node: &Pubkey) -> Result<(u64, Vec<Hash32>), LedgerError> {
        let (entries, tree) = self.tree()?;
        let i = entries
            .iter()
            .position(|(k, _)| k == node)
            .ok_or(LedgerError::UnknownMember(*node))?;
        let proof = tree.proof(i).ok_or(LedgerError::UnknownMember(*node))?;
        Ok((entries[i].1, proof))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_against_the_attested_root() {
        let mut l = ContributionLedger::default();
        let keys: Vec<Pubkey> = (0..7).map(|_| Pubkey::new_unique()).collect();
        for (i, k) in keys.iter().enumerate() {
            l.credit(*k, i as u64 + 1).unwrap();
        }
        let a = l
            .attestation(&cohort_program::ID, &Pubkey::new_unique(), 0, [1; 32])
            .unwrap();
        assert_eq!(a.total_points, 28);
        for k in &keys {
            let (p, proof) = l.proof(k).unwrap();
            assert_eq!(p, l.points(k));
            assert!(merkle::verify(merkle::leaf(k, p), &proof, &a.root));
        }
        let stranger = Pubkey::new_unique();
        assert_eq!(
            l.proof(&stranger),
            Err(LedgerError::UnknownMember(stranger))
        );
        assert_eq!(
            l.credit(keys[0], u64::MAX),
            Err(LedgerError::Overflow(keys[0]))
        );
    }
}
