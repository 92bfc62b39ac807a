//! The node's side of the sharded exchange: turns [`Exchange`]'s actions
//! into slice pushes, slice and sum requests and signed sum hashes (sent
//! to every member by request, and carried by every sum served), keeps
//! the slices and sums this node holds or serves, and hands the trainer a
//! step's sums once every shard's is accepted. The protocol's decisions
//! are all the state machine's (`net::exchange`); this is its I/O.
//!
//! What a member's slices are is fixed by the root it signed in its own
//! announcement: a root only a manifest names (a leader's doing) proves
//! nothing, so a slice is checked against announced roots only.

use super::gossip::acceptance;
use super::*;
use crate::compress::Layout;
use crate::compress::Payload;
use crate::net::exchange::{self, Action as XAction, Exchange, ManifestId, Plan};
use crate::net::guard::{Announced, Sample};
use crate::net::msg::{Announce, Claim, Slice, SumHash, Withheld};
use crate::shard::{self, Shard};

/// This node's slices of one contribution, with their Merkle paths.
struct Own {
    slices: Vec<Vec<bool>>,
    paths: Vec<Vec<[u8; 32]>>,
}

/// Why this node asked for a member's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// To sum it, as a seat of the shard.
    Seat,
    /// To recompute the shard's sum.
    Recompute,
    /// To check a seat's claim that nobody serves it.
    Probe,
    /// To audit the member: its whole payload, a slice at a time.
    Audit,
    /// To screen the member's contribution by one slice.
    Sample,
}

/// A member's payload being fetched as slices for an audit: the root it
/// signed, the slices in so far, and how many sources each was asked of.
struct Gather {
    root: [u8; 32],
    got: Vec<Option<Vec<bool>>>,
    tried: Vec<usize>,
}

/// A signed sum hash: (step, shard, aggregator, manifest, hash).
type ClaimKey = (u32, u32, u32, ManifestId, [u8; 32]);

/// A recomputation under way: the slices `manifest` lists, fetched.
struct Recompute {
    manifest: ManifestId,
    members: Vec<u32>,
    got: BTreeMap<u32, Vec<bool>>,
}

/// A manifest the step machine told this node to apply, waiting for its
/// sums.
struct ToApply {
    manifest: Manifest,
    same_history: bool,
    last_produced_us: u64,
}

pub(super) struct Sharded {
    ex: Exchange,
    plan: Plan,
    layout: Layout,
    shards: Vec<Shard>,
    /// Steps opened in the exchange, with their seats per shard.
    seats: BTreeMap<u32, Vec<Vec<u32>>>,
    own: BTreeMap<u32, Own>,
    /// This node's announcement per step, gossiped once every shard holds
    /// its slice at one aggregator at least.
    unannounced: BTreeMap<u32, Announce>,
    /// The root each member signed in its announcement: (step, member).
    roots: BTreeMap<(u32, u32), [u8; 32]>,
    /// The root the step's manifest lists per member: what every node that
    /// takes that manifest checks slices against, whatever announcement it
    /// heard (a member that announced two roots to two halves of the job
    /// would otherwise split them, and get honest seats convicted).
    listed: BTreeMap<(u32, u32), [u8; 32]>,
    /// Slices pushed before their author's announcement was heard.
    unchecked: BTreeMap<(u32, u32, u32), Slice>,
    /// Slices held and checked: (step, shard, member).
    held: BTreeMap<(u32, u32, u32), Slice>,
    /// Sums by (step, shard, hash): fetched, recomputed or published.
    sums: BTreeMap<(u32, u32, [u8; 32]), Vec<i32>>,
    /// What this node serves as an aggregator: (step, shard, manifest).
    serving: BTreeMap<(u32, u32, ManifestId), Vec<i32>>,
    /// Signed sum hashes heard: (step, shard, aggregator, manifest, hash)
    /// → signature, the proof a conviction quotes.
    claims: BTreeMap<ClaimKey, [u8; 64]>,
    recomputing: BTreeMap<(u32, u32), Recompute>,
    /// What this node's own recomputations found each shard's sum to be,
    /// per (step, shard, manifest): what decides others' accusations.
    truths: BTreeMap<(u32, u32, ManifestId), [u8; 32]>,
    /// Others' false-sum accusations waiting for this node's own
    /// recomputation of the shard: counted once it proves the claim false.
    pending: BTreeMap<ClaimKey, Vec<Accuse>>,
    /// Per step: the manifest the exchange sums, and its listed members.
    manifests: BTreeMap<u32, (ManifestId, Vec<u32>)>,
    to_apply: BTreeMap<u32, ToApply>,
    /// Payloads fetched for audits: (step, member).
    gathers: BTreeMap<(u32, u32), Gather>,
    /// Slices fetched for the screen: (step, member, shard) → the sample,
    /// and the sources asked so far.
    samples: BTreeMap<(u32, u32, u32), (Sample, usize)>,
}

/// What became of an accusation on the false-sum ground.
pub(super) enum FalseSum {
    /// Another ground.
    Other,
    /// The quoted claim is not the aggregator's: dropped.
    Forged,
    /// This node proved the claim false itself: counted now.
    Confirmed,
    /// Kept until this node's own recomputation decides (or never counted,
    /// if it finds the claim true).
    Held,
    /// Not counted, not forwarded: not a witness's, a self-accusation,
    /// another epoch, a step this node does not keep, a claim this node
    /// found true, or a job with no aggregators.
    Refused,
}

/// A sample's key (step, member, shard) as a slice's (step, shard, member).
fn key_slice((step, member, shard): (u32, u32, u32)) -> (u32, u32, u32) {
    (step, shard, member)
}

/// Accusations a node holds per witness, waiting for its own
/// recomputations: one witness cannot crowd the others out.
const MAX_PENDING_PER_WITNESS: usize = 256;

impl Sharded {
    pub(super) fn new(cfg: &NodeConfig, plan: Plan) -> Result<Self, String> {
        let shapes: Vec<Vec<usize>> = cfg
            .train
            .model
            .shapes()
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        let layout = Layout::new(&shapes, &cfg.train.compress);
        let shards = shard::split(&layout, plan.shards).map_err(|e| e.to_string())?;
        if let Some(s) = shards.iter().find(|s| s.positions > msg::MAX_SLICE_SIGNS) {
            return Err(format!(
                "a shard of {} positions is over the {} a slice carries: use more shards",
                s.positions,
                msg::MAX_SLICE_SIGNS
            ));
        }
        Ok(Self {
            ex: Exchange::new(cfg.me, plan.timing),
            plan,
            layout,
            shards,
            seats: BTreeMap::new(),
            own: BTreeMap::new(),
            unannounced: BTreeMap::new(),
            roots: BTreeMap::new(),
            listed: BTreeMap::new(),
            unchecked: BTreeMap::new(),
            held: BTreeMap::new(),
            sums: BTreeMap::new(),
            serving: BTreeMap::new(),
            claims: BTreeMap::new(),
            recomputing: BTreeMap::new(),
            truths: BTreeMap::new(),
            pending: BTreeMap::new(),
            manifests: BTreeMap::new(),
            to_apply: BTreeMap::new(),
            gathers: BTreeMap::new(),
            samples: BTreeMap::new(),
        })
    }

