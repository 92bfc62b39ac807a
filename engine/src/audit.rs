//! Proof of contribution: which contributions witnesses audit, and how an
//! audit decides.
//!
//! A contribution commits to the hash of its author's momentum before the
//! step. A witness fetches that momentum (it must match the commitment),
//! recomputes the author's gradient on the shared weights and the author's
//! assigned batch, compresses it the same way, and compares the result
//! with what the author sent. Different GPUs round differently, so the
//! comparison is not bit equality: the share of top-k coefficients both
//! picked, and the share of those with the same sign.
//!
//! One step's audit cannot catch a member that reveals a momentum crafted
//! so that its chosen payload recomputes correctly (for a sign flip:
//! `m' = −m − 2g/β`). Its commitments chain across steps, though: the
//! momentum it commits to for step t must be what its step t−1 momentum
//! (committed and signed a step earlier) leaves after step t−1's gradient
//! and error feedback. When a flagged payload passes its one-step audit, the
//! witness also replays step t−1 from the revealed t−1 momentum and checks
//! that the revealed t momentum follows ([`chain_error`]). A forger would
//! have to forge every momentum back to one it committed honestly, and
//! the first forged link breaks. One more gradient, only for flagged
//! payloads that pass.
//!
//! Audits are drawn two ways (who draws them, and when, is
//! [`crate::defence`]'s to say):
//! - at random, each auditor's coin drawing a contribution with
//!   probability `rate`;
//! - always, when a cheap screen of the step's payloads flags it: a payload
//!   equal to another one (copied, or re-sent from an earlier step), or one
//!   whose coefficients few others picked or whose signs go against the
//!   others' majority (garbage, flipped or crafted votes). Honest payloads
//!   pass the screen almost always, so targeted audits cost little.

use crate::compress::{Layout, Payload, Select};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditConfig {
    /// Chance that one auditor's coin draws a contribution for a random
    /// audit (each contribution has `quorum` auditors; see
    /// [`crate::defence`]).
    pub rate: f64,
    /// Witnesses whose failed audits slash a member (on chain: the job's
    /// quorum of `report_fraud` signers).
    pub quorum: usize,
    /// Least share of the author's coefficients the recomputation picks too.
    pub min_overlap: f32,
    /// Least share of common coefficients with the same sign.
    pub min_agreement: f32,
    /// Most a revealed momentum may differ from the one its predecessor
    /// leads to, relative ([`chain_error`]): room for other hardware's
    /// rounding and top-k ties, not for another history.
    pub max_chain_error: f32,
    /// Chance that a randomly drawn audit checks the chain too (flagged
    /// payloads always do): one more gradient each.
    pub chain_rate: f64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            rate: 0.02,
            quorum: 2,
            min_overlap: 0.5,
            min_agreement: 0.8,
            max_chain_error: 0.5,
            chain_rate: 0.0,
        }
    }
}

/// How far a revealed momentum is from the `expected` one its previous
/// revealed momentum leads to, in gradients of the replayed step:
/// ‖revealed − expected‖ / ‖grads‖ (∞ when the shapes differ).
///
/// Measured against the momentum itself instead, a forger's error
/// (`2‖g‖ / β‖m‖` for the sign-flip forgery) shrinks as its momentum grows
/// over the steps, and fell under the bound: a forged chain passed at step
/// 8 of the P2P test with 0.493 against 0.5. Against one step's gradient it
/// stays near `2/β` however long the job runs, while an honest member's is
/// rounding.
pub fn chain_error(revealed: &[Vec<f32>], expected: &[Vec<f32>], grads: &[Vec<f32>]) -> f32 {
    let same_shape = |x: &[Vec<f32>]| {
        x.len() == expected.len() && x.iter().zip(expected).all(|(a, b)| a.len() == b.len())
    };
    if !same_shape(revealed) || !same_shape(grads) {
        return f32::INFINITY;
    }
    let diff: f64 = revealed
        .iter()
        .flatten()
        .zip(expected.iter().flatten())
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = grads.iter().flatten().map(|g| f64::from(*g).powi(2)).sum();
    if norm == 0.0 {
        return if diff == 0.0 { 0.0 } else { f32::INFINITY };
    }
    (diff / norm).sqrt() as f32
}

