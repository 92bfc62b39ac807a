//! Adversarial members, for tests and benchmarks only. Each mode turns what
//! an honest member would send into an attack. Attackers are omniscient:
//! they see every honest payload of the step before sending theirs, the
//! strongest case for the aggregator.
//!
//! Payloads carry 1-bit signs of k coefficients per chunk, so attacks that
//! work on magnitudes (scaling, ALIE's mean − z·σ, IPM's −ε·mean) take their
//! sign-vote form here: scaling changes only which coefficients win; ALIE
//! votes against the honest majority where its margin is thinnest; IPM
//! votes against it where it is strongest.

use crate::compress::{Layout, Payload, SparseSigns};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Sends its honest payload with every sign flipped.
    SignFlip,
    /// Keeps its honest coefficients, with random signs.
    Noise,
    /// Multiplies its gradient by 100 before compressing.
    Scale,
    /// Votes against the honest majority where its margin is thinnest.
    Alie,
    /// Votes against the honest majority where it is strongest.
    Ipm,
    /// The attackers of a step act as one: they share the honest votes and
    /// split the work so that, together, they overturn as many honest
    /// coefficients as their votes can, thinnest margins first (ALIE
    /// coordinated). Not in [`Mode::ALL`]: added after the nine,
    /// as the strongest payload attack a third of the members can mount.
    Collude,
    /// Colluders that hide from the screen: each overturned coefficient
    /// gets one vote more than it needs, so every colluder sees the others'
    /// sum agree with it (no tie), and slots left over vote *with* the
    /// honest majority where it is strongest. Fewer coefficients
    /// overturned, a screen score like an honest member's. Not in
    /// [`Mode::ALL`].
    ColludeHidden,
    /// Computes nothing, sends random coefficients and signs.
    FreeRider,
    /// Computes nothing, re-sends another member's payload of the step.
    Copycat,
    /// Computes once, then re-sends that payload every step.
    Stale,
    /// Sends honest payloads; as a step leader it signs two different
    /// manifests (see `net::step`).
    EquivocatingLeader,
    /// Sends its payload sign-flipped and, when audited, reveals a momentum
    /// forged so the flipped payload recomputes exactly
    /// ([`forged_momentum`]). Not in [`Mode::ALL`]: the nine modes
    /// are what the benchmark sweeps; this one tests the momentum chain.
    ForgedMomentum,
    /// Sends honest payloads; as a step leader it states a state hash that
    /// is not the state's and lists, under another member's name, bytes
    /// that member never signed (network node only; not in [`Mode::ALL`]).
    LyingLeader,
    /// Sends honest payloads but answers a request for one only from the
    /// step's leader (to everyone else, an author that trickles); as a step
    /// leader it heartbeats but never publishes on even steps (a silent
    /// leader), and on odd ones lists its own payload under a hash nobody
    /// holds (an unservable manifest). Network node only; not in
    /// [`Mode::ALL`].
    Stalling,
    /// Sends its payload sign-flipped and never answers a request for its
    /// momentum (nor refuses one): it stays online and lets every reveal
    /// of its flagged payloads time out. Network node only; not in
    /// [`Mode::ALL`].
    SilentReveal,
    /// Sends honest payloads; as an aggregator of the sharded exchange it
    /// signs and serves a vote sum one vote off at one position
    /// (`net::exchange`). Network node only; not in [`Mode::ALL`].
    LyingAggregator,
    /// Sends honest payloads; in the sharded exchange, at step
    /// [`WITHHELD_STEP`], pushes no slice and serves none of its own (nor
    /// hands one over), yet announces as if every shard held it: a listed
    /// contribution nobody can sum. Network node only; not in
    /// [`Mode::ALL`].
    Withholding,
    /// Sends honest payloads announced as computed on a made-up state, so
    /// that no witness of the sharded exchange audits them; as a step
    /// leader it lists its own anyway (honest leaders list none of them):
    /// votes that would count unaudited. Network node only; not in
    /// [`Mode::ALL`].
    ForeignBasis,
}

