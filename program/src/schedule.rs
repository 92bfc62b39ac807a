//! Epoch seeds and witness committees: pure functions of on-chain data, so the
//! program, the engine and any observer compute the same committee.

use solana_program::hash::hashv;
use solana_program::pubkey::Pubkey;

/// `H(tag, recent slot hash, job, epoch)`: unknown until the epoch starts.
pub fn epoch_seed(slot_hash: &[u8; 32], job: &Pubkey, epoch: u32) -> [u8; 32] {
    hashv(&[
        b"cohort-seed-v1",
        slot_hash,
        job.as_ref(),
        &epoch.to_le_bytes(),
    ])
    .to_bytes()
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Seat `j` of the committee is member index `(start + j * stride) mod n` with
/// `stride` coprime to `n`: a seeded permutation of `0..n`, so seats are
/// distinct, and it costs O(seats) with no memory that grows with `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committee {
    n: u64,
    start: u64,
    stride: u64,
    seats: u32,
}

impl Committee {
    pub fn new(seed: &[u8; 32], members: u32, witness_count: u8) -> Self {
        let n = members as u64;
        let seats = (witness_count as u32).min(members);
        if n <= 1 {
            return Self {
                n,
                start: 0,
                stride: 1,
                seats,
            };
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&seed[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let start = word(0) % n;
        let mut stride = 1 + word(1) % (n - 1);
        // Walks at most n-1 candidates; stride 1 always qualifies.
        for _ in 0..n {
            if gcd(stride, n) == 1 {
                break;
            }
            stride = stride % (n - 1) + 1;
        }
        Self {
            n,
            start,
            stride,
            seats,
        }
    }

    pub fn seats(&self) -> u32 {
        self.seats
    }

    /// Member index sitting in seat `j`.
    pub fn member_at(&self, j: u32) -> Option<u32> {
        if j >= self.seats {
            return None;
        }
        let idx = (self.start as u128 + j as u128 * self.stride as u128) % self.n as u128;
        Some(idx as u32)
    }

    /// The seat of member `index`, if it is a witness.
    pub fn seat_of(&self, index: u32) -> Option<u32> {
        (0..self.seats).find(|&j| self.member_at(j) == Some(index))
    }

    pub fn members(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.seats).filter_map(|j| self.member_at(j))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seats_are_distinct_and_in_range() {
        for n in 1..200u32 {
            for s in 0..4u8 {
                let seed = hashv(&[&[s], &n.to_le_bytes()]).to_bytes();
                let c = Committee::new(&seed, n, 16);
                let mut seen: Vec<u32> = c.members().collect();
                assert_eq!(seen.len() as u32, n.min(16));
                assert!(seen.iter().all(|&i| i < n));
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len() as u32, n.min(16), "n={n}");
                for (j, m) in c.members().enumerate() {
                    assert_eq!(c.seat_of(m), Some(j as u32));
                }
            }
        }
    }

    #[test]
    fn different_seeds_pick_different_committees() {
        let a = Committee::new(&[1; 32], 1000, 8);
        let b = Committee::new(&[2; 32], 1000, 8);
        assert_ne!(
            a.members().collect::<Vec<_>>(),
            b.members().collect::<Vec<_>>()
        );
    }
}