    /// Forgets every step before `step`.
    fn forget_before(&mut self, step: u32) {
        self.ex.forget_before(step);
        self.seats = self.seats.split_off(&step);
        self.own = self.own.split_off(&step);
        self.unannounced = self.unannounced.split_off(&step);
        self.roots = self.roots.split_off(&(step, 0));
        self.listed = self.listed.split_off(&(step, 0));
        self.unchecked = self.unchecked.split_off(&(step, 0, 0));
        self.held = self.held.split_off(&(step, 0, 0));
        self.sums = self.sums.split_off(&(step, 0, [0; 32]));
        self.serving = self.serving.split_off(&(step, 0, [0; 32]));
        self.claims = self.claims.split_off(&(step, 0, 0, [0; 32], [0; 32]));
        self.recomputing = self.recomputing.split_off(&(step, 0));
        self.truths = self.truths.split_off(&(step, 0, [0; 32]));
        self.pending = self.pending.split_off(&(step, 0, 0, [0; 32], [0; 32]));
        self.manifests = self.manifests.split_off(&step);
        self.to_apply = self.to_apply.split_off(&step);
        self.gathers = self.gathers.split_off(&(step, 0));
        self.samples = self.samples.split_off(&(step, 0, 0));
    }

    /// The signed hashes held for `shard` of `step` over `manifest`, as a
    /// sum answer carries them.
    fn claims_of(&self, step: u32, shard: u32, manifest: ManifestId) -> Vec<Claim> {
        let lo = (step, shard, 0, [0; 32], [0; 32]);
        let hi = (step, shard, u32::MAX, [u8::MAX; 32], [u8::MAX; 32]);
        self.claims
            .range(lo..=hi)
            .filter(|(k, _)| k.3 == manifest)
            .take(msg::MAX_CLAIMS)
            .map(|(k, sig)| Claim {
                aggregator: k.2,
                hash: k.4,
                sig: *sig,
            })
            .collect()
    }

    /// `member`'s slice of `shard` at `step`, if this node holds it.
    fn slice(&self, me: u32, step: u32, shard: u32, member: u32) -> Option<Slice> {
        if member == me {
            let own = self.own.get(&step)?;
            return Some(Slice {
                signs: own.slices.get(shard as usize)?.clone(),
                path: own.paths[shard as usize].clone(),
            });
        }
        self.held.get(&(step, shard, member)).cloned()
    }

    /// A request for `member`'s slice of `shard` failed.
    fn slice_failed(&mut self, now: Duration, (step, shard, member): (u32, u32, u32), why: Why) {
        match why {
            Why::Recompute => {
                if self.recomputing.remove(&(step, shard)).is_some() {
                    self.ex.on_recompute_failed(now, step, shard);
                }
            }
            Why::Seat => self.ex.on_slice_failed(now, step, shard, member),
            Why::Probe => self.ex.on_probe_failed(now, step, shard, member),
            // Handled before the exchange sees it (`on_audit_slice`,
            // `on_sample`).
            Why::Audit | Why::Sample => {}
        }
    }

    /// Whether `slice` is the slice of `shard` under `root`.
    fn proves(&self, shard: u32, slice: &Slice, root: &[u8; 32]) -> bool {
        self.shards.get(shard as usize).map(|s| s.positions) == Some(slice.signs.len())
            && slice.proves(root, self.shards.len(), shard as usize)
    }

    /// Who may hold `member`'s slice of `shard`: the member, then the
    /// shard's seats (never this node).
    fn sources(&self, me: u32, step: u32, shard: u32, member: u32) -> Vec<u32> {
        let seats = self
            .seats
            .get(&step)
            .and_then(|s| s.get(shard as usize))
            .cloned()
            .unwrap_or_default();
        let mut out = vec![member];
        out.extend(seats.into_iter().filter(|&m| m != member));
        out.retain(|&m| m != me);
        out
    }

    /// The audited payload once every slice is in: None while some are
    /// missing, Some(None) if they do not make a payload.
    fn gathered(&mut self, job: &[u8; 32], step: u32, member: u32) -> Option<Option<Payload>> {
        let g = self.gathers.get(&(step, member))?;
        if g.got.iter().any(Option::is_none) {
            return None;
        }
        let g = self.gathers.remove(&(step, member))?;
        let slices: Vec<Vec<bool>> = g.got.into_iter().flatten().collect();
        let draw = crate::compress::Draw::for_step(job, step);
        Some(shard::assemble(&self.shards, &self.layout, &slices, draw).ok())
    }

    /// Sums a recomputation once every slice is in (a sum that fails is a
    /// failed recomputation: the exchange asks again).
    fn finish_recompute(&mut self, now: Duration, step: u32, shard: u32) {
        let Some(r) = self.recomputing.get(&(step, shard)) else {
            return;
        };
        if !r.members.iter().all(|m| r.got.contains_key(m)) {
            return;
        }
        let Some(r) = self.recomputing.remove(&(step, shard)) else {
            return;
        };
        // Every member's slice, in the manifest's order, weighed by the
        // shard's screen as its seats weigh them.
        let slices: Vec<&[bool]> = r
            .members
            .iter()
            .filter_map(|m| r.got.get(m))
            .map(Vec::as_slice)
            .collect();
        let weighted: Vec<(&[bool], i32)> =
            slices.iter().copied().zip(shard::votes(&slices)).collect();
        let Ok(sums) = shard::sum(&weighted, self.shards[shard as usize].positions) else {
            self.ex.on_recompute_failed(now, step, shard);
            return;
        };
        let h = msg::sum_hash(&sums);
        self.sums.insert((step, shard, h), sums);
        self.truths.insert((step, shard, r.manifest), h);
        self.ex.on_recomputed(step, shard, r.manifest, h);
    }

    /// Others' held accusations this node's recomputations have decided:
    /// those quoting a hash other than the truth, to count; the rest are
    /// dropped (they quoted a true claim).
    fn decided(&mut self) -> Vec<Accuse> {
        let keys: Vec<ClaimKey> = self
            .pending
            .keys()
            .filter(|k| self.truths.contains_key(&(k.0, k.1, k.3)))
            .copied()
            .collect();
        let mut out = Vec::new();
        for k in keys {
            let held = self.pending.remove(&k).unwrap_or_default();
            if self.truths.get(&(k.0, k.1, k.3)) != Some(&k.4) {
                out.extend(held);
            }
        }
        out
    }

