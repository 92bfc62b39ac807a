//! Epoch seeds and witness committees: pure functions of on-chain data, so the
//! program, the engine and any observer compute the same committee.

use solana_program::hash::hashv;
use solana_program::pubkey::Pubkey;

/// Slots between `start_epoch` and the slot whose hash seeds the epoch's
/// committee: whoever cranks the start cannot know that hash yet.
pub const SEAL_DELAY_SLOTS: u64 = 2;

/// What the `SlotHashes` sysvar says about an epoch's seal slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealHash {
    /// The hash of the first slot at or after the seal slot (a skipped slot
    /// has no hash; the next one that exists stands in).
    Ready([u8; 32]),
    /// No slot at or after the seal slot has a hash yet.
    TooEarly,
    /// The sysvar no longer reaches back to the seal slot (it keeps 512):
    /// the epoch must be re-targeted at a later slot.
    Expired,
}

/// Reads the raw `SlotHashes` sysvar data (`u64` count, then `(slot, hash)`
/// entries, newest first) in place: deserializing 20 KB would cost more
/// compute than the rest of the instruction. One rule for the program and
/// for the clients that must name the committee's accounts when they seal.
pub fn seal_hash(slot_hashes: &[u8], seal_slot: u64) -> Option<SealHash> {
    let count = u64::from_le_bytes(slot_hashes.get(..8)?.try_into().ok()?);
    let mut found = None;
    for i in 0..count as usize {
        let at = 8 + i * 40;
        let entry = slot_hashes.get(at..at + 40)?;
        let slot = u64::from_le_bytes(entry[..8].try_into().ok()?);
        if slot >= seal_slot {
            let mut h = [0u8; 32];
            h.copy_from_slice(&entry[8..]);
            found = Some(h);
        }
        if slot <= seal_slot {
            // The entries reach back to the seal slot: `found` is the first
            // slot at or after it, or nothing has been hashed since.
            return Some(found.map_or(SealHash::TooEarly, SealHash::Ready));
        }
    }
    Some(if count == 0 || found.is_none() {
        SealHash::TooEarly
    } else {
        SealHash::Expired
    })
}

/// The committee an epoch is sealed with: seats drawn from the first `n`
/// member indices at seal time.
pub fn seal_committee(
    hash: &[u8; 32],
    job: &Pubkey,
    epoch: u32,
    n: u32,
    witness_count: u8,
) -> ([u8; 32], Committee) {
    let seed = epoch_seed(hash, job, epoch);
    (seed, Committee::new(&seed, n, witness_count))
}

/// `H(tag, seal slot hash, job, epoch)`: unknown until the epoch is sealed.
pub fn epoch_seed(slot_hash: &[u8; 32], job: &Pubkey, epoch: u32) -> [u8; 32] {
    hashv(&[
        b"cohort-seed-v1",
        slot_hash,
        job.as_ref(),
        &epoch.to_le_bytes(),
    ])
    .to_bytes()
}

/// Most witnesses a committee can have (the Epoch's vote array).
pub const MAX_SEATS: usize = crate::state::MAX_WITNESSES;

/// Hash draws one seat may take before it falls back: each is rejected
/// with probability below 2^-32, so the fallback never runs in practice.
const MAX_TRIES: u32 = 8;

/// A uniform integer in `0..=max` from the seed's hash stream: rejection
/// sampling, so there is no modulo bias.
fn uniform(seed: &[u8; 32], counter: &mut u64, max: u32) -> u32 {
    let span = max as u64 + 1;
    // 2^64 mod span: the top `rem` words would favour small residues.
    let rem = (u64::MAX % span + 1) % span;
    let mut r = 0u64;
    for _ in 0..MAX_TRIES {
        let h = hashv(&[b"cohort-draw-v1", seed, &counter.to_le_bytes()]).to_bytes();
        *counter += 1;
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[..8]);
        r = u64::from_le_bytes(b);
        if r <= u64::MAX - rem {
            break;
        }
    }
    (r % span) as u32
}

/// The witnesses of an epoch: `min(witness_count, n)` distinct member
/// indices out of `0..n`, drawn by Floyd's sampling so every subset is
/// equally likely (no strides, no modulo bias), then shuffled so every seat
/// order is equally likely too; O(seats²) work and no memory that grows
/// with `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committee {
    seats: u32,
    members: [u32; MAX_SEATS],
}