/// The commitment to a member's momentum carried by its contribution.
/// Streams the values: it runs on every step, and the hash equals
/// [`momentum_hash_bytes`] of the encoding without building it.
pub fn momentum_hash(momentum: &[Vec<f32>]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-momentum-v1");
    for v in momentum.iter().flatten() {
        h.update(&v.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// [`momentum_hash`] of a momentum already encoded by [`encode_momentum`]:
/// what a witness checks a revealed momentum against.
pub fn momentum_hash_bytes(encoded: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-momentum-v1");
    h.update(encoded);
    *h.finalize().as_bytes()
}

/// A momentum as revealed on the wire: every value, little-endian, in
/// parameter order.
pub fn encode_momentum(momentum: &[Vec<f32>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 * momentum.iter().map(Vec::len).sum::<usize>());
    for v in momentum.iter().flatten() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Decodes a revealed momentum into the shapes of `like`; None when the
/// length is wrong or a value is not finite.
pub fn decode_momentum(bytes: &[u8], like: &[Vec<f32>]) -> Option<Vec<Vec<f32>>> {
    if bytes.len() != 4 * like.iter().map(Vec::len).sum::<usize>() {
        return None;
    }
    let mut values = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let out: Vec<Vec<f32>> = like
        .iter()
        .map(|v| values.by_ref().take(v.len()).collect())
        .collect();
    out.iter().flatten().all(|x| x.is_finite()).then_some(out)
}

/// Names one audited contribution: every witness that fails it signs the
/// same id, which `report_fraud` carries on chain as its evidence.
pub fn evidence_id(
    job: &[u8; 32],
    epoch: u32,
    step: u32,
    member: u32,
    payload: &[u8; 32],
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-evidence-v1");
    h.update(job);
    h.update(&epoch.to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(&member.to_le_bytes());
    h.update(payload);
    *h.finalize().as_bytes()
}

/// Steps back whose payload hashes a new payload must not repeat.
pub const RECENT_STEPS: u32 = 8;

/// The screen's verdict on one step: what every node computes identically
/// from the step's payloads before applying it.
#[derive(Debug, Clone, Default)]
pub struct StepScreen {
    pub screens: Vec<Screen>,
    pub hashes: Vec<[u8; 32]>,
    /// The vote each payload gets: 0 when flagged, for every copy of a
    /// payload but the first, and for a payload re-sent from `recent`.
    pub weights: Vec<i32>,
}

/// The screen's thresholds: least share of a payload's coefficients that
/// some other member picked too, and least sign agreement with the others'
/// votes. A rule of the protocol, not a node's setting: the screen decides
/// which votes count, so nodes that judged with other thresholds would sum
/// differently and split (and seats of the sharded exchange would convict
/// each other of false sums). It changes only with the recipe's version.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScreenRule {
    pub support: f32,
    pub agreement: f32,
}

/// The screen every node applies, on both exchanges ([`screen`],
/// [`crate::shard::votes`]) and in the witnesses' samples.
pub const SCREEN: ScreenRule = ScreenRule {
    support: 0.2,
    agreement: 0.55,
};

/// Screens one step's payloads and weighs their votes (see [`screen`]).
pub fn screen_step(layout: &Layout, payloads: &[&Payload], recent: &[[u8; 32]]) -> StepScreen {
    let screens = screen(layout, payloads, recent);
    let hashes: Vec<[u8; 32]> = payloads
        .iter()
        .map(|p| payload_hash(layout.select, p))
        .collect();
    let weights = (0..payloads.len())
        .map(|j| {
            let first_copy = hashes[..j].iter().all(|h| *h != hashes[j]);
            let flagged = screens[j].flagged() && !screens[j].duplicate;
            i32::from(first_copy && !flagged && !recent.contains(&hashes[j]))
        })
        .collect();
    StepScreen {
        screens,
        hashes,
        weights,
    }
}

/// How a sent payload compares with a reference one.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Comparison {
    /// Share of the sent coefficients the reference picked too.
    pub overlap: f32,
    /// Share of those common coefficients with the same sign.
    pub agreement: f32,
}

impl Comparison {
    pub fn passes(&self, cfg: &AuditConfig) -> bool {
        self.overlap >= cfg.min_overlap && self.agreement >= cfg.min_agreement
    }
}

/// Compares `sent` with `reference` coefficient by coefficient. Both are
/// validated payloads of one layout (k per chunk, ascending indices).
pub fn compare(layout: &Layout, sent: &Payload, reference: &Payload) -> Comparison {
    let (mut total, mut common, mut same) = (0usize, 0usize, 0usize);
    for (p, (a, b)) in sent.params.iter().zip(&reference.params).enumerate() {
        let k = layout.topk[p];
        for (ch, (ia, ib)) in a.idx.chunks(k).zip(b.idx.chunks(k)).enumerate() {
            let (na, nb) = (&a.neg[ch * k..], &b.neg[ch * k..]);
            total += ia.len();
            // Both index lists ascend: a merge walk.
            let (mut i, mut j) = (0, 0);
            while i < ia.len() && j < ib.len() {
                match ia[i].cmp(&ib[j]) {
                    std::cmp::Ordering::Less => i += 1,
                    std::cmp::Ordering::Greater => j += 1,
                    std::cmp::Ordering::Equal => {
                        common += 1;
                        same += usize::from(na[i] == nb[j]);
                        i += 1;
                        j += 1;
                    }
                }
            }
        }
    }
    Comparison {
        overlap: common as f32 / total.max(1) as f32,
        agreement: if common == 0 {
            0.0
        } else {
            same as f32 / common as f32
        },
    }
}

/// The screen's view of one payload within its step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Screen {
    /// Share of its coefficients some other member picked too.
    pub support: f32,
    /// Among those, share whose sign matches the sign of the others' summed
    /// votes (a tie counts half).
    pub agreement: f32,
    /// The same payload ([`payload_hash`]) as another of the step or one in
    /// `recent`.
    pub duplicate: bool,
    /// The step had too few payloads to judge support and agreement.
    pub unjudged: bool,
}

impl Screen {
    /// Judged bad: the payload loses its vote, and every auditor audits it.
    pub fn flagged(&self) -> bool {
        self.flagged_under(&SCREEN)
    }

    fn flagged_under(&self, rule: &ScreenRule) -> bool {
        self.duplicate || self.support < rule.support || self.agreement < rule.agreement
    }

    /// Audited by every auditor: flagged, or in a step too small to screen
    /// (so a leader cannot dodge the screen by listing few payloads). An
    /// unjudged payload keeps its vote.
    pub fn needs_audit(&self) -> bool {
        self.unjudged || self.flagged()
    }
}

/// Payloads a step needs before the screen judges support and agreement.
pub const MIN_SCREENED: usize = 3;

/// Screens every payload of one step against the others. `recent` holds
/// payload hashes from earlier steps (a re-sent payload is a duplicate).
/// Two passes over the votes, no gradient computed. The first judges each
/// payload against everyone else's votes; the second judges the agreement
/// of the payloads it flagged again, against the votes of the payloads it
/// kept, so that attackers who overturn honest coefficients together (and
/// are flagged for it) cannot get the honest voters there flagged, and
/// their votes zeroed, with them.
pub fn screen(layout: &Layout, payloads: &[&Payload], recent: &[[u8; 32]]) -> Vec<Screen> {
    screen_under(layout, payloads, recent, &SCREEN)
}

fn screen_under(
    layout: &Layout,
    payloads: &[&Payload],
    recent: &[[u8; 32]],
    rule: &ScreenRule,
) -> Vec<Screen> {
    let hashes: Vec<[u8; 32]> = payloads
        .iter()
        .map(|p| payload_hash(layout.select, p))
        .collect();
    let mut out: Vec<Screen> = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| Screen {
            duplicate: recent.contains(h)
                || hashes.iter().enumerate().any(|(j, o)| j != i && o == h),
            ..Default::default()
        })
        .collect();
    // With fewer than three payloads there is no majority to be judged
    // against: a lone honest payload would look like garbage. Only copies
    // are flagged then, and every payload is audited instead
    // (`Screen::needs_audit`).
    if payloads.len() < MIN_SCREENED {
        for s in out.iter_mut() {
            s.support = 1.0;
            s.agreement = 1.0;
            s.unjudged = true;
        }
        return out;
    }
    let everyone = vec![true; payloads.len()];
    for (s, (support, agreement)) in out.iter_mut().zip(tally(layout, payloads, &everyone)) {
        s.support = support;
        s.agreement = agreement;
    }
    let kept: Vec<bool> = out.iter().map(|s| !s.flagged_under(rule)).collect();
    if kept.iter().all(|k| *k) || kept.iter().filter(|k| **k).count() < MIN_SCREENED {
        return out;
    }
    // The second pass only clears: a payload the first pass kept stays kept
    // (judging it again against fewer honest votes would let attackers the
    // screen cannot see flag more honest members, not fewer).
    for ((s, (_, agreement)), k) in out
        .iter_mut()
        .zip(tally(layout, payloads, &kept))
        .zip(&kept)
    {
        if !k {
            s.agreement = agreement;
        }
    }
    out
}

/// Per payload, (support, agreement): support is the share of its
/// coefficients some other payload picked too; agreement, among those, the
/// share whose sign matches the summed votes of the other payloads that
/// `counted` marks (a tie counts half: it is no evidence either way, and
/// counting it as agreement let colluders that overturn a margin m with
/// exactly m + 1 votes pass, since each of them sees the others tied).
fn tally(layout: &Layout, payloads: &[&Payload], counted: &[bool]) -> Vec<(f32, f32)> {
    let mut support = vec![0usize; payloads.len()];
    let mut agree = vec![0usize; payloads.len()];
    let mut total = vec![0usize; payloads.len()];
    for (p, dct) in layout.dcts.iter().enumerate() {
        let k = layout.topk[p];
        let size = dct.tiling.chunk_size();
        let mut votes = vec![0i32; size];
        let mut count = vec![0u32; size];
        for ch in 0..dct.tiling.chunks() {
            let range = ch * k..(ch + 1) * k;
            for (pl, c) in payloads.iter().zip(counted) {
                let s = &pl.params[p];
                for (i, neg) in s.idx[range.clone()].iter().zip(&s.neg[range.clone()]) {
                    if *c {
                        votes[*i as usize] += if *neg { -1 } else { 1 };
                    }
                    count[*i as usize] += 1;
                }
            }
            for (m, (pl, c)) in payloads.iter().zip(counted).enumerate() {
                let s = &pl.params[p];
                for (i, neg) in s.idx[range.clone()].iter().zip(&s.neg[range.clone()]) {
                    let own = if *neg { -1 } else { 1 };
                    total[m] += 1;
                    if count[*i as usize] > 1 {
                        support[m] += 1;
                        let others = votes[*i as usize] - if *c { own } else { 0 };
                        agree[m] += match (others * own).signum() {
                            1 => 2,
                            0 => 1,
                            _ => 0,
                        };
                    }
                }
            }
            for pl in payloads {
                for i in &pl.params[p].idx[range.clone()] {
                    votes[*i as usize] = 0;
                    count[*i as usize] = 0;
                }
            }
        }
    }
    (0..payloads.len())
        .map(|m| {
            let agreement = if support[m] == 0 {
                0.0
            } else {
                agree[m] as f32 / (2 * support[m]) as f32
            };
            (support[m] as f32 / total[m].max(1) as f32, agreement)
        })
        .collect()
}

/// The screen's agreement of one member's slice of a shard with the other
/// members' votes there, read off the shard's published vote sums (which
/// count the member's own vote: it is taken out): what a witness of the
/// sharded exchange screens by, since no node holds the step's payloads
/// whole. A tie counts half, as in the whole-payload screen. None when the
/// step lists too few members to judge by ([`MIN_SCREENED`]), or the slice
/// does not fit the sums.
pub fn slice_agreement(signs: &[bool], sums: &[i32], listed: usize) -> Option<f32> {
    if listed < MIN_SCREENED || signs.len() != sums.len() || signs.is_empty() {
        return None;
    }
    let agree: usize = signs
        .iter()
        .zip(sums)
        .map(|(neg, sum)| {
            let own: i64 = if *neg { -1 } else { 1 };
            match ((i64::from(*sum) - own) * own).signum() {
                1 => 2,
                0 => 1,
                _ => 0,
            }
        })
        .sum();
    Some(agree as f32 / (2 * signs.len()) as f32)
}

/// A payload's identity for duplicate checks (independent of its header):
/// what its sender chose. Under the top-k rule that is each sign with its
/// index; under the shared rule only the signs, since the positions are the
/// step's draw: a payload re-sent at a later step lands on other positions
/// but is still the same bits, and is a duplicate of the one first sent.
pub fn payload_hash(select: Select, p: &Payload) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-payload-v2");
    for s in &p.params {
        h.update(&(s.neg.len() as u64).to_le_bytes());
        for (i, n) in s.idx.iter().zip(&s.neg) {
            if select == Select::TopK {
                h.update(&i.to_le_bytes());
            }
            h.update(&[u8::from(*n)]);
        }
    }
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{CompressConfig, SparseSigns};

    fn layout() -> Layout {
        Layout::new(&[vec![16, 16]], &CompressConfig::default())
    }

    #[test]
    fn a_slice_s_agreement_is_read_off_the_shard_s_sums_as_the_whole_payload_screen_reads_it() {
        // Own votes +, -, +, -; the sums count them: the others' votes are
        // 2, 0 (a tie: half), -2 and 1.
        let signs = [false, true, false, true];
        let got = slice_agreement(&signs, &[3, -1, -1, 0], 4).unwrap();
        assert!((got - 3.0 / 8.0).abs() < 1e-6, "{got}");
        assert_eq!(
            slice_agreement(&signs, &[3, -1, -1, 0], 2),
            None,
            "no majority"
        );
        assert_eq!(slice_agreement(&signs, &[3, -1, -1], 4), None, "misfit");
        // Over a whole payload under the shared rule it is the screen's own
        // first-pass agreement.
        let layout = Layout::new(
            &[vec![16, 16], vec![24]],
            &CompressConfig {
                select: Select::Shared,
                topk: 5,
                max_chunk: 8,
                ..CompressConfig::default()
            },
        );
        let draw = crate::compress::Draw::for_step(&[4; 32], 3);
        let mut bits = blake3::Hasher::new().update(b"signs").finalize_xof();
        let payloads: Vec<Payload> = (0..5)
            .map(|_| Payload {
                params: (0..layout.dcts.len())
                    .map(|p| {
                        let idx = layout.drawn(p, draw);
                        let mut b = vec![0u8; idx.len()];
                        bits.fill(&mut b);
                        SparseSigns {
                            neg: b.iter().map(|x| x & 1 == 1).collect(),
                            idx,
                        }
                    })
                    .collect(),
            })
            .collect();
        let refs: Vec<&Payload> = payloads.iter().collect();
        let rule = ScreenRule {
            agreement: 0.0,
            ..SCREEN
        };
        let screens = screen_under(&layout, &refs, &[], &rule);
        let flat =
            |p: &Payload| -> Vec<bool> { p.params.iter().flat_map(|s| s.neg.clone()).collect() };
        let mut sums = vec![0i32; flat(&payloads[0]).len()];
        for p in &payloads {
            for (s, neg) in sums.iter_mut().zip(flat(p)) {
                *s += if neg { -1 } else { 1 };
            }
        }
        for (p, sc) in payloads.iter().zip(&screens) {
            let a = slice_agreement(&flat(p), &sums, payloads.len()).unwrap();
            assert!(
                (a - sc.agreement).abs() < 1e-6,
                "{a} against {}",
                sc.agreement
            );
        }
    }

    #[test]
    fn chain_error_is_in_gradients_of_the_step_and_refuses_other_shapes() {
        let expected = vec![vec![3.0, 4.0], vec![0.0]];
        let grads = vec![vec![0.0, 5.0], vec![0.0]];
        assert_eq!(chain_error(&expected, &expected, &grads), 0.0);
        let off = vec![vec![3.0, 4.5], vec![0.0]];
        assert!((chain_error(&off, &expected, &grads) - 0.1).abs() < 1e-6);
        assert_eq!(
            chain_error(&[vec![3.0, 4.0]], &expected, &grads),
            f32::INFINITY
        );
        assert_eq!(
            chain_error(&expected, &expected, &[vec![1.0]]),
            f32::INFINITY
        );
        assert_eq!(
            chain_error(&[vec![1.0]], &[vec![0.0]], &[vec![0.0]]),
            f32::INFINITY
        );
    }

    #[test]
    fn a_forged_chain_stays_two_gradients_off_however_large_the_momentum_grew() {
        // The sign-flip forgery reveals m' = -m - 2g/β at every step, so the
        // witness expects -m from the forged momentum before and sees
        // 2g/β more. The longer a job runs, the larger m is against g.
        let beta = 0.9f32;
        let g = vec![vec![0.1f32, -0.2, 0.05]];
        for scale in [1.0f32, 10.0, 1000.0] {
            let m: Vec<Vec<f32>> = vec![vec![1.0 * scale, 0.5 * scale, -2.0 * scale]];
            let expected: Vec<Vec<f32>> = vec![m[0].iter().map(|x| -x).collect()];
            let revealed: Vec<Vec<f32>> = vec![
                expected[0]
                    .iter()
                    .zip(&g[0])
                    .map(|(e, g)| e - 2.0 * g / beta)
                    .collect(),
            ];
            let err = chain_error(&revealed, &expected, &g);
            assert!((err - 2.0 / beta).abs() < 1e-3, "{err} at scale {scale}");
            assert!(err > AuditConfig::default().max_chain_error);
        }
    }

    fn payload(idx: &[u16], neg: &[bool]) -> Payload {
        Payload {
            params: vec![SparseSigns {
                idx: idx.to_vec(),
                neg: neg.to_vec(),
            }],
        }
    }

    #[test]
    fn comparison_counts_common_coefficients_and_their_signs() {
        let l = layout();
        let a = payload(&[1, 2, 3, 4], &[false, false, true, true]);
        assert_eq!(
            compare(&l, &a, &a),
            Comparison {
                overlap: 1.0,
                agreement: 1.0
            }
        );
        let b = payload(&[2, 3, 9, 10], &[true, true, false, false]);
        let c = compare(&l, &a, &b);
        assert_eq!(c.overlap, 0.5);
        assert_eq!(c.agreement, 0.5);
        assert!(!c.passes(&AuditConfig::default()));
    }

    #[test]
    fn a_revealed_momentum_round_trips_and_matches_its_commitment() {
        let m = vec![vec![1.0, -2.5], vec![0.25; 3]];
        let bytes = encode_momentum(&m);
        assert_eq!(momentum_hash_bytes(&bytes), momentum_hash(&m));
        assert_eq!(decode_momentum(&bytes, &m), Some(m.clone()));
        assert_eq!(decode_momentum(&bytes[4..], &m), None, "short");
        let mut nan = bytes.clone();
        nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(decode_momentum(&nan, &m), None, "not finite");
        let mut other = m.clone();
        other[1][2] = 0.5;
        assert_ne!(momentum_hash(&other), momentum_hash(&m));
    }

    #[test]
    fn the_screen_flags_copies_flips_and_garbage_but_not_agreeing_payloads() {
        let l = layout();
        let honest = [
            payload(&[1, 2, 3, 4], &[false, false, true, true]),
            payload(&[1, 2, 3, 5], &[false, false, true, false]),
            payload(&[1, 2, 4, 5], &[false, false, true, false]),
        ];
        let flipped = payload(&[1, 2, 3, 4], &[true, true, false, false]);
        let garbage = payload(&[100, 150, 200, 250], &[false, true, false, true]);
        let copy = honest[0].clone();
        let old = payload(&[6, 7, 8, 9], &[false; 4]);
        let all: Vec<&Payload> = honest
            .iter()
            .chain([&flipped, &garbage, &copy, &old])
            .collect();
        let s = screen(&l, &all, &[payload_hash(l.select, &old)]);
        assert!(!s[1].flagged() && !s[2].flagged(), "{s:?}");
        assert!(s[3].flagged(), "flipped {:?}", s[3]);
        assert!(s[4].flagged(), "garbage {:?}", s[4]);
        assert!(s[5].duplicate && s[0].duplicate, "copy and its original");
        assert!(s[6].duplicate, "re-sent");
        // Two payloads have no majority: neither is judged, copies still are.
        let pair = screen(&l, &[&honest[0], &garbage], &[]);
        assert!(pair.iter().all(|s| !s.flagged()), "{pair:?}");
        let copies = screen(&l, &[&honest[0], &copy], &[]);
        assert!(copies.iter().all(|s| s.duplicate));
        assert!(s.iter().all(|s| !s.unjudged));
    }

    /// Under the shared rule a payload re-sent at a later step lands on
    /// that step's drawn positions: other indices, the same bits. It is
    /// still a duplicate of the one first sent, and gets no vote.
    #[test]
    fn under_the_shared_rule_a_payload_re_sent_at_a_later_step_is_a_duplicate() {
        let l = Layout::new(&[vec![64, 64]], &CompressConfig::shared());
        let g = vec![
            (0..4096)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect::<Vec<_>>(),
        ];
        let sent = |step: u32, grads: &[Vec<f32>]| {
            let mut c = crate::compress::Compressor::new(&l, CompressConfig::shared());
            c.compress(&l, grads, crate::compress::Draw::for_step(&[1; 32], step))
                .unwrap()
        };
        let first = sent(0, &g);
        // The step-0 bytes sent again as step 1's: the wire delivers them
        // at step 1's positions.
        let resent = crate::wire::decode_payload(
            &crate::wire::encode_payload(&first, &l),
            &l,
            crate::compress::Draw::for_step(&[1; 32], 1),
        )
        .unwrap();
        assert_ne!(resent.params[0].idx, first.params[0].idx, "other positions");
        assert_eq!(resent.params[0].neg, first.params[0].neg, "the same bits");
        let recent = [payload_hash(l.select, &first)];
        let honest: Vec<Payload> = (0..3)
            .map(|j| {
                let gj = vec![
                    (0..4096)
                        .map(|i| ((i * (41 + 2 * j) % 103) as f32 - 51.0) / 50.0)
                        .collect(),
                ];
                sent(1, &gj)
            })
            .collect();
        let all: Vec<&Payload> = honest.iter().chain([&resent]).collect();
        let st = screen_step(&l, &all, &recent);
        assert!(st.screens[3].duplicate, "{:?}", st.screens[3]);
        assert_eq!(st.weights[3], 0);
        assert!(st.screens[..3].iter().all(|s| !s.duplicate));
        // Under top-k the indices are the sender's choice and count.
        let mut moved = first.clone();
        moved.params[0].idx[0] += 1;
        assert_ne!(
            payload_hash(Select::TopK, &moved),
            payload_hash(Select::TopK, &first)
        );
        assert_eq!(
            payload_hash(Select::Shared, &moved),
            payload_hash(Select::Shared, &first)
        );
    }

    #[test]
    fn a_step_too_small_to_screen_is_audited_in_full_and_keeps_its_votes() {
        let l = layout();
        let honest = payload(&[1, 2, 3, 4], &[false, false, true, true]);
        let garbage = payload(&[100, 150, 200, 250], &[false, true, false, true]);
        for few in [vec![&garbage], vec![&honest, &garbage]] {
            let st = screen_step(&l, &few, &[]);
            assert!(st.screens.iter().all(|s| s.needs_audit()), "{st:?}");
            assert!(st.weights.iter().all(|w| *w == 1), "{st:?}");
        }
        let three = [
            honest.clone(),
            payload(&[1, 2, 3, 5], &[false, false, true, false]),
            payload(&[1, 2, 4, 5], &[false, false, true, false]),
        ];
        let st = screen_step(&l, &three.iter().collect::<Vec<_>>(), &[]);
        assert!(st.screens.iter().all(|s| !s.needs_audit()), "{st:?}");
    }
}
