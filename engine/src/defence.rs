//! The defence policy, written once: who audits a contribution, when a
//! random audit is drawn, which accusations count and when they convict.
//! Pure code with no I/O, run alike by the arena and the network node.
//!
//! What the step's leader controls is kept out of every draw:
//! - **Who audits** member m's step-t contribution: `quorum` witnesses
//!   taken from the chain's epoch seed, t and m ([`Policy::auditors`]). Not
//!   from the manifest, whose id the leader chooses by choosing whom to
//!   include. Knowing the auditors in advance helps no cheater: it cannot
//!   avoid them, only the audit.
//! - **Whether** it is audited: always when the screen flags it (a pure
//!   function of the step's payloads), and otherwise when an auditor's
//!   *coin* says so. The coin is the auditor's own deterministic ed25519
//!   signature over the contribution ([`coin_message`]): nobody else can
//!   compute it, so the member cannot know in advance which of its steps
//!   are checked, and the leader cannot steer it. The signature travels with
//!   the accusation, so anyone can check that the audit was drawn.
//!
//! An audit that one auditor's coin drew is confirmed by the contribution's
//! other auditors before anyone is convicted: an accusation counts only
//! from an auditor of that very contribution, and a quorum convicts only on
//! the same evidence ([`Tally`]). Proof a witness holds by itself (a
//! leader's two signed manifests for one attempt; an entry its named member
//! never signed) counts from any witness, again per evidence id, which
//! every witness derives alike.

use crate::audit::AuditConfig;
use libp2p::identity::ed25519;
use std::collections::{BTreeMap, BTreeSet};

/// Why a witness accuses a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ground {
    /// Its audit of a contribution the screen flagged failed.
    Screened,
    /// Its audit of a contribution of the sharded exchange failed, which
    /// its author's slice of `shard` flagged (its signs go against that
    /// shard's sums): this witness's own sample, or another auditor's that
    /// it fetched and checked itself.
    Sampled { shard: u32 },
    /// Its audit of a contribution a coin drew failed: auditor `by`'s
    /// signature over [`coin_message`], the proof of the draw (its own, or
    /// the one it confirmed).
    Drawn { by: u32, coin: [u8; 64] },
    /// The accused led one attempt of a step with two different signed
    /// manifests on the same history.
    Equivocation,
    /// The accused led a step listing, under another member's name, bytes
    /// that member never signed and never announced.
    ForgedEntry,
    /// The accused led a step of the sharded exchange listing its own
    /// contribution, which it announced as computed on another state than
    /// the step's (the rule every leader keeps, `StepMachine::basis_of`),
    /// on the history whose state the manifest itself names: a
    /// contribution no witness audits on that history.
    ForeignBasis,
    /// The accused, an aggregator of the sharded exchange, signed `hash`
    /// (its signature `sig` over the [`crate::net::msg::SumHash`] these
    /// fields rebuild) as the sum of `shard` under `manifest`, and the
    /// members' signed slices sum to something else: anyone holding the
    /// slices recomputes it exactly (`crate::shard::check`).
    FalseSum {
        shard: u32,
        manifest: [u8; 32],
        hash: [u8; 32],
        sig: [u8; 64],
    },
}

impl Ground {
    /// An audit's ground (only an auditor of the contribution may accuse).
    pub fn is_audit(&self) -> bool {
        matches!(
            self,
            Ground::Screened | Ground::Sampled { .. } | Ground::Drawn { .. }
        )
    }
}

/// What one witness does about one contribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    /// Not this witness's to audit.
    Skip,
    /// Audit it; `chained` also checks the momentum chain (see
    /// [`crate::audit`]); `ground` is what an accusation will carry.
    Audit { chained: bool, ground: Ground },
}

/// One epoch's defence settings, the same on every node.
#[derive(Debug, Clone)]
pub struct Policy {
    pub audit: AuditConfig,
    /// The epoch's witnesses (member indices) not slashed so far.
    pub witnesses: Vec<u32>,
    /// The chain's epoch seed.
    pub seed: [u8; 32],
    pub job: [u8; 32],
    pub epoch: u32,
}