/// The state [`Mode::ForeignBasis`] claims its contributions were computed
/// on.
pub const FOREIGN_BASIS: [u8; 32] = [0xee; 32];

/// The step at which [`Mode::Withholding`] withholds its slices.
pub const WITHHELD_STEP: u32 = 2;

impl Mode {
    pub const ALL: [Mode; 9] = [
        Mode::SignFlip,
        Mode::Noise,
        Mode::Scale,
        Mode::Alie,
        Mode::Ipm,
        Mode::FreeRider,
        Mode::Copycat,
        Mode::Stale,
        Mode::EquivocatingLeader,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::SignFlip => "sign-flip",
            Mode::Noise => "noise",
            Mode::Scale => "scale",
            Mode::Alie => "alie",
            Mode::Ipm => "ipm",
            Mode::Collude => "collude",
            Mode::ColludeHidden => "collude-hidden",
            Mode::FreeRider => "free-rider",
            Mode::Copycat => "copycat",
            Mode::Stale => "stale",
            Mode::EquivocatingLeader => "equivocating-leader",
            Mode::ForgedMomentum => "forged-momentum",
            Mode::LyingLeader => "lying-leader",
            Mode::Stalling => "stalling",
            Mode::SilentReveal => "silent-reveal",
            Mode::LyingAggregator => "lying-aggregator",
            Mode::Withholding => "withholding",
            Mode::ForeignBasis => "foreign-basis",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .chain([
                Mode::Collude,
                Mode::ColludeHidden,
                Mode::ForgedMomentum,
                Mode::LyingLeader,
                Mode::Stalling,
                Mode::SilentReveal,
                Mode::LyingAggregator,
                Mode::Withholding,
                Mode::ForeignBasis,
            ])
            .find(|m| m.name() == s)
    }

    /// Whether the attacker computes a gradient this step (the free-rider,
    /// the copycat and the stale member after its first step save it).
    pub fn computes(self, first_step: bool) -> bool {
        match self {
            Mode::FreeRider | Mode::Copycat => false,
            Mode::Stale => first_step,
            _ => true,
        }
    }

    /// The gradient multiplier the attacker trains with.
    pub fn grad_scale(self) -> f32 {
        if self == Mode::Scale { 100.0 } else { 1.0 }
    }
}

/// What an attacker knows when it forges its payload.
pub struct Attack<'a> {
    pub layout: &'a Layout,
    /// Every honest payload of the step.
    pub honest: &'a [&'a Payload],
    /// Its own honestly computed payload, if it computed one.
    pub own: Option<&'a Payload>,
    /// The payload it sent first (what a stale member re-sends).
    pub first: Option<&'a Payload>,
    /// Per-attacker, per-step randomness.
    pub seed: [u8; 32],
    /// How many attackers send this step (the colluders), and this one's
    /// place among them, `0..crew`.
    pub crew: usize,
    pub rank: usize,
}

/// A small deterministic generator (tests and benchmarks must repeat).
struct Rng(u64);