    /// Checks the slices pushed for `step` (by `member`, or by anyone)
    /// before their root was known: those that prove out are held.
    fn check_waiting(&mut self, step: u32, member: Option<u32>) {
        let waiting: Vec<_> = self
            .unchecked
            .range((step, 0, 0)..(step + 1, 0, 0))
            .filter(|(k, _)| member.is_none_or(|m| k.2 == m))
            .map(|(k, _)| *k)
            .collect();
        for k in waiting {
            if let Some(slice) = self.unchecked.remove(&k)
                && self.checks_out(k.0, k.1, k.2, &slice)
            {
                self.held.insert(k, slice);
                self.ex.on_slice(k.0, k.1, k.2);
            }
        }
    }

    /// Whether `slice` is `member`'s slice of `shard`: by the root the
    /// step's manifest lists once it is known, by the member's announced
    /// root before.
    fn checks_out(&self, step: u32, shard: u32, member: u32, slice: &Slice) -> bool {
        let shard_len = self.shards.get(shard as usize).map(|s| s.positions);
        let root = match self.listed.get(&(step, member)) {
            Some(r) => Some(r),
            None if !self.manifests.contains_key(&step) => self.roots.get(&(step, member)),
            None => None,
        };
        shard_len == Some(slice.signs.len())
            && root.is_some_and(|root| slice.proves(root, self.shards.len(), shard as usize))
    }
}

impl Net {
    /// Runs `f` on the sharded exchange's driver, if this node runs one.
    fn with_sharded<R>(&mut self, f: impl FnOnce(&mut Net, &mut Sharded) -> R) -> Option<R> {
        let mut sh = self.sharded.take()?;
        let r = f(self, &mut sh);
        self.sharded = Some(sh);
        Some(r)
    }

