//! Contribution Merkle tree and the epoch digest witnesses sign.
//!
//! Leaves are `H(0x00 || node || cumulative points)`, inner nodes
//! `H(0x01 || min(a, b) || max(a, b))`. The domain bytes keep a leaf from ever
//! being read as an inner node; sorting each pair makes proofs a plain list of
//! siblings with no left/right flags. An odd node is carried up unchanged.

use solana_program::hash::hashv;
use solana_program::pubkey::Pubkey;

pub type Hash32 = [u8; 32];
/// Enough for 2^32 leaves; also bounds the verifier's loop.
pub const MAX_PROOF_LEN: usize = 32;

pub fn leaf(node: &Pubkey, points: u64) -> Hash32 {
    hashv(&[&[0u8], node.as_ref(), &points.to_le_bytes()]).to_bytes()
}

pub fn parent(a: &Hash32, b: &Hash32) -> Hash32 {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    hashv(&[&[1u8], lo, hi]).to_bytes()
}

pub fn verify(leaf: Hash32, proof: &[Hash32], root: &Hash32) -> bool {
    proof.len() <= MAX_PROOF_LEN && proof.iter().fold(leaf, |acc, s| parent(&acc, s)) == *root
}

/// `H(tag, program, job, epoch, model hash, contribution root, total points)`:
/// what a witness vouches for. Equal digests mean equal roots and totals.
pub fn epoch_digest(
    program_id: &Pubkey,
    job: &Pubkey,
    epoch: u32,
    model_hash: &Hash32,
    root: &Hash32,
    total_points: u64,
) -> Hash32 {
    hashv(&[
        b"cohort-epoch-v1",
        program_id.as_ref(),
        job.as_ref(),
        &epoch.to_le_bytes(),
        model_hash,
        root,
        &total_points.to_le_bytes(),
    ])
    .to_bytes()
}

/// Builds the tree of (node, cumulative points) and hands out proofs.
#[derive(Debug, Clone)]
pub struct MerkleTree {
    levels: Vec<Vec<Hash32>>,
    total: u64,
}

impl MerkleTree {
    /// Leaves in the given order; callers sort by node key so every witness
    /// builds the same tree. Returns `None` if the total overflows.
    pub fn new(entries: &[(Pubkey, u64)]) -> Option<Self> {
        let mut total = 0u64;
        for (_, p) in entries {
            total = total.checked_add(*p)?;
        }
        let mut levels = vec![entries.iter().map(|(k, p)| leaf(k, *p)).collect::<Vec<_>>()];
        while levels.last().is_some_and(|l| l.len() > 1) {
            let prev = levels.last()?;
            let next = prev
                .chunks(2)
                .map(|c| {
                    if c.len() == 2 {
                        parent(&c[0], &c[1])
                    } else {
                        c[0]
                    }
                })
                .collect();
            levels.push(next);
        }
        Some(Self { levels, total })
    }

    /// The root; all zeros for an empty tree.
    pub fn root(&self) -> Hash32 {
        self.levels
            .last()
            .and_then(|l| l.first().copied())
            .unwrap_or([0; 32])
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn len(&self) -> usize {
        self.levels[0].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn proof(&self, mut i: usize) -> Option<Vec<Hash32>> {
        if i >= self.len() {
            return None;
        }
        let mut out = Vec::new();
        for level in &self.levels[..self.levels.len() - 1] {
            let sibling = i ^ 1;
            if sibling < level.len() {
                out.push(level[sibling]);
            }
            i /= 2;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> Pubkey {
        Pubkey::new_from_array([i; 32])
    }

    #[test]
    fn every_proof_verifies_and_a_changed_leaf_does_not() {
        for n in 1..40u8 {
            let entries: Vec<_> = (0..n).map(|i| (key(i), i as u64 * 3)).collect();
            let t = MerkleTree::new(&entries).unwrap();
            for (i, (k, p)) in entries.iter().enumerate() {
                let proof = t.proof(i).unwrap();
                assert!(verify(leaf(k, *p), &proof, &t.root()), "n={n} i={i}");
                assert!(!verify(leaf(k, *p + 1), &proof, &t.root()));
            }
        }
    }

    #[test]
    fn a_proof_only_fits_its_own_leaf() {
        let entries: Vec<_> = (0..5).map(|i| (key(i), 7)).collect();
        let t = MerkleTree::new(&entries).unwrap();
        let proof0 = t.proof(0).unwrap();
        assert!(!verify(leaf(&key(1), 7), &proof0, &t.root()));
        assert!(!verify(leaf(&key(9), 7), &proof0, &t.root()));
        assert_eq!(t.total(), 35);
        assert!(t.proof(5).is_none());
    }
}