impl Rng {
    fn new(seed: &[u8; 32]) -> Self {
        Self(u64::from_le_bytes(seed[..8].try_into().unwrap_or([0; 8])) | 1)
    }
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The payload `mode` sends. Falls back to an empty-handed garbage payload
/// where the mode's input is missing (e.g. a copycat with nobody to copy).
pub fn forge(mode: Mode, a: &Attack) -> Payload {
    let mut rng = Rng::new(&a.seed);
    match (mode, a.own) {
        (Mode::SignFlip | Mode::ForgedMomentum | Mode::SilentReveal, Some(own)) => {
            map_signs(own, |_, neg| !neg)
        }
        (Mode::Noise, Some(own)) => map_signs(own, |_, _| rng.next() & 1 == 1),
        (
            Mode::Scale
            | Mode::EquivocatingLeader
            | Mode::LyingLeader
            | Mode::Stalling
            | Mode::LyingAggregator
            | Mode::Withholding
            | Mode::ForeignBasis,
            Some(own),
        ) => own.clone(),
        (Mode::Alie, _) => against_majority(a, &mut rng, false),
        (Mode::Ipm, _) => against_majority(a, &mut rng, true),
        (Mode::Collude, _) if !a.honest.is_empty() => collude(a, false),
        (Mode::ColludeHidden, _) if !a.honest.is_empty() => collude(a, true),
        (Mode::Copycat, _) if !a.honest.is_empty() => a.honest[rng.below(a.honest.len())].clone(),
        // Its first step is honest; from then on it re-sends that payload.
        (Mode::Stale, own) if a.first.or(own).is_some() => {
            a.first.or(own).cloned().unwrap_or_default()
        }
        _ => garbage(a.layout, &mut rng),
    }
}

/// The momentum a sign-flipper reveals so that its flipped payload passes a
/// one-step audit: with `m' = −m − 2g/β`, the witness compresses
/// `β·m' + g = −(β·m + g)`, whose top-k are the honest ones with every
/// sign flipped.
pub fn forged_momentum(before: &[Vec<f32>], grads: &[Vec<f32>], decay: f32) -> Vec<Vec<f32>> {
    before
        .iter()
        .zip(grads)
        .map(|(m, g)| m.iter().zip(g).map(|(m, g)| -m - 2.0 * g / decay).collect())
        .collect()
}

fn map_signs(p: &Payload, mut f: impl FnMut(u16, bool) -> bool) -> Payload {
    Payload {
        params: p
            .params
            .iter()
            .map(|s| SparseSigns {
                idx: s.idx.clone(),
                neg: s.idx.iter().zip(&s.neg).map(|(i, n)| f(*i, *n)).collect(),
            })
            .collect(),
    }
}

/// k distinct random coefficients per chunk with random signs.
fn garbage(layout: &Layout, rng: &mut Rng) -> Payload {
    let params = layout
        .dcts
        .iter()
        .enumerate()
        .map(|(p, dct)| {
            let (k, size) = (layout.topk[p], dct.tiling.chunk_size());
            let mut s = SparseSigns::default();
            for _ in 0..dct.tiling.chunks() {
                let mut picked: Vec<u16> = Vec::with_capacity(k);
                while picked.len() < k {
                    let i = rng.below(size) as u16;
                    if !picked.contains(&i) {
                        picked.push(i);
                    }
                }
                picked.sort_unstable();
                s.neg.extend(picked.iter().map(|_| rng.next() & 1 == 1));
                s.idx.extend(picked);
            }
            s
        })
        .collect();
    Payload { params }
}

/// Per chunk, votes against the honest sum on k coefficients: the strongest
/// (`strongest`, IPM) or the thinnest non-zero margins (ALIE), picked at
/// random among twice as many candidates so colluders do not send
/// byte-identical payloads.
fn against_majority(a: &Attack, rng: &mut Rng, strongest: bool) -> Payload {
    if a.honest.is_empty() {
        return garbage(a.layout, rng);
    }
    let params = a
        .layout
        .dcts
        .iter()
        .enumerate()
        .map(|(p, dct)| {
            let (k, size) = (a.layout.topk[p], dct.tiling.chunk_size());
            let mut votes = vec![0i32; size];
            let mut s = SparseSigns::default();
            for ch in 0..dct.tiling.chunks() {
                let mut cands: Vec<(u16, i32)> = honest_sums(a, p, ch, &mut votes)
                    .into_iter()
                    .filter(|(_, v)| *v != 0)
                    .collect();
                cands.sort_by_key(|(i, v)| (if strongest { -v.abs() } else { v.abs() }, *i));
                cands.truncate(2 * k);
                // Too few contested coefficients: fill with untouched ones.
                let mut fill = 0u16;
                while cands.len() < k {
                    if !cands.iter().any(|(i, _)| *i == fill) {
                        cands.push((fill, 0));
                    }
                    fill += 1;
                }
                while cands.len() > k {
                    cands.swap_remove(rng.below(cands.len()));
                }
                cands.sort_unstable();
                s.neg.extend(cands.iter().map(|(_, v)| *v > 0));
                s.idx.extend(cands.iter().map(|(i, _)| *i));
            }
            debug_assert!(s.idx.iter().all(|i| (*i as usize) < size));
            s
        })
        .collect();
    Payload { params }
}

/// Honest vote sums of one chunk, as (coefficient, sum) for every touched
/// coefficient, in order of first touch.
fn honest_sums(a: &Attack, p: usize, ch: usize, votes: &mut [i32]) -> Vec<(u16, i32)> {
    let k = a.layout.topk[p];
    let range = ch * k..(ch + 1) * k;
    let mut touched: Vec<u16> = Vec::new();
    for h in a.honest {
        let hs = &h.params[p];
        for (i, neg) in hs.idx[range.clone()].iter().zip(&hs.neg[range.clone()]) {
            if votes[*i as usize] == 0 && !touched.contains(i) {
                touched.push(*i);
            }
            votes[*i as usize] += if *neg { -1 } else { 1 };
        }
    }
    let out = touched.iter().map(|i| (*i, votes[*i as usize])).collect();
    for i in touched {
        votes[i as usize] = 0;
    }
    out
}

/// The colluders' shared plan for one chunk: every colluder works it out
/// alike from the same honest votes, and sends its own share. Honest
/// coefficients are taken thinnest margin first; one with margin m gets
/// m + 1 votes against it (overturned) from the m + 1 colluders with the
/// most slots left, while that many have any. Slots left over vote against
/// further coefficients one each (cancelling margin-1 votes), then fill
/// with coefficients nobody chose. `hidden` ([`Mode::ColludeHidden`]):
/// m + 2 votes per overturned coefficient, and left-over slots vote with
/// the honest majority, strongest first.
fn collude(a: &Attack, hidden: bool) -> Payload {
    let (crew, rank) = (a.crew.max(1), a.rank.min(a.crew.max(1) - 1));
    let params = a
        .layout
        .dcts
        .iter()
        .enumerate()
        .map(|(p, dct)| {
            let (k, size) = (a.layout.topk[p], dct.tiling.chunk_size());
            let mut votes = vec![0i32; size];
            let mut s = SparseSigns::default();
            for ch in 0..dct.tiling.chunks() {
                let mut sums: Vec<(u16, i32)> = honest_sums(a, p, ch, &mut votes)
                    .into_iter()
                    .filter(|(_, v)| *v != 0)
                    .collect();
                sums.sort_by_key(|(i, v)| (v.abs(), *i));
                let mut left = vec![k; crew];
                let mut mine: Vec<(u16, bool)> = Vec::with_capacity(k);
                let mut used = vec![false; sums.len()];
                let mut give = |need: usize, left: &mut Vec<usize>, (i, neg): (u16, bool)| {
                    let mut order: Vec<usize> = (0..crew).filter(|c| left[*c] > 0).collect();
                    if order.len() < need {
                        return false;
                    }
                    order.sort_by_key(|c| (usize::MAX - left[*c], *c));
                    for &c in &order[..need] {
                        left[c] -= 1;
                        if c == rank {
                            mine.push((i, neg));
                        }
                    }
                    true
                };
                for (n, &(i, v)) in sums.iter().enumerate() {
                    let need = v.unsigned_abs() as usize + 1 + usize::from(hidden);
                    if need <= crew && give(need, &mut left, (i, v > 0)) {
                        used[n] = true;
                    }
                }
                // Left-over slots: cancel thin margins, or (hidden) agree
                // with the strongest ones.
                let rest: Vec<(u16, bool)> = if hidden {
                    (sums.iter().zip(&used).rev())
                        .filter(|(_, u)| !**u)
                        .map(|(&(i, v), _)| (i, v < 0))
                        .collect()
                } else {
                    (sums.iter().zip(&used))
                        .filter(|(_, u)| !**u)
                        .map(|(&(i, v), _)| (i, v > 0))
                        .collect()
                };
                for c in rest {
                    if !give(1, &mut left, c) {
                        break;
                    }
                }
                // Fill: coefficients nobody honest chose where there are
                // any, from a place of each colluder's own.
                let start = rank * k;
                for untouched_only in [true, false] {
                    for j in 0..size {
                        if mine.len() == k {
                            break;
                        }
                        let i = ((start + j) % size) as u16;
                        let free = !mine.iter().any(|(m, _)| *m == i);
                        if free && (!untouched_only || sums.iter().all(|(t, _)| *t != i)) {
                            mine.push((i, false));
                        }
                    }
                }
                mine.sort_unstable_by_key(|(i, _)| *i);
                s.idx.extend(mine.iter().map(|(i, _)| *i));
                s.neg.extend(mine.iter().map(|(_, n)| *n));
            }
            s
        })
        .collect();
    Payload { params }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::CompressConfig;

    #[test]
    fn every_forged_payload_is_well_formed_and_modes_round_trip_by_name() {
        let layout = Layout::new(&[vec![64, 64], vec![10]], &CompressConfig::default());
        let mut rng = Rng::new(&[3; 32]);
        let honest: Vec<Payload> = (0..4).map(|_| garbage(&layout, &mut rng)).collect();
        let refs: Vec<&Payload> = honest.iter().collect();
        for mode in Mode::ALL {
            assert_eq!(Mode::parse(mode.name()), Some(mode));
            let a = Attack {
                layout: &layout,
                honest: &refs,
                own: Some(&honest[0]),
                first: Some(&honest[1]),
                seed: [9; 32],
                crew: 2,
                rank: 1,
            };
            let p = forge(mode, &a);
            p.validate(&layout)
                .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        }
        assert_eq!(Mode::parse("nonsense"), None);
    }

    /// How far the attackers move the step's applied signs from the honest
    /// ones: per coefficient, |sign(honest) − sign(honest + attackers)|,
    /// so an overturned vote counts 2 and a cancelled (or added) one 1.
    fn damage(layout: &Layout, honest: &[&Payload], attackers: &[Payload]) -> i32 {
        let sums = |ps: &[&Payload]| {
            let mut v = std::collections::HashMap::<(usize, usize, u16), i32>::new();
            for p in ps {
                for (n, s) in p.params.iter().enumerate() {
                    let k = layout.topk[n];
                    for (j, (i, neg)) in s.idx.iter().zip(&s.neg).enumerate() {
                        *v.entry((n, j / k, *i)).or_default() += if *neg { -1 } else { 1 };
                    }
                }
            }
            v
        };
        let before = sums(honest);
        let all: Vec<&Payload> = honest.iter().copied().chain(attackers).collect();
        sums(&all)
            .iter()
            .map(|(c, v)| (v.signum() - before.get(c).copied().unwrap_or(0).signum()).abs())
            .sum()
    }

    #[test]
    fn colluders_do_more_damage_than_the_same_attackers_alone() {
        let layout = Layout::new(&[vec![64, 64], vec![10]], &CompressConfig::default());
        let mut rng = Rng::new(&[5; 32]);
        // Six honest members in three pairs that agree (honest members'
        // choices overlap, so most margins are 2, not 1).
        let distinct: Vec<Payload> = (0..3).map(|_| garbage(&layout, &mut rng)).collect();
        let refs: Vec<&Payload> = distinct.iter().chain(&distinct).collect();
        let crew = 3;
        let forge_all = |mode| -> Vec<Payload> {
            (0..crew)
                .map(|rank| {
                    let p = forge(
                        mode,
                        &Attack {
                            layout: &layout,
                            honest: &refs,
                            own: None,
                            first: None,
                            seed: [rank as u8 + 1; 32],
                            crew,
                            rank,
                        },
                    );
                    p.validate(&layout).unwrap();
                    p
                })
                .collect()
        };
        let together = damage(&layout, &refs, &forge_all(Mode::Collude));
        let alone = damage(&layout, &refs, &forge_all(Mode::Alie));
        // Against margins of 2 a lone vote changes no sign: ALIE's three
        // attackers overturn a coefficient only where all three happen to
        // pick it; colluders give each of four coefficients per chunk the
        // three votes that overturn it.
        assert!(together > alone, "collude {together}, alie {alone}");
        assert_eq!(Mode::parse("collude"), Some(Mode::Collude));
    }

    #[test]
    fn colluders_that_overturn_margins_are_flagged_and_hiding_from_the_screen_costs_damage() {
        let layout = Layout::new(&[vec![64, 64], vec![10]], &CompressConfig::default());
        // Six honest members; per chunk nine coefficients with fixed signs,
        // member j picking j to j + 3 (margins 1 to 4, all honest votes
        // alike in sign).
        let honest: Vec<Payload> = (0..6)
            .map(|j| Payload {
                params: (layout.dcts.iter())
                    .map(|dct| {
                        let step = dct.tiling.chunk_size() / 9;
                        let mut s = SparseSigns::default();
                        for _ in 0..dct.tiling.chunks() {
                            let mut picks: Vec<(u16, bool)> = (0..4)
                                .map(|t| {
                                    let q = (j + t) % 9;
                                    ((q * step) as u16, q % 2 == 0)
                                })
                                .collect();
                            picks.sort_unstable();
                            s.idx.extend(picks.iter().map(|(i, _)| *i));
                            s.neg.extend(picks.iter().map(|(_, n)| *n));
                        }
                        s
                    })
                    .collect(),
            })
            .collect();
        let refs: Vec<&Payload> = honest.iter().collect();
        let crew = 3;
        let forge_all = |mode| -> Vec<Payload> {
            (0..crew)
                .map(|rank| {
                    let a = Attack {
                        layout: &layout,
                        honest: &refs,
                        own: None,
                        first: None,
                        seed: [rank as u8 + 1; 32],
                        crew,
                        rank,
                    };
                    forge(mode, &a)
                })
                .collect()
        };
        let screened = |attackers: &[Payload]| {
            let all: Vec<&Payload> = refs.iter().copied().chain(attackers).collect();
            crate::audit::screen(&layout, &all, &[])
        };
        // Each colluder's overturning vote sees the others' votes tied
        // (margin m against, m other colluders for): a tie counts half, so
        // no colluder scores above 0.5 and the screen flags every one. The
        // honest voters they overturned disagree with the sum; judged again
        // against the payloads kept, none of them stays flagged.
        let open = forge_all(Mode::Collude);
        let s = screened(&open);
        assert!(
            s[6..].iter().all(|s| s.agreement <= 0.5 && s.flagged()),
            "{:?}",
            &s[6..]
        );
        assert!(s[..6].iter().all(|s| !s.flagged()), "{:?}", &s[..6]);
        // To pass, colluders need m + 2 votes per overturned coefficient
        // (three overturn margins of 1 only) and vote with the honest
        // majority with the slots left: less damage.
        let hidden = forge_all(Mode::ColludeHidden);
        let s = screened(&hidden);
        assert!(s[6..].iter().all(|s| !s.flagged()), "{:?}", &s[6..]);
        let (open, hidden) = (
            damage(&layout, &refs, &open),
            damage(&layout, &refs, &hidden),
        );
        assert!(hidden < open, "open {open}, hidden {hidden}");
        assert_eq!(Mode::parse("collude-hidden"), Some(Mode::ColludeHidden));
    }
}