    /// Opens `step` in the exchange with its seats, if it is in the window
    /// and not open yet. False when it cannot be (outside the window).
    fn open_step(&mut self, sh: &mut Sharded, step: u32) -> bool {
        if sh.seats.contains_key(&step) {
            return true;
        }
        // Nothing below what this node keeps (a push or a hash for a step
        // long gone would open it again), nothing outside the window.
        if step < self.applied.saturating_sub(KEEP) || !self.machine.in_window(step) {
            return false;
        }
        let n = self.cfg.members.len();
        let members: Vec<u32> = (0..n as u32).collect();
        let redundancy = sh.plan.redundancy.min(n);
        let Ok((seats, reserve)) =
            exchange::seating(&self.cfg.seed, step, &members, sh.plan.shards, redundancy)
        else {
            return false;
        };
        // The checks are drawn from this node's secret: nobody can tell
        // which shards it recomputes.
        let mut draw = blake3::Hasher::new();
        draw.update(b"cohort-checks-v1");
        draw.update(&self.cfg.secret);
        draw.update(&step.to_le_bytes());
        let mut stream = draw.finalize_xof();
        let next = || {
            let mut b = [0u8; 8];
            stream.fill(&mut b);
            (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
        };
        let (spots, backups) =
            exchange::checks(sh.plan.shards, sh.plan.spots, sh.plan.backups, n, next);
        sh.ex.open(step, seats.clone(), reserve, &spots, &backups);
        sh.seats.insert(step, seats);
        true
    }

    /// This node's contribution: cut into slices, committed by the root
    /// its announcement signs, and pushed to the aggregators; announced
    /// once every shard reached one of them.
    pub(super) fn sharded_contribution(&mut self, mut announce: Announce, bytes: &[u8]) -> bool {
        self.with_sharded(|net, sh| {
            let payload = match crate::wire::Contribution::decode_signed(bytes, &sh.layout) {
                Ok(c) => c.payload,
                Err(e) => {
                    tracing::error!(me = net.cfg.me, %e, "own contribution does not decode");
                    return;
                }
            };
            let slices: Vec<Vec<bool>> = sh
                .shards
                .iter()
                .map(|s| shard::slice(s, &sh.layout, &payload))
                .collect();
            let leaves: Vec<_> = slices
                .iter()
                .enumerate()
                .map(|(i, s)| shard::slice_leaf(i, s))
                .collect();
            let paths = (0..slices.len())
                .map(|i| crate::merkle::path(&leaves, i))
                .collect();
            let step = announce.step;
            announce.payload_hash = shard::commit(&slices);
            sh.roots.insert((step, net.cfg.me), announce.payload_hash);
            sh.own.insert(step, Own { slices, paths });
            sh.unannounced.insert(step, announce);
            if net.open_step(sh, step) {
                sh.ex.on_computed(step);
            }
        })
        .is_some()
    }

    /// Fetches `member`'s payload of `step` as slices for an audit, checked
    /// against `root` (the one it signed, which the step listed). The
    /// trainer gets it assembled, or None if some slice is served by
    /// nobody: the member, then each of the shard's seats, asked once.
    pub(super) fn fetch_sent(&mut self, step: u32, member: u32, root: [u8; 32]) {
        let me = self.cfg.me;
        let done = self.with_sharded(|net, sh| {
            if sh.gathers.contains_key(&(step, member)) {
                return None;
            }
            if !net.open_step(sh, step) {
                return Some(None);
            }
            let n = sh.shards.len();
            let mut g = Gather {
                root,
                got: vec![None; n],
                tried: vec![0; n],
            };
            for s in 0..n as u32 {
                g.got[s as usize] = sh
                    .slice(me, step, s, member)
                    .filter(|x| sh.proves(s, x, &root))
                    .map(|x| x.signs);
            }
            let missing: Vec<u32> = (0..n as u32)
                .filter(|&s| g.got[s as usize].is_none())
                .collect();
            sh.gathers.insert((step, member), g);
            for s in missing {
                if !net.ask_audit_slice(sh, step, s, member) {
                    sh.gathers.remove(&(step, member));
                    return Some(None);
                }
            }
            sh.gathered(&net.cfg.job, step, member)
        });
        if let Some(Some(payload)) = done {
            let _ = self.to_trainer.send(ToTrainer::Sent {
                step,
                member,
                payload,
            });
        }
    }

    /// Asks the next source not yet asked for `member`'s slice of `shard`
    /// for an audit; false when every source was asked.
    fn ask_audit_slice(&mut self, sh: &mut Sharded, step: u32, shard: u32, member: u32) -> bool {
        let sources = sh.sources(self.cfg.me, step, shard, member);
        loop {
            let Some(g) = sh.gathers.get_mut(&(step, member)) else {
                return false;
            };
            let Some(&from) = sources.get(g.tried[shard as usize]) else {
                return false;
            };
            g.tried[shard as usize] += 1;
            if self.request_slice(from, (step, shard, member), Why::Audit) {
                return true;
            }
        }
    }

    /// Whether the job's sharded exchange has shard `shard`.
    pub(super) fn is_shard(&self, shard: u32) -> bool {
        self.sharded
            .as_ref()
            .is_some_and(|sh| (shard as usize) < sh.shards.len())
    }

    /// Fetches the slice a witness screens a contribution by (see
    /// `Guard::draw_sharded`): held here, or asked of each of the shard's
    /// seats, then of the member (the suspect, which could otherwise delay
    /// its own screen).
    pub(super) fn fetch_sample(&mut self, step: u32, s: Sample) {
        let me = self.cfg.me;
        let key = (step, s.member, s.shard);
        // None: already under way; Some(None): ask for it; Some(Some(x)):
        // decided (x None if the step is not kept).
        let held = self.with_sharded(|net, sh| {
            if sh.samples.contains_key(&key) {
                return None;
            }
            sh.samples.insert(key, (s, 0));
            if !net.open_step(sh, step) {
                return Some(Some(None));
            }
            let x = sh
                .slice(me, step, s.shard, s.member)
                .filter(|x| sh.proves(s.shard, x, &s.root));
            Some(x.map(|x| Some(x.signs)))
        });
        match held.flatten() {
            None => {}
            Some(None) => self.ask_sample(key),
            Some(Some(found)) => self.sampled(key, found),
        }
    }

    /// Tells the trainer what became of a sample: the slice, with the
    /// shard's accepted sums it is judged against.
    fn sampled(&mut self, key: (u32, u32, u32), slice: Option<Vec<bool>>) {
        let (step, member, shard) = key;
        let sums = self.sharded.as_mut().and_then(|sh| {
            sh.samples.remove(&key);
            let h = sh.ex.accepted(step, shard)?;
            sh.sums.get(&(step, shard, h)).cloned()
        });
        let _ = self.to_trainer.send(ToTrainer::Sampled {
            step,
            member,
            shard,
            found: slice.zip(sums),
        });
    }

    /// Asks the next source for a sample's slice; the trainer hears None
    /// once every source was asked in vain.
    fn ask_sample(&mut self, key: (u32, u32, u32)) {
        let (step, member, shard) = key;
        let me = self.cfg.me;
        loop {
            let next = self.sharded.as_mut().and_then(|sh| {
                let tried = sh.samples.get(&key)?.1;
                let mut sources = sh.sources(me, step, shard, member);
                // The member last: see `fetch_sample`.
                let member_first = sources.first() == Some(&member);
                sources.rotate_left(usize::from(member_first));
                if let Some(e) = sh.samples.get_mut(&key) {
                    e.1 += 1;
                }
                Some(sources.get(tried).copied())
            });
            let Some(from) = next else {
                return;
            };
            let Some(from) = from else {
                self.sampled(key, None);
                return;
            };
            if self.request_slice(from, key_slice(key), Why::Sample) {
                return;
            }
        }
    }

    /// An answer (or a failure) to a sample's slice request.
    fn on_sample(&mut self, key: (u32, u32, u32), slice: Option<Slice>) {
        let ok = self.sharded.as_ref().and_then(|sh| {
            let (s, _) = sh.samples.get(&key)?;
            Some(slice.filter(|x| sh.proves(s.shard, x, &s.root)))
        });
        match ok {
            None => {}
            Some(Some(x)) => self.sampled(key, Some(x.signs)),
            Some(None) => self.ask_sample(key),
        }
    }

    /// An answer (or a failure: None) to a slice request for an audit.
    fn on_audit_slice(&mut self, step: u32, shard: u32, member: u32, slice: Option<Slice>) {
        let done = self.with_sharded(|net, sh| {
            let root = sh.gathers.get(&(step, member))?.root;
            match slice.filter(|x| sh.proves(shard, x, &root)) {
                Some(x) => {
                    if let Some(g) = sh.gathers.get_mut(&(step, member)) {
                        g.got[shard as usize] = Some(x.signs);
                    }
                }
                None if net.ask_audit_slice(sh, step, shard, member) => return None,
                None => {
                    tracing::debug!(
                        me = net.cfg.me,
                        step,
                        shard,
                        member,
                        "no source serves an audited slice"
                    );
                    sh.gathers.remove(&(step, member));
                    return Some(None);
                }
            }
            sh.gathered(&net.cfg.job, step, member)
        });
        if let Some(Some(payload)) = done {
            let _ = self.to_trainer.send(ToTrainer::Sent {
                step,
                member,
                payload,
            });
        }
    }

    /// A member's announcement was taken by the step machine: its root is
    /// what its slices are checked against.
    pub(super) fn sharded_announce(&mut self, a: &Announce) {
        self.with_sharded(|_, sh| {
            sh.roots.entry((a.step, a.member)).or_insert(a.payload_hash);
            sh.check_waiting(a.step, Some(a.member));
        });
    }

    /// The step machine agreed on `manifest` for its step: the exchange
    /// sums it, and the trainer gets it once every shard's sum is in.
    pub(super) fn sharded_manifest(&mut self, manifest: Manifest, same_history: bool) {
        let last_produced_us = self.machine.last_produced_us(manifest.step);
        let now = self.now();
        let mut forged = Vec::new();
        self.with_sharded(|net, sh| {
            let step = manifest.step;
            if !net.open_step(sh, step) {
                return;
            }
            let id = manifest.id();
            let members: Vec<u32> = manifest.entries.iter().map(|e| e.0).collect();
            sh.listed = std::mem::take(&mut sh.listed)
                .into_iter()
                .filter(|((s, _), _)| *s != step)
                .collect();
            for (m, root) in &manifest.entries {
                sh.listed.insert((step, *m), *root);
                // A root the member never announced, when it announced
                // another and nothing else: the leader's forgery.
                if net.machine.leader_forged(step, *m, root) {
                    forged.push((manifest.leader, step, *m));
                }
            }
            sh.manifests.insert(step, (id, members.clone()));
            // Pushes whose author's announcement this node never heard
            // check out against the manifest's roots now.
            sh.check_waiting(step, None);
            sh.ex.on_manifest(now, step, id, &members);
            // Accusations heard before the manifest: recompute now.
            let accused: Vec<u32> = sh
                .pending
                .keys()
                .filter(|k| k.0 == step && k.3 == id)
                .map(|k| k.1)
                .collect();
            for shard in accused {
                sh.ex.on_evidence(step, shard, id);
            }
            sh.to_apply.insert(
                step,
                ToApply {
                    manifest,
                    same_history,
                    last_produced_us,
                },
            );
        });
        for (leader, step, member) in forged {
            self.stats.forged_entries += 1;
            self.events.push(NodeEvent::ForgedEntry {
                step,
                leader,
                member,
            });
            let evidence =
                defence::forged_entry_evidence(&self.cfg.job, self.cfg.epoch, step, leader, member);
            self.accuse_leader(leader, step, evidence, Ground::ForgedEntry);
        }
        self.sharded_try_apply();
    }

    /// Hands the trainer the steps whose manifest and sums are both in, in
    /// order, stopping at the first that is not: the trainer takes only
    /// the step it is at. Readiness is read from the exchange each time
    /// (every shard's sum accepted and held), so a step applied again after
    /// a rewind is handed over again.
    fn sharded_try_apply(&mut self) {
        let mut two_faced = Vec::new();
        self.with_sharded(|net, sh| {
            while let Some(step) = sh.to_apply.keys().next().copied() {
                let mut sums = Vec::with_capacity(sh.shards.len());
                for s in 0..sh.shards.len() as u32 {
                    match sh
                        .ex
                        .accepted(step, s)
                        .and_then(|h| sh.sums.get(&(step, s, h)))
                    {
                        Some(v) => sums.push(v.clone()),
                        None => return,
                    }
                }
                let Some(t) = sh.to_apply.remove(&step) else {
                    return;
                };
                // A leader that listed its own payload, which it announced
                // under two commitments (so that no witness audits it, nor
                // sees it on another state): its two signatures are proof.
                let leader = t.manifest.leader;
                if t.manifest
                    .entries
                    .iter()
                    .any(|(m, root)| *m == leader && net.machine.ambiguous(step, *m, root))
                {
                    two_faced.push((step, leader));
                }
                if let Some((_, raw)) = net.ranked_raw.get(&t.manifest.id()) {
                    net.manifests_raw.insert(step, raw.clone());
                }
                // A witness's trainer draws its audits from the listed
                // members' announcements (those this node heard).
                let announced = if net.policy.witnesses.contains(&net.cfg.me) {
                    t.manifest
                        .entries
                        .iter()
                        .filter_map(|(m, root)| {
                            let c = net.machine.committed(step, *m, root)?;
                            let a = Announced {
                                member: *m,
                                momentum: c.momentum,
                                root: *root,
                            };
                            Some((a, c.basis))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let _ = net.to_trainer.send(ToTrainer::Apply {
                    manifest: t.manifest,
                    inputs: Inputs::Sums { sums, announced },
                    last_produced_us: t.last_produced_us,
                    same_history: t.same_history,
                });
            }
        });
        for (step, leader) in two_faced {
            let evidence =
                defence::foreign_basis_evidence(&self.cfg.job, self.cfg.epoch, step, leader);
            self.accuse_leader(leader, step, evidence, Ground::ForeignBasis);
        }
    }

    /// Drives the exchange until it has nothing to do; true if it did
    /// anything the step machine must see.
    pub(super) fn drive_exchange(&mut self) -> bool {
        let now = self.now();
        let Some(actions) = self.sharded.as_mut().map(|sh| sh.ex.poll(now)) else {
            return false;
        };
        let mut touched = false;
        for a in actions {
            tracing::trace!(me = self.cfg.me, action = ?a, "exchange");
            touched |= self.on_exchange(a);
        }
        self.sharded_try_apply();
        let decided = self
            .sharded
            .as_mut()
            .map(Sharded::decided)
            .unwrap_or_default();
        for a in decided {
            self.on_accuse(&a);
        }
        touched
    }

    /// Asks `from` for `member`'s slice of `shard` at `step`, for `why`.
    fn ask_slice(
        &mut self,
        sh: &mut Sharded,
        now: Duration,
        (step, shard, member): (u32, u32, u32),
        from: u32,
        why: Why,
    ) {
        if !self.request_slice(from, (step, shard, member), why) {
            sh.slice_failed(now, (step, shard, member), why);
        }
    }

    /// Asks `from` for `member`'s slice of `shard` at `step`, for `why`;
    /// false if the request could not be sent.
    fn request_slice(
        &mut self,
        from: u32,
        (step, shard, member): (u32, u32, u32),
        why: Why,
    ) -> bool {
        let req = Request::Slice {
            step,
            shard,
            member,
        };
        let what = Pending::Slice {
            step,
            shard,
            member,
            why,
        };
        self.ask(from, req, what)
    }

    /// Whether this node is the withholding attacker at `step`.
    fn withholds(&self, step: u32) -> bool {
        self.cfg.defence.adversary == Some(Mode::Withholding)
            && step == crate::adversary::WITHHELD_STEP
    }

    fn on_exchange(&mut self, a: XAction) -> bool {
        let me = self.cfg.me;
        let now = self.now();
        self.with_sharded(|net, sh| match a {
            // The withholder's slices go nowhere, yet it announces as if
            // every shard held them.
            XAction::Push { step, shard, to } if net.withholds(step) => {
                sh.ex.on_pushed(step, shard, to);
                false
            }
            XAction::Forward { step, member, .. } if member == me && net.withholds(step) => false,
            XAction::Push { step, shard, to } => {
                let Some(slice) = sh.slice(me, step, shard, me) else {
                    return false;
                };
                let req = Request::Push { step, shard, slice };
                if !net.ask(to, req, Pending::Push { step, shard, to }) {
                    sh.ex.on_push_failed(now, step, shard, to);
                }
                false
            }
            XAction::Announce { step } => {
                let Some(announce) = sh.unannounced.remove(&step) else {
                    return false;
                };
                net.machine.on_local(now, &announce);
                let _ = net.machine.on_payload(now, announce.payload_hash);
                net.publish_announce(announce);
                true
            }
            XAction::FetchSlice {
                step,
                shard,
                member,
                from,
            } => {
                net.ask_slice(sh, now, (step, shard, member), from, Why::Seat);
                false
            }
            XAction::PublishSum {
                step,
                shard,
                manifest,
            } => {
                let Some((id, members)) = sh.manifests.get(&step).cloned() else {
                    return false;
                };
                if id != manifest {
                    return false;
                }
                // Every slice checked again against the root the manifest
                // lists: one held under another announced root is not
                // summed (this seat stays silent on the shard instead).
                let slices: Option<Vec<Vec<bool>>> = members
                    .iter()
                    .map(|&m| {
                        sh.slice(me, step, shard, m)
                            .filter(|x| m == me || sh.checks_out(step, shard, m, x))
                            .map(|x| x.signs)
                    })
                    .collect();
                let Some(slices) = slices else {
                    tracing::warn!(
                        me,
                        step,
                        shard,
                        "a listed slice is not held under the listed root: no sum signed"
                    );
                    return false;
                };
                // A slice against the others in this shard gets no vote
                // (`shard::votes`, the screen every recomputation applies).
                let refs: Vec<&[bool]> = slices.iter().map(Vec::as_slice).collect();
                let votes = shard::votes(&refs);
                net.stats.unvoted += votes.iter().filter(|v| **v == 0).count() as u64;
                let weighted: Vec<(&[bool], i32)> = refs.iter().copied().zip(votes).collect();
                let Ok(mut sums) = shard::sum(&weighted, sh.shards[shard as usize].positions)
                else {
                    return false;
                };
                if net.cfg.defence.adversary == Some(Mode::LyingAggregator)
                    && let Some(v) = sums.first_mut()
                {
                    *v += if *v > 0 { -1 } else { 1 };
                }
                let hash = msg::sum_hash(&sums);
                let claim = SumHash {
                    job: net.cfg.job,
                    epoch: net.cfg.epoch,
                    step,
                    shard,
                    aggregator: me,
                    manifest,
                    hash,
                };
                let raw = msg::sign(&Body::SumHash(claim), &net.key);
                let Some(sig) = msg::signature(&raw) else {
                    return false;
                };
                sh.claims.insert((step, shard, me, manifest, hash), sig);
                // Straight to every member, once each: by gossip each got
                // it about six times (`liveness::MESH_COPIES`), and at
                // 1,000 members the hashes were half the job's gossip.
                let n = net.cfg.members.len() as u32;
                for m in (0..n).filter(|&m| m != me) {
                    let req = Request::Claim {
                        step,
                        shard,
                        manifest,
                        hash,
                        sig,
                    };
                    net.ask(m, req, Pending::Claim);
                }
                sh.sums.insert((step, shard, hash), sums.clone());
                sh.serving.insert((step, shard, manifest), sums);
                sh.ex.on_sum_hash(now, step, shard, me, manifest, hash);
                false
            }
            XAction::FetchSum { step, shard, from } => {
                let Some(manifest) = sh.manifests.get(&step).map(|(id, _)| *id) else {
                    sh.ex.on_fetch_failed(now, step, shard);
                    return false;
                };
                if from == me {
                    match sh.serving.get(&(step, shard, manifest)) {
                        Some(v) => {
                            let h = msg::sum_hash(v);
                            sh.ex.on_sum(now, step, shard, from, h);
                        }
                        None => sh.ex.on_fetch_failed(now, step, shard),
                    }
                    return false;
                }
                let req = Request::Sum {
                    step,
                    shard,
                    manifest,
                };
                let asked = Pending::Sum {
                    step,
                    shard,
                    from,
                    manifest,
                };
                if !net.ask(from, req, asked) {
                    sh.ex.on_fetch_failed(now, step, shard);
                }
                false
            }
            XAction::Recompute {
                step,
                shard,
                from,
                manifest,
            } => {
                let Some((id, members)) = sh.manifests.get(&step).cloned() else {
                    sh.ex.on_recompute_failed(now, step, shard);
                    return false;
                };
                if id != manifest {
                    sh.ex.on_recompute_failed(now, step, shard);
                    return false;
                }
                let mut r = Recompute {
                    manifest,
                    members: members.clone(),
                    got: BTreeMap::new(),
                };
                let mut ask = Vec::new();
                for &m in &members {
                    match sh
                        .slice(me, step, shard, m)
                        .filter(|x| m == me || sh.checks_out(step, shard, m, x))
                    {
                        Some(s) => {
                            r.got.insert(m, s.signs);
                        }
                        None => ask.push(m),
                    }
                }
                if from == me && !ask.is_empty() {
                    sh.ex.on_recompute_failed(now, step, shard);
                    return false;
                }
                sh.recomputing.insert((step, shard), r);
                for m in ask {
                    if !net.request_slice(from, (step, shard, m), Why::Recompute) {
                        sh.recomputing.remove(&(step, shard));
                        sh.ex.on_recompute_failed(now, step, shard);
                        return false;
                    }
                }
                sh.finish_recompute(now, step, shard);
                false
            }
            XAction::Convict {
                step,
                shard,
                aggregator,
                manifest,
                hash,
            } => {
                let Some(&sig) = sh.claims.get(&(step, shard, aggregator, manifest, hash)) else {
                    return false;
                };
                let claim = SumHash {
                    job: net.cfg.job,
                    epoch: net.cfg.epoch,
                    step,
                    shard,
                    aggregator,
                    manifest,
                    hash,
                };
                net.stats.false_sums += 1;
                tracing::warn!(
                    me,
                    step,
                    shard,
                    aggregator,
                    "an aggregator signed a false sum"
                );
                let evidence = claim.evidence();
                net.accuse_leader(
                    aggregator,
                    step,
                    evidence,
                    Ground::FalseSum {
                        shard,
                        manifest,
                        hash,
                        sig,
                    },
                );
                false
            }
            // Read from the exchange by `sharded_try_apply`.
            XAction::Apply { .. } => false,
            XAction::ClaimWithheld {
                step,
                shard,
                member,
                manifest,
            } => {
                tracing::warn!(
                    me,
                    step,
                    shard,
                    member,
                    "nobody serves a listed slice: claimed"
                );
                let claim = Withheld {
                    job: net.cfg.job,
                    epoch: net.cfg.epoch,
                    step,
                    shard,
                    aggregator: me,
                    manifest,
                    member,
                };
                net.publish(msg::sign(&Body::Withheld(claim), &net.key));
                sh.ex.on_withheld_claim(step, shard, me, manifest, member);
                false
            }
            XAction::Probe {
                step,
                shard,
                member,
                from,
            } => {
                net.ask_slice(sh, now, (step, shard, member), from, Why::Probe);
                false
            }
            XAction::Forward {
                step,
                shard,
                member,
                to,
            } => {
                if let Some(slice) = sh.slice(me, step, shard, member) {
                    let req = Request::Hand {
                        step,
                        shard,
                        member,
                        slice,
                    };
                    net.ask(to, req, Pending::Hand);
                }
                false
            }
            XAction::Withheld { step, member } => {
                tracing::warn!(
                    me,
                    step,
                    member,
                    "nobody serves a listed member's slice: its manifest is given up"
                );
                // Its sums never come; a manifest without it replaces it.
                sh.to_apply
                    .retain(|&s, t| s != step || t.manifest.entries.iter().all(|e| e.0 != member));
                if let Some(s) = net.machine.on_withheld(step, member)
                    && net.applied > s
                {
                    net.rewind(s);
                }
                true
            }
            XAction::Served { step, member } => {
                if let Some(s) = net.machine.on_served(now, step, member)
                    && net.applied > s
                {
                    net.rewind(s);
                }
                true
            }
            XAction::Rewind { step } => {
                // Only if this node applied the step: when a better
                // manifest replaced it, the step machine rewound already.
                if net.applied > step {
                    tracing::warn!(me, step, "a sum applied was proven false: rewinding");
                    let parent = net.machine.manifest(step).map(|m| m.parent);
                    net.rewind(step);
                    if let Some(parent) = parent.filter(|_| !net.syncing) {
                        net.machine.resync(step, parent);
                    }
                }
                true
            }
        })
        .unwrap_or(false)
    }

    /// An answer to one of the exchange's requests.
    pub(super) fn on_sharded_response(&mut self, p: Pending, resp: Response) {
        if let Pending::Slice {
            step,
            shard,
            member,
            why: why @ (Why::Audit | Why::Sample),
        } = p
        {
            let slice = match resp {
                Response::Slice(s) => Some(s),
                _ => None,
            };
            if why == Why::Audit {
                self.on_audit_slice(step, shard, member, slice);
            } else {
                self.on_sample((step, member, shard), slice);
            }
            self.drive();
            return;
        }
        let now = self.now();
        let me = self.cfg.me;
        self.with_sharded(|net, sh| match (p, resp) {
            (Pending::Push { step, shard, to }, Response::Taken) => {
                sh.ex.on_pushed(step, shard, to);
            }
            (Pending::Push { step, shard, to }, _) => sh.ex.on_push_failed(now, step, shard, to),
            (
                Pending::Slice {
                    step,
                    shard,
                    member,
                    why,
                },
                Response::Slice(slice),
            ) if sh.checks_out(step, shard, member, &slice) => {
                let recompute = why == Why::Recompute;
                if recompute {
                    if let Some(r) = sh.recomputing.get_mut(&(step, shard))
                        && r.members.contains(&member)
                    {
                        r.got.insert(member, slice.signs.clone());
                    }
                    sh.finish_recompute(now, step, shard);
                }
                // An aggregator keeps what it fetched (to sum and serve), and
                // so does a node that checked a claim (to hand it over).
                if sh
                    .seats
                    .get(&step)
                    .is_some_and(|s| s.get(shard as usize).is_some_and(|x| x.contains(&me)))
                    || !recompute
                {
                    sh.held.insert((step, shard, member), slice);
                    sh.ex.on_slice(step, shard, member);
                }
            }
            (
                Pending::Slice {
                    step,
                    shard,
                    member,
                    why,
                },
                _,
            ) => sh.slice_failed(now, (step, shard, member), why),
            (
                Pending::Sum {
                    step,
                    shard,
                    from,
                    manifest,
                },
                Response::Sum { sums: v, claims },
            ) if sh
                .shards
                .get(shard as usize)
                .is_some_and(|s| s.positions == v.len()) =>
            {
                // The seats' signed hashes first, so that the sum finds
                // its server's hash known (and its partner's, whose own
                // `Request::Claim` may have been lost).
                for c in &claims {
                    net.take_claim(sh, now, (step, shard, manifest), c);
                }
                let h = msg::sum_hash(&v);
                sh.sums.insert((step, shard, h), v);
                sh.ex.on_sum(now, step, shard, from, h);
            }
            (Pending::Sum { step, shard, .. }, _) => sh.ex.on_fetch_failed(now, step, shard),
            _ => {}
        });
        self.drive();
    }

    /// One of the exchange's requests failed or timed out.
    pub(super) fn on_sharded_failure(&mut self, p: Pending) {
        self.on_sharded_response(p, Response::NotFound);
    }

    /// A request for the exchange's data, from member `from`.
    pub(super) fn serve_sharded(&mut self, from: u32, req: Request) -> Response {
        let me = self.cfg.me;
        let now = self.now();
        let r = self.with_sharded(|net, sh| match req {
            Request::Push { step, shard, slice } => {
                if !net.open_step(sh, step) {
                    return Response::NotFound;
                }
                let seated = sh
                    .seats
                    .get(&step)
                    .is_some_and(|s| s.get(shard as usize).is_some_and(|x| x.contains(&me)));
                if !seated {
                    return Response::NotFound;
                }
                let k = (step, shard, from);
                if sh.roots.contains_key(&(step, from)) {
                    if !sh.checks_out(step, shard, from, &slice) {
                        net.stats.drop(Drop::BadBlob);
                        return Response::NotFound;
                    }
                    sh.held.insert(k, slice);
                    sh.ex.on_slice(step, shard, from);
                } else if sh.shards.get(shard as usize).map(|s| s.positions)
                    == Some(slice.signs.len())
                {
                    // Checked once its author announces: pushes come first.
                    sh.unchecked.insert(k, slice);
                } else {
                    net.stats.drop(Drop::BadBlob);
                    return Response::NotFound;
                }
                Response::Taken
            }
            Request::Slice { step, member, .. } if member == me && net.withholds(step) => {
                Response::NotFound
            }
            Request::Slice {
                step,
                shard,
                member,
            } => sh
                .slice(me, step, shard, member)
                .map_or(Response::NotFound, Response::Slice),
            Request::Hand {
                step,
                shard,
                member,
                slice,
            } => {
                if !net.open_step(sh, step) || !sh.checks_out(step, shard, member, &slice) {
                    net.stats.drop(Drop::BadBlob);
                    return Response::NotFound;
                }
                if sh.ex.on_slice(step, shard, member) == exchange::Verdict::NotASeat {
                    return Response::NotFound;
                }
                sh.held.insert((step, shard, member), slice);
                Response::Taken
            }
            Request::Sum {
                step,
                shard,
                manifest,
            } => sh
                .serving
                .get(&(step, shard, manifest))
                .map_or(Response::NotFound, |v| Response::Sum {
                    sums: v.clone(),
                    claims: sh.claims_of(step, shard, manifest),
                }),
            Request::Claim {
                step,
                shard,
                manifest,
                hash,
                sig,
            } => {
                let c = Claim {
                    aggregator: from,
                    hash,
                    sig,
                };
                match net.take_claim(sh, now, (step, shard, manifest), &c) {
                    exchange::Verdict::Accepted | exchange::Verdict::Duplicate => Response::Taken,
                    _ => Response::NotFound,
                }
            }
            _ => Response::NotFound,
        });
        self.drive();
        r.unwrap_or(Response::NotFound)
    }

    /// A seat's signed sum hash for `shard` of `step` over `manifest`, from
    /// the seat itself (`Request::Claim`) or carried by a sum answer:
    /// taken when its aggregator signed it for this job and epoch and is a
    /// seat of the shard (the exchange decides, as for any hash). A claim
    /// already held is not checked again.
    fn take_claim(
        &mut self,
        sh: &mut Sharded,
        now: Duration,
        (step, shard, manifest): (u32, u32, ManifestId),
        c: &Claim,
    ) -> exchange::Verdict {
        let key = (step, shard, c.aggregator, manifest, c.hash);
        if sh.claims.contains_key(&key) {
            return exchange::Verdict::Duplicate;
        }
        if !self.open_step(sh, step) {
            self.stats.drop(Drop::OutOfWindow);
            return exchange::Verdict::UnknownStep;
        }
        let claim = SumHash {
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            step,
            shard,
            aggregator: c.aggregator,
            manifest,
            hash: c.hash,
        };
        let signed = self
            .cfg
            .members
            .get(c.aggregator as usize)
            .is_some_and(|k| msg::signed_by(&Body::SumHash(claim), k, &c.sig));
        if !signed {
            self.stats.drop(Drop::BadSignature);
            return exchange::Verdict::NotASeat;
        }
        let v = sh
            .ex
            .on_sum_hash(now, step, shard, c.aggregator, manifest, c.hash);
        match v {
            exchange::Verdict::Accepted => {
                self.stats.accepted += 1;
                sh.claims.insert(key, c.sig);
            }
            exchange::Verdict::NotASeat => self.stats.drop(Drop::NotMember),
            _ => {}
        }
        v
    }

    /// A seat's signed claim that a listed slice is withheld: checked by
    /// this node's own look (see `exchange::probe`). Forwarded only when it
    /// started one, so a seat cannot flood the job with claims.
    pub(super) fn on_withheld_gossip(&mut self, w: Withheld) -> MessageAcceptance {
        self.exchange_gossip(w.step, |sh| {
            sh.ex
                .on_withheld_claim(w.step, w.shard, w.aggregator, w.manifest, w.member)
        })
    }

    /// A seat's gossip about `step`, handed to the exchange by `take`: from
    /// a member that holds no seat it is rejected (every honest node drops
    /// it alike), taken it is forwarded, and anything else (a second hash,
    /// another manifest: a seat could otherwise flood every node with
    /// made-up manifest ids) is neither kept nor forwarded.
    fn exchange_gossip(
        &mut self,
        step: u32,
        take: impl FnOnce(&mut Sharded) -> exchange::Verdict,
    ) -> MessageAcceptance {
        let r = self.with_sharded(|net, sh| {
            if !net.open_step(sh, step) {
                net.stats.drop(Drop::OutOfWindow);
                return MessageAcceptance::Ignore;
            }
            match take(sh) {
                exchange::Verdict::NotASeat => {
                    net.stats.drop(Drop::NotMember);
                    MessageAcceptance::Reject
                }
                exchange::Verdict::Accepted => {
                    net.stats.accepted += 1;
                    MessageAcceptance::Accept
                }
                _ => MessageAcceptance::Ignore,
            }
        });
        self.drive();
        r.unwrap_or_else(|| {
            // A job on the all-to-all exchange has no aggregators: every
            // honest node drops these alike.
            self.stats.drop(Drop::Malformed);
            acceptance(Drop::Malformed)
        })
    }

    /// A false-sum accusation: the quoted claim must carry the accused
    /// aggregator's signature, and it counts here only once this node's own
    /// recomputation of the shard proves the claim false (a quote of an
    /// honest seat's true claim makes every node recompute, and convicts
    /// nobody). Other grounds pass through.
    pub(super) fn on_false_sum(&mut self, a: &Accuse) -> FalseSum {
        let Ground::FalseSum {
            shard,
            manifest,
            hash,
            sig,
        } = a.ground
        else {
            return FalseSum::Other;
        };
        let claim = SumHash {
            job: a.job,
            epoch: a.epoch,
            step: a.step,
            shard,
            aggregator: a.accused,
            manifest,
            hash,
        };
        let Some(key) = self.cfg.members.get(a.accused as usize) else {
            return FalseSum::Forged;
        };
        if !msg::signed_by(&Body::SumHash(claim.clone()), key, &sig)
            || a.evidence != claim.evidence()
        {
            return FalseSum::Forged;
        }
        // What the tally would refuse anyway is not held (nor forwarded).
        if a.epoch != self.cfg.epoch
            || a.witness == a.accused
            || !self.policy.witnesses.contains(&a.witness)
        {
            return FalseSum::Refused;
        }
        let k = (a.step, shard, a.accused, manifest, hash);
        let verdict = self.with_sharded(|net, sh| {
            match sh.truths.get(&(a.step, shard, manifest)) {
                Some(t) if *t != hash => return FalseSum::Confirmed,
                Some(_) => return FalseSum::Refused,
                None => {}
            }
            if !net.open_step(sh, a.step) {
                return FalseSum::Refused;
            }
            // Held per witness: one witness cannot crowd out the others.
            let by_witness = sh
                .pending
                .values()
                .flatten()
                .filter(|x| x.witness == a.witness)
                .count();
            let list = sh.pending.entry(k).or_default();
            if by_witness < MAX_PENDING_PER_WITNESS && !list.iter().any(|x| x.witness == a.witness)
            {
                list.push(a.clone());
            }
            sh.claims.insert(k, sig);
            sh.ex.on_evidence(a.step, shard, manifest);
            FalseSum::Held
        });
        match verdict {
            Some(v) => {
                self.drive();
                v
            }
            // On the all-to-all exchange nobody aggregates: nothing to
            // check it against, and nothing it could be about.
            None => FalseSum::Refused,
        }
    }

    /// Forgets the exchange's steps the node no longer keeps; an audit's
    /// payload still being fetched for one of them is given up.
    pub(super) fn prune_sharded(&mut self, floor: u32) {
        if let Some(sh) = self.sharded.as_mut() {
            let dropped: Vec<(u32, u32)> =
                sh.gathers.range(..(floor, 0)).map(|(k, _)| *k).collect();
            let samples: Vec<(u32, u32, u32)> =
                sh.samples.range(..(floor, 0, 0)).map(|(k, _)| *k).collect();
            sh.forget_before(floor);
            for (step, member) in dropped {
                let _ = self.to_trainer.send(ToTrainer::Sent {
                    step,
                    member,
                    payload: None,
                });
            }
            for (step, member, shard) in samples {
                let _ = self.to_trainer.send(ToTrainer::Sampled {
                    step,
                    member,
                    shard,
                    found: None,
                });
            }
        }
    }
}