impl Policy {
    /// The `quorum` witnesses (never the member itself) that audit
    /// `member`'s contribution to `step`, drawn from the chain's seed.
    pub fn auditors(&self, step: u32, member: u32) -> Vec<u32> {
        let eligible: Vec<u32> = self
            .witnesses
            .iter()
            .copied()
            .filter(|w| *w != member)
            .collect();
        let n = eligible.len();
        if n == 0 {
            return Vec::new();
        }
        let mut h = blake3::Hasher::new();
        h.update(b"cohort-auditors-v2");
        h.update(&self.seed);
        h.update(&step.to_le_bytes());
        h.update(&member.to_le_bytes());
        let start = u64_of(h.finalize().as_bytes()) as usize % n;
        (0..self.audit.quorum.max(1).min(n))
            .map(|k| eligible[(start + k) % n])
            .collect()
    }

    pub fn is_auditor(&self, witness: u32, step: u32, member: u32) -> bool {
        self.auditors(step, member).contains(&witness)
    }

    /// What witness `me` does about `member`'s contribution to `step`,
    /// whose payload hashes to `payload`. `sign` is `me`'s signing key,
    /// asked only when the coin is needed.
    pub fn duty(
        &self,
        me: u32,
        step: u32,
        member: u32,
        payload: &[u8; 32],
        flagged: bool,
        sign: impl FnOnce(&[u8]) -> [u8; 64],
    ) -> Duty {
        if me == member || !self.is_auditor(me, step, member) {
            return Duty::Skip;
        }
        if flagged {
            return Duty::Audit {
                chained: true,
                ground: Ground::Screened,
            };
        }
        let coin = sign(&coin_message(&self.job, self.epoch, step, member, payload));
        let (draw, chain) = coin_values(&coin);
        if draw < self.audit.rate {
            Duty::Audit {
                chained: chain < self.audit.chain_rate,
                ground: Ground::Drawn { by: me, coin },
            }
        } else {
            Duty::Skip
        }
    }

    /// Whether `coin` proves that `witness` (whose key is `key`) drew
    /// `member`'s step-`step` contribution for a random audit: what another
    /// auditor checks before it confirms.
    pub fn drawn_by(
        &self,
        witness: u32,
        key: &[u8; 32],
        step: u32,
        member: u32,
        payload: &[u8; 32],
        coin: &[u8; 64],
    ) -> bool {
        self.is_auditor(witness, step, member)
            && coin_values(coin).0 < self.audit.rate
            && ed25519::PublicKey::try_from_bytes(key).is_ok_and(|k| {
                k.verify(
                    &coin_message(&self.job, self.epoch, step, member, payload),
                    &coin[..],
                )
            })
    }

    /// A witness was slashed: it audits nobody from now on.
    pub fn slash(&mut self, witness: u32) {
        self.witnesses.retain(|w| *w != witness);
    }
}

/// What an auditor signs to toss its coin for one contribution.
pub fn coin_message(
    job: &[u8; 32],
    epoch: u32,
    step: u32,
    member: u32,
    payload: &[u8; 32],
) -> Vec<u8> {
    let mut m = Vec::with_capacity(24 + 32 + 12 + 32);
    m.extend_from_slice(b"cohort-audit-coin-v1");
    m.extend_from_slice(job);
    m.extend_from_slice(&epoch.to_le_bytes());
    m.extend_from_slice(&step.to_le_bytes());
    m.extend_from_slice(&member.to_le_bytes());
    m.extend_from_slice(payload);
    m
}

/// Two uniform numbers in [0, 1) from a coin: whether it draws an audit,
/// and whether that audit checks the chain too.
fn coin_values(coin: &[u8; 64]) -> (f64, f64) {
    let unit = |domain: &[u8]| {
        let mut h = blake3::Hasher::new();
        h.update(domain);
        h.update(coin);
        u64_of(h.finalize().as_bytes()) as f64 / (u64::MAX as f64 + 1.0)
    };
    (unit(b"draw"), unit(b"chain"))
}