impl Committee {
    pub fn new(seed: &[u8; 32], members: u32, witness_count: u8) -> Self {
        let k = (witness_count as u32).min(members).min(MAX_SEATS as u32);
        let mut out = [0u32; MAX_SEATS];
        let mut counter = 0u64;
        for (len, j) in ((members - k)..members).enumerate() {
            let t = uniform(seed, &mut counter, j);
            out[len] = if out[..len].contains(&t) { j } else { t };
        }
        // Floyd's order favours small indices in early seats; a
        // Fisher-Yates shuffle makes the seat order uniform too.
        for i in (1..k as usize).rev() {
            let j = uniform(seed, &mut counter, i as u32) as usize;
            out.swap(i, j);
        }
        Self {
            seats: k,
            members: out,
        }
    }

    pub fn seats(&self) -> u32 {
        self.seats
    }

    /// Member index sitting in seat `j`.
    pub fn member_at(&self, j: u32) -> Option<u32> {
        (j < self.seats).then(|| self.members[j as usize])
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

    fn seed(i: u32) -> [u8; 32] {
        hashv(&[b"test-seed", &i.to_le_bytes()]).to_bytes()
    }

    /// Every 3-subset of 6 members is drawn equally often: chi-square over
    /// 40,000 seeds against the 20 subsets, below the p = 0.001 critical
    /// value for 19 degrees of freedom (43.82).
    #[test]
    fn the_committee_draw_is_uniform_chi_square() {
        let draws = 40_000u32;
        let mut counts = std::collections::BTreeMap::<u32, u32>::new();
        for i in 0..draws {
            let c = Committee::new(&seed(i), 6, 3);
            let mask = c.members().fold(0u32, |m, x| m | 1 << x);
            *counts.entry(mask).or_default() += 1;
        }
        assert_eq!(counts.len(), 20);
        let expected = draws as f64 / 20.0;
        let chi2: f64 = counts
            .values()
            .map(|&o| (o as f64 - expected).powi(2) / expected)
            .sum();
        assert!(chi2 < 43.82, "chi-square {chi2:.1} over 19 dof");
        // Each member sits on half the committees, seat by seat uniform too.
        let mut per_seat = [[0u32; 6]; 3];
        for i in 0..draws {
            for (j, m) in Committee::new(&seed(i), 6, 3).members().enumerate() {
                per_seat[j][m as usize] += 1;
            }
        }
        for row in per_seat {
            let chi2: f64 = row
                .iter()
                .map(|&o| (o as f64 - draws as f64 / 6.0).powi(2) / (draws as f64 / 6.0))
                .sum();
            // 5 dof, p = 0.001.
            assert!(chi2 < 20.52, "seat chi-square {chi2:.1}: {row:?}");
        }
    }

    /// 10 members of which 3 collude, 5 seats, quorum 3: the colluders hold
    /// a quorum with the hypergeometric probability C(3,3)·C(7,2)/C(10,5) =
    /// 21/252 ≈ 8.33% (an arithmetic-progression draw gave them 20%).
    #[test]
    fn three_colluders_of_ten_capture_a_quorum_of_five_seats_8_percent_of_the_time() {
        let draws = 100_000u32;
        let colluders = [0u32, 1, 2];
        let captured = (0..draws)
            .filter(|&i| {
                Committee::new(&seed(i), 10, 5)
                    .members()
                    .filter(|m| colluders.contains(m))
                    .count()
                    >= 3
            })
            .count();
        let p = captured as f64 / draws as f64;
        assert!((p - 21.0 / 252.0).abs() < 0.003, "captured {p:.4}");
    }

    fn slot_hashes(entries: &[(u64, u8)]) -> Vec<u8> {
        let mut v = (entries.len() as u64).to_le_bytes().to_vec();
        for (slot, h) in entries {
            v.extend_from_slice(&slot.to_le_bytes());
            v.extend_from_slice(&[*h; 32]);
        }
        v
    }

    #[test]
    fn the_seal_uses_the_first_slot_at_or_after_the_seal_slot_whatever_came_later() {
        // Newest first; slot 11 was skipped.
        let d = slot_hashes(&[(14, 4), (13, 3), (12, 2), (10, 0), (9, 9)]);
        assert_eq!(seal_hash(&d, 12), Some(SealHash::Ready([2; 32])));
        assert_eq!(seal_hash(&d, 11), Some(SealHash::Ready([2; 32])));
        assert_eq!(seal_hash(&d, 10), Some(SealHash::Ready([0; 32])));
        assert_eq!(seal_hash(&d, 15), Some(SealHash::TooEarly));
        // Everything at or before slot 9 has slid out of the window.
        assert_eq!(seal_hash(&d, 8), Some(SealHash::Expired));
        assert_eq!(seal_hash(&slot_hashes(&[]), 3), Some(SealHash::TooEarly));
        assert_eq!(seal_hash(&d[..20], 3), None);
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