fn u64_of(b: &[u8; 32]) -> u64 {
    let mut x = [0; 8];
    x.copy_from_slice(&b[..8]);
    u64::from_le_bytes(x)
}

/// Evidence id of false sums an aggregator signed at `step`: the same
/// whichever false claim a witness quotes (another shard's, or a second
/// hash the seat signed for the same shard), so witnesses that caught
/// different lies of one seat reach the quorum together. Each accusation
/// still quotes a claim the seat signed, and counts at a node only once
/// that node's own recomputation proves the quoted claim false.
pub fn false_sum_evidence(job: &[u8; 32], epoch: u32, step: u32, aggregator: u32) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-false-sum-v2");
    h.update(job);
    h.update(&epoch.to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(&aggregator.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Evidence id of a leader's equivocation at (`step`, `attempt`): the same
/// on every witness whichever two of its manifests it saw.
pub fn equivocation_evidence(
    job: &[u8; 32],
    epoch: u32,
    step: u32,
    attempt: u8,
    leader: u32,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-equivocation-v1");
    h.update(job);
    h.update(&epoch.to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(&[attempt]);
    h.update(&leader.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Evidence id of a listing on another state: `leader` listed its own
/// contribution at `step`, which it announced as computed on another state
/// than the step's.
pub fn foreign_basis_evidence(job: &[u8; 32], epoch: u32, step: u32, leader: u32) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-foreign-basis-v1");
    h.update(job);
    h.update(&epoch.to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(&leader.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Evidence id of a forged entry: `leader` listed bytes under `member`'s
/// name at `step` that `member` did not sign.
pub fn forged_entry_evidence(
    job: &[u8; 32],
    epoch: u32,
    step: u32,
    leader: u32,
    member: u32,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-forged-entry-v1");
    h.update(job);
    h.update(&epoch.to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(&leader.to_le_bytes());
    h.update(&member.to_le_bytes());
    *h.finalize().as_bytes()
}

/// One accusation, as the tally sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accusation {
    pub witness: u32,
    pub accused: u32,
    pub step: u32,
    pub evidence: [u8; 32],
    pub ground: Ground,
}

/// Why an accusation does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the accuser is not one of the epoch's witnesses")]
    NotWitness,
    #[error("the accuser does not audit that contribution")]
    NotAuditor,
    #[error("a witness cannot accuse itself")]
    SelfAccusation,
}

/// A conviction: the accused, and the witnesses whose accusations on the
/// same evidence made the quorum (lowest index first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conviction {
    pub accused: u32,
    pub step: u32,
    pub evidence: [u8; 32],
    pub witnesses: Vec<u32>,
}

/// Cases one witness may have open at once (accusations that made no
/// conviction yet). An honest witness accuses only members whose audit
/// failed, a handful an epoch; a witness that sends more, each on new
/// evidence, is flooding: its oldest open cases give way, so the tally's
/// memory stays bounded whatever it sends.
pub const MAX_OPEN_CASES: usize = 64;

/// Accusations heard, per accused and evidence.
#[derive(Debug, Default)]
pub struct Tally {
    by: BTreeMap<(u32, [u8; 32]), BTreeSet<u32>>,
    /// Each witness's open cases, oldest first (at most
    /// [`MAX_OPEN_CASES`]).
    open: BTreeMap<u32, std::collections::VecDeque<(u32, [u8; 32])>>,
    convicted: BTreeSet<u32>,
}

impl Tally {
    /// Counts `a` under `policy`; the conviction it completes, if any.
    pub fn add(&mut self, policy: &Policy, a: &Accusation) -> Result<Option<Conviction>, Refused> {
        if a.witness == a.accused {
            return Err(Refused::SelfAccusation);
        }
        if !policy.witnesses.contains(&a.witness) {
            return Err(Refused::NotWitness);
        }
        if a.ground.is_audit() && !policy.is_auditor(a.witness, a.step, a.accused) {
            return Err(Refused::NotAuditor);
        }
        // A convicted member's cases are closed: nothing more to count.
        if self.convicted.contains(&a.accused) {
            return Ok(None);
        }
        let case = (a.accused, a.evidence);
        let by = self.by.entry(case).or_default();
        if by.insert(a.witness) {
            let open = self.open.entry(a.witness).or_default();
            open.push_back(case);
            if open.len() > MAX_OPEN_CASES
                && let Some(old) = open.pop_front()
                && let Some(w) = self.by.get_mut(&old)
            {
                w.remove(&a.witness);
                if w.is_empty() {
                    self.by.remove(&old);
                }
            }
        }
        let Some(by) = self.by.get(&case) else {
            return Ok(None);
        };
        // A witness slashed since it accused no longer counts.
        let counted: Vec<u32> = by
            .iter()
            .copied()
            .filter(|w| policy.witnesses.contains(w))
            .collect();
        if counted.len() < policy.audit.quorum.max(1) {
            return Ok(None);
        }
        self.convicted.insert(a.accused);
        // Every open case against the convicted member closes with it.
        let closed: Vec<(u32, [u8; 32])> = self
            .by
            .range((a.accused, [0; 32])..=(a.accused, [u8::MAX; 32]))
            .map(|(k, _)| *k)
            .collect();
        for k in &closed {
            self.by.remove(k);
        }
        for open in self.open.values_mut() {
            open.retain(|c| c.0 != a.accused);
        }
        self.open.retain(|_, o| !o.is_empty());
        Ok(Some(Conviction {
            accused: a.accused,
            step: a.step,
            evidence: a.evidence,
            witnesses: counted,
        }))
    }

    /// Cases still open (memory held), for tests and reports.
    pub fn open_cases(&self) -> usize {
        self.by.len()
    }

    pub fn is_convicted(&self, member: u32) -> bool {
        self.convicted.contains(&member)
    }
}

/// `key`'s signature over `message` (ed25519 signatures are 64 bytes).
pub fn signature(key: &ed25519::Keypair, message: &[u8]) -> [u8; 64] {
    let mut out = [0; 64];
    out.copy_from_slice(&key.sign(message));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::msg;

    fn policy(witnesses: &[u32], quorum: usize, rate: f64) -> Policy {
        Policy {
            audit: AuditConfig {
                rate,
                quorum,
                ..AuditConfig::default()
            },
            witnesses: witnesses.to_vec(),
            seed: [3; 32],
            job: [1; 32],
            epoch: 0,
        }
    }

    fn key(i: u32) -> ed25519::Keypair {
        msg::keypair(&[i as u8 + 1; 32])
    }

    fn signer(i: u32) -> impl Fn(&[u8]) -> [u8; 64] {
        let k = key(i);
        move |m| signature(&k, m)
    }

    #[test]
    fn auditors_come_from_the_chain_seed_never_include_the_member_and_number_a_quorum() {
        let p = policy(&[0, 1, 2, 3, 4], 2, 0.1);
        for step in 0..50 {
            for member in 0..5 {
                let a = p.auditors(step, member);
                assert_eq!(a.len(), 2);
                assert!(!a.contains(&member));
                assert_eq!(a, p.auditors(step, member), "not deterministic");
            }
        }
        // Another seed, other auditors somewhere: the seed decides.
        let mut q = p.clone();
        q.seed = [4; 32];
        assert!((0..50).any(|s| p.auditors(s, 0) != q.auditors(s, 0)));
    }

    #[test]
    fn a_flagged_contribution_is_audited_by_each_of_its_auditors_and_nobody_else() {
        let p = policy(&[0, 1, 2, 3], 2, 0.0);
        let auditors = p.auditors(7, 3);
        for w in 0..4 {
            let d = p.duty(w, 7, 3, &[9; 32], true, signer(w));
            if auditors.contains(&w) {
                assert_eq!(
                    d,
                    Duty::Audit {
                        chained: true,
                        ground: Ground::Screened
                    }
                );
            } else {
                assert_eq!(d, Duty::Skip);
            }
        }
    }

    #[test]
    fn a_random_draw_is_near_its_rate_and_its_coin_proves_it_to_others() {
        let p = policy(&[0, 1, 2], 2, 0.25);
        let mut drawn = 0;
        let mut tossed = 0;
        for step in 0..400 {
            let payload = [step as u8; 32];
            for w in p.auditors(step, 2) {
                tossed += 1;
                if let Duty::Audit {
                    ground: Ground::Drawn { coin, .. },
                    ..
                } = p.duty(w, step, 2, &payload, false, signer(w))
                {
                    drawn += 1;
                    let k = key(w).public().to_bytes();
                    assert!(p.drawn_by(w, &k, step, 2, &payload, &coin));
                    // Not for another contribution, nor from another key.
                    let mut another = payload;
                    another[0] ^= 1;
                    assert!(!p.drawn_by(w, &k, step, 2, &another, &coin));
                    let other = key(w + 7).public().to_bytes();
                    assert!(!p.drawn_by(w, &other, step, 2, &payload, &coin));
                }
            }
        }
        let share = drawn as f64 / tossed as f64;
        assert!((0.18..0.32).contains(&share), "{drawn} of {tossed}");
    }

    #[test]
    fn a_coin_that_did_not_draw_proves_nothing() {
        let p = policy(&[0, 1, 2], 2, 0.25);
        let w = p.auditors(1, 2)[0];
        let k = key(w).public().to_bytes();
        let misses = (0..100u8)
            .map(|b| [b; 32])
            .filter(|payload| matches!(p.duty(w, 1, 2, payload, false, signer(w)), Duty::Skip))
            .take(5)
            .collect::<Vec<_>>();
        assert!(!misses.is_empty());
        for payload in misses {
            let coin = signer(w)(&coin_message(&p.job, p.epoch, 1, 2, &payload));
            assert!(!p.drawn_by(w, &k, 1, 2, &payload, &coin));
        }
    }

    #[test]
    fn only_a_quorum_of_auditors_on_the_same_evidence_convicts() {
        let p = policy(&[0, 1, 2, 3], 2, 0.1);
        let (step, accused) = (5, 3);
        let auditors = p.auditors(step, accused);
        let outsider = (0..3).find(|w| !auditors.contains(w)).unwrap();
        let accuse = |witness, evidence| Accusation {
            witness,
            accused,
            step,
            evidence,
            ground: Ground::Screened,
        };
        let mut t = Tally::default();
        assert_eq!(
            t.add(&p, &accuse(outsider, [1; 32])),
            Err(Refused::NotAuditor)
        );
        assert_eq!(t.add(&p, &accuse(9, [1; 32])), Err(Refused::NotWitness));
        assert_eq!(t.add(&p, &accuse(auditors[0], [1; 32])), Ok(None));
        // Another contribution's evidence makes no quorum with the first.
        assert_eq!(t.add(&p, &accuse(auditors[1], [2; 32])), Ok(None));
        let c = t.add(&p, &accuse(auditors[1], [1; 32])).unwrap().unwrap();
        let mut want = auditors.clone();
        want.sort();
        assert_eq!(c.witnesses, want);
        assert!(t.is_convicted(accused));
        // Convicted once.
        assert_eq!(t.add(&p, &accuse(auditors[0], [1; 32])), Ok(None));
    }

    #[test]
    fn a_witness_flooding_accusations_on_new_evidence_holds_a_bounded_memory_and_a_real_case_still_convicts()
     {
        let p = policy(&[0, 1, 2, 3], 2, 0.0);
        let accuse = |witness, accused, n: u32| Accusation {
            witness,
            accused,
            step: n,
            evidence: equivocation_evidence(&p.job, 0, n, 0, accused),
            ground: Ground::Equivocation,
        };
        let mut t = Tally::default();
        // Witness 1 accuses members 2 and 3 of ten thousand made-up cases.
        for n in 0..10_000 {
            assert_eq!(t.add(&p, &accuse(1, 2 + n % 2, n)), Ok(None));
        }
        assert!(
            t.open_cases() <= MAX_OPEN_CASES,
            "{} cases held for one flooding witness",
            t.open_cases()
        );
        // An honest pair still convicts on a real case, and closing it
        // frees what was held against the convicted member.
        assert_eq!(t.add(&p, &accuse(0, 3, 20_000)), Ok(None));
        let c = t.add(&p, &accuse(2, 3, 20_000)).unwrap().unwrap();
        assert_eq!((c.accused, c.witnesses.clone()), (3, vec![0, 2]));
        assert!(
            t.open_cases() <= MAX_OPEN_CASES / 2 + 1,
            "{}",
            t.open_cases()
        );
        assert_eq!(t.add(&p, &accuse(1, 3, 20_001)), Ok(None));
        assert!(
            t.open_cases() <= MAX_OPEN_CASES / 2 + 1,
            "{}",
            t.open_cases()
        );
    }

    #[test]
    fn proof_held_by_any_witness_counts_but_a_slashed_witness_s_word_does_not() {
        let mut p = policy(&[0, 1, 2], 2, 0.0);
        let ev = equivocation_evidence(&p.job, 0, 4, 0, 0);
        let accuse = |witness| Accusation {
            witness,
            accused: 0,
            step: 4,
            evidence: ev,
            ground: Ground::Equivocation,
        };
        let mut t = Tally::default();
        assert_eq!(t.add(&p, &accuse(0)), Err(Refused::SelfAccusation));
        assert_eq!(t.add(&p, &accuse(1)), Ok(None));
        p.slash(1);
        assert_eq!(
            t.add(&p, &accuse(2)),
            Ok(None),
            "witness 1 no longer counts"
        );
        p.witnesses.push(1);
        assert!(t.add(&p, &accuse(2)).unwrap().is_some());
    }

    #[test]
    fn witnesses_quoting_different_false_sums_of_one_seat_reach_the_quorum_together() {
        let p = policy(&[0, 1, 2, 3], 2, 0.0);
        let ev = |step, seat| false_sum_evidence(&p.job, 0, step, seat);
        let accuse = |witness, shard, hash| Accusation {
            witness,
            accused: 3,
            step: 4,
            evidence: ev(4, 3),
            ground: Ground::FalseSum {
                shard,
                manifest: [1; 32],
                hash,
                sig: [0; 64],
            },
        };
        let mut t = Tally::default();
        // One caught its lie in shard 2, the other a second hash it signed
        // for shard 5.
        assert_eq!(t.add(&p, &accuse(0, 2, [7; 32])), Ok(None));
        assert!(t.add(&p, &accuse(1, 5, [8; 32])).unwrap().is_some());
        assert_ne!(ev(4, 3), ev(5, 3), "another step");
        assert_ne!(ev(4, 3), ev(4, 2), "another seat");
    }

    #[test]
    fn evidence_ids_name_their_case() {
        let e = equivocation_evidence(&[1; 32], 0, 4, 0, 2);
        assert_ne!(e, equivocation_evidence(&[1; 32], 0, 4, 1, 2));
        assert_ne!(e, forged_entry_evidence(&[1; 32], 0, 4, 2, 0));
        assert_ne!(
            foreign_basis_evidence(&[1; 32], 0, 4, 2),
            forged_entry_evidence(&[1; 32], 0, 4, 2, 0)
        );
        assert_ne!(
            forged_entry_evidence(&[1; 32], 0, 4, 2, 0),
            forged_entry_evidence(&[1; 32], 0, 4, 2, 1)
        );
    }
}
