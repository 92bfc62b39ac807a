//! Protocol messages, defined once for every side (nodes, tests, simulator).
//!
//! Gossip messages are small, signed by the member's node key (the same
//! ed25519 key as its Solana account), and carry the job so a message from
//! another job is refused even when its signature is good.
//!
//! ```text
//! envelope  := magic "CHN" | version u8 | kind u8 | body | signer [32] | sig [64]
//!              sig = ed25519(signer, "cohort-net-v1" | everything before signer)
//! announce  := job [32] | epoch u32 | step u32 | member u32 | payload_hash [32]
//!              | momentum_hash [32] | basis [32] | len u32 | produced_us u64
//!              | chain_step u32 | chain [32]
//! manifest  := job [32] | epoch u32 | step u32 | attempt u8 | leader u32
//!              | state_hash [32] | parent [32] | count u16
//!              | count × (member u32 | hash [32])
//! heartbeat := job [32] | epoch u32 | member u32 | seq u64 | ready_from u32
//!              | applied u32 | auditing u32 | chain_step u32 | chain [32]
//! accuse    := job [32] | epoch u32 | step u32 | accused u32 | witness u32
//!              | evidence [32] | overlap u16 | agreement u16   (basis points)
//!              | ground u8 (0 screened, 1 drawn, 2 equivocation, 3 forged entry,
//!                4 false sum)
//!              | [drawn: by u32 | coin [64]]
//!              | [false sum: shard u32 | manifest [32] | hash [32] | sig [64]]
//! sum_hash  := job [32] | epoch u32 | step u32 | shard u32 | aggregator u32
//!              | manifest [32] | hash [32]
//! withheld  := job [32] | epoch u32 | step u32 | shard u32 | aggregator u32
//!              | manifest [32] | member u32
//! ```

use crate::defence::Ground;
use cohort_program::codec::Reader;
use libp2p::identity::ed25519;

/// 4 (2026-12-05): the sharded exchange's messages (`SumHash`, the false
/// sum ground, slice pushes, slice and sum requests).
/// 5 (2026-12-05): a seat's claim that a listed slice is withheld
/// (`Withheld`), and a slice handed to a seat (`Request::Hand`).
/// 6 (2026-12-06): an announcement names the state its contribution was
/// computed on (`Announce::basis`): leaders list only contributions
/// computed on the step's state, and witnesses of the sharded exchange,
/// which never see the signed contribution, audit only those; the ground
/// `Ground::Sampled` (a sharded witness's screen by one slice); a seat's
/// sum leaves out the votes of slices its shard's screen flags
/// (`shard::votes`), so a version-5 seat's sums differ from it.
/// 7 (2026-12-06): the ground `Ground::ForeignBasis` (a leader listed its
/// own contribution, announced on another state), and a member's first
/// contradicting announcement is forwarded as proof of equivocation.
/// 8 (2026-12-07): gossip carries no gossipsub author, sequence number or
/// signature (`swarm::GossipSigning`); a version-7 node drops every
/// message of a version-8 one, and the other way round.
/// 9 (2026-12-07): a seat's signed sum hash goes to every member by
/// request (`Request::Claim`), not by gossip, and every sum served
/// carries the signed hashes its server holds for it
/// (`Response::Sum::claims`); a `SumHash` on gossip is refused.
/// 10 (2026-12-07): a job of n members cuts ⌈n/2⌉ shards, not n
/// (`exchange::Plan::MEMBERS_PER_SHARD`), so a version-9 node seats a
/// step's aggregators on other shards than a version-10 one.
/// 11 (2026-12-07): an announcement carries its member's history id, as
/// a heartbeat does (`Announce::chain_step`, `Announce::chain`), and a
/// member that announced lately skips its heartbeat
/// (`liveness::beat_due`).
pub const VERSION: u8 = 11;
const MAGIC: &[u8; 3] = b"CHN";
const DOMAIN: &[u8] = b"cohort-net-v1";
/// Largest gossip message a node accepts: a manifest lists 36 bytes per
/// member, so one for the largest job (1,024 members) is 37 kB and
/// anything bigger is hostile. Gossipsub itself carries up to 64 KiB.
pub const MAX_GOSSIP: usize = 40 * 1024;
/// Members listed in one manifest (bounded so the size limit holds).
pub const MAX_MANIFEST_ENTRIES: usize = 1024;
const TRAILER: usize = 32 + 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    pub job: [u8; 32],
    pub epoch: u32,
    pub step: u32,
    pub member: u32,
    /// blake3 of the encoded contribution, which peers fetch by this hash.
    pub payload_hash: [u8; 32],
    pub momentum_hash: [u8; 32],
    /// Hash of the shared state the contribution was computed on (the
    /// contribution's own `basis`).
    pub basis: [u8; 32],
    pub len: u32,
    /// Sender's wall clock when the contribution was ready (µs since Unix
    /// epoch); only used to split step time into waiting and communication.
    pub produced_us: u64,
    /// The member's history when it announced, as its heartbeat would say
    /// it ([`Heartbeat::chain_step`], [`Heartbeat::chain`]): a member that
    /// announces every step skips its heartbeats, and its peers still see
    /// which history it is on.
    pub chain_step: u32,
    pub chain: [u8; 32],
}

/// The step leader's list of what every node applies for one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub job: [u8; 32],
    pub epoch: u32,
    pub step: u32,
    /// 0 for the step's leader, n for the n-th fall-back leader.
    pub attempt: u8,
    pub leader: u32,
    /// Hash of the shared state before this step's update (a joiner checks
    /// the checkpoint it downloads against it).
    pub state_hash: [u8; 32],
    /// The leader's history id before this step: a hash chain over the ids
    /// of every manifest it applied this epoch (zeros if it does not know
    /// it). Equal parents mean equal histories, so a state-hash mismatch
    /// under an equal parent is a real divergence, and a different parent
    /// tells the receiver one of them applied a manifest the other did not.
    pub parent: [u8; 32],
    /// (member, contribution hash), sorted by member, at most one each.
    pub entries: Vec<(u32, [u8; 32])>,
}

impl Manifest {
    /// The manifest's identity: a hash of its signed body.
    pub fn id(&self) -> [u8; 32] {
        let mut out = Vec::with_capacity(128 + 36 * self.entries.len());
        manifest_bytes(self, &mut out);
        *blake3::hash(&out).as_bytes()
    }

    /// Which of two valid manifests for one step every node keeps: the
    /// lower attempt, then (two from one equivocating leader) the lower id.
    pub fn rank(&self) -> (u8, [u8; 32]) {
        (self.attempt, self.id())
    }
}

/// The history id after applying `manifest` on top of `parent`.
pub fn chain(parent: &[u8; 32], manifest: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-chain-v1");
    h.update(parent);
    h.update(manifest);
    *h.finalize().as_bytes()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub job: [u8; 32],
    /// The epoch it speaks for: one replayed from an earlier epoch (whose
    /// sequence numbers the receivers no longer hold) is refused.
    pub epoch: u32,
    pub member: u32,
    /// Strictly increasing per sender: an older or equal one is a replay.
    pub seq: u64,
    /// First step this member will contribute to (a rejoiner announces it
    /// so the leader waits for it).
    pub ready_from: u32,
    /// Updates this member has applied.
    pub applied: u32,
    /// Audits this member (a witness) has drawn and not yet decided: a
    /// finished member stays while a peer still audits it.
    pub auditing: u32,
    /// The next step this member applies and its history id before it
    /// (zeros while it syncs): a peer on another history asks it for its
    /// manifests, so a fork is found even where no later manifest shows it.
    pub chain_step: u32,
    pub chain: [u8; 32],
}

/// A witness's signed statement that one contribution failed its audit.
/// A quorum of them from the epoch's witnesses slashes the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accuse {
    pub job: [u8; 32],
    pub epoch: u32,
    pub step: u32,
    pub accused: u32,
    pub witness: u32,
    /// [`crate::audit::evidence_id`] of the contribution.
    pub evidence: [u8; 32],
    /// What the witness measured, in basis points (0 when the member
    /// withheld or misstated its momentum, or for proof-based grounds).
    pub overlap: u16,
    pub agreement: u16,
    /// Why: a failed audit (screened, or drawn by a coin it carries), or
    /// proof the witness holds (see [`crate::defence`]).
    pub ground: Ground,
}

/// An aggregator's signed claim, in the sharded exchange, that the listed
/// members' slices of one shard sum to the vote sums hashing to `hash`
/// ([`sum_hash`]). Signed, so a false one is proof against its signer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SumHash {
    pub job: [u8; 32],
    pub epoch: u32,
    pub step: u32,
    pub shard: u32,
    pub aggregator: u32,
    /// The id of the manifest whose listed members it sums.
    pub manifest: [u8; 32],
    pub hash: [u8; 32],
}

impl SumHash {
    /// The evidence id of a false-sum accusation against this claim: one
    /// per aggregator and step ([`crate::defence::false_sum_evidence`]).
    pub fn evidence(&self) -> [u8; 32] {
        crate::defence::false_sum_evidence(&self.job, self.epoch, self.step, self.aggregator)
    }
}

/// A seat's signed word, in the sharded exchange, that nobody it asked
/// serves `member`'s slice of `shard`, which the manifest `manifest` lists:
/// not a proof (silence proves nothing), so every node checks it by asking
/// the same sources itself ([`crate::net::exchange`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    pub job: [u8; 32],
    pub epoch: u32,
    pub step: u32,
    pub shard: u32,
    pub aggregator: u32,
    pub manifest: [u8; 32],
    pub member: u32,
}

/// The hash an aggregator signs for a shard's vote sums: of their encoding
/// on the wire ([`crate::shard::pack_sums`]), which is one per sums.
pub fn sum_hash(sums: &[i32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-sum-v1");
    h.update(&crate::shard::pack_sums(sums));
    *h.finalize().as_bytes()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Announce(Announce),
    Manifest(Manifest),
    Heartbeat(Heartbeat),
    Accuse(Accuse),
    SumHash(SumHash),
    Withheld(Withheld),
}

impl Body {
    pub fn job(&self) -> &[u8; 32] {
        match self {
            Body::Announce(a) => &a.job,
            Body::Manifest(m) => &m.job,
            Body::Heartbeat(h) => &h.job,
            Body::Accuse(a) => &a.job,
            Body::SumHash(h) => &h.job,
            Body::Withheld(w) => &w.job,
        }
    }
    /// The member index the signer claims to be.
    pub fn member(&self) -> u32 {
        match self {
            Body::Announce(a) => a.member,
            Body::Manifest(m) => m.leader,
            Body::Heartbeat(h) => h.member,
            Body::Accuse(a) => a.witness,
            Body::SumHash(h) => h.aggregator,
            Body::Withheld(w) => w.aggregator,
        }
    }
    fn kind(&self) -> u8 {
        match self {
            Body::Announce(_) => 1,
            Body::Manifest(_) => 2,
            Body::Heartbeat(_) => 3,
            Body::Accuse(_) => 4,
            Body::SumHash(_) => 5,
            Body::Withheld(_) => 6,
        }
    }
}

/// A message whose signature checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub body: Body,
    pub signer: [u8; 32],
    /// The exact bytes received (what a node relays, or keeps as evidence).
    pub raw: Vec<u8>,
}

/// Why an incoming message was dropped; each is counted per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Drop {
    Oversized,
    Malformed,
    BadSignature,
    NotMember,
    WrongJob,
    Replayed,
    /// A manifest from a member that is not that step's leader.
    WrongLeader,
    /// An unusable payload or checkpoint (bad hash, bad encoding).
    BadBlob,
    /// For a step outside the window a node keeps state for.
    OutOfWindow,
}

impl Drop {
    pub const ALL: [Drop; 9] = [
        Drop::Oversized,
        Drop::Malformed,
        Drop::BadSignature,
        Drop::NotMember,
        Drop::WrongJob,
        Drop::Replayed,
        Drop::WrongLeader,
        Drop::BadBlob,
        Drop::OutOfWindow,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Drop::Oversized => "oversized",
            Drop::Malformed => "malformed",
            Drop::BadSignature => "bad_signature",
            Drop::NotMember => "not_member",
            Drop::WrongJob => "wrong_job",
            Drop::Replayed => "replayed",
            Drop::WrongLeader => "wrong_leader",
            Drop::BadBlob => "bad_blob",
            Drop::OutOfWindow => "out_of_window",
        }
    }

    /// Whether every honest node would have dropped the message too, so
    /// whoever forwarded it is at fault (gossipsub's peer score counts it
    /// against the forwarder). Drops that depend on what this node has
    /// seen (a replay, a step past its window, another epoch) do not: an
    /// honest forwarder may not have seen the same.
    pub fn blames_forwarder(self) -> bool {
        !matches!(self, Drop::Replayed | Drop::OutOfWindow)
    }
}

fn body_bytes(body: &Body, out: &mut Vec<u8>) {
    out.push(body.kind());
    match body {
        Body::Announce(a) => {
            out.extend_from_slice(&a.job);
            out.extend_from_slice(&a.epoch.to_le_bytes());
            out.extend_from_slice(&a.step.to_le_bytes());
            out.extend_from_slice(&a.member.to_le_bytes());
            out.extend_from_slice(&a.payload_hash);
            out.extend_from_slice(&a.momentum_hash);
            out.extend_from_slice(&a.basis);
            out.extend_from_slice(&a.len.to_le_bytes());
            out.extend_from_slice(&a.produced_us.to_le_bytes());
            out.extend_from_slice(&a.chain_step.to_le_bytes());
            out.extend_from_slice(&a.chain);
        }
        Body::Manifest(m) => manifest_bytes(m, out),
        Body::Heartbeat(h) => {
            out.extend_from_slice(&h.job);
            out.extend_from_slice(&h.epoch.to_le_bytes());
            out.extend_from_slice(&h.member.to_le_bytes());
            out.extend_from_slice(&h.seq.to_le_bytes());
            out.extend_from_slice(&h.ready_from.to_le_bytes());
            out.extend_from_slice(&h.applied.to_le_bytes());
            out.extend_from_slice(&h.auditing.to_le_bytes());
            out.extend_from_slice(&h.chain_step.to_le_bytes());
            out.extend_from_slice(&h.chain);
        }
        Body::Accuse(a) => {
            out.extend_from_slice(&a.job);
            out.extend_from_slice(&a.epoch.to_le_bytes());
            out.extend_from_slice(&a.step.to_le_bytes());
            out.extend_from_slice(&a.accused.to_le_bytes());
            out.extend_from_slice(&a.witness.to_le_bytes());
            out.extend_from_slice(&a.evidence);
            out.extend_from_slice(&a.overlap.to_le_bytes());
            out.extend_from_slice(&a.agreement.to_le_bytes());
            match a.ground {
                Ground::Screened => out.push(0),
                Ground::Drawn { by, coin } => {
                    out.push(1);
                    out.extend_from_slice(&by.to_le_bytes());
                    out.extend_from_slice(&coin);
                }
                Ground::Equivocation => out.push(2),
                Ground::ForgedEntry => out.push(3),
                Ground::ForeignBasis => out.push(6),
                Ground::Sampled { shard } => {
                    out.push(5);
                    out.extend_from_slice(&shard.to_le_bytes());
                }
                Ground::FalseSum {
                    shard,
                    manifest,
                    hash,
                    sig,
                } => {
                    out.push(4);
                    out.extend_from_slice(&shard.to_le_bytes());
                    out.extend_from_slice(&manifest);
                    out.extend_from_slice(&hash);
                    out.extend_from_slice(&sig);
                }
            }
        }
        Body::SumHash(h) => {
            out.extend_from_slice(&h.job);
            out.extend_from_slice(&h.epoch.to_le_bytes());
            out.extend_from_slice(&h.step.to_le_bytes());
            out.extend_from_slice(&h.shard.to_le_bytes());
            out.extend_from_slice(&h.aggregator.to_le_bytes());
            out.extend_from_slice(&h.manifest);
            out.extend_from_slice(&h.hash);
        }
        Body::Withheld(w) => {
            out.extend_from_slice(&w.job);
            out.extend_from_slice(&w.epoch.to_le_bytes());
            out.extend_from_slice(&w.step.to_le_bytes());
            out.extend_from_slice(&w.shard.to_le_bytes());
            out.extend_from_slice(&w.aggregator.to_le_bytes());
            out.extend_from_slice(&w.manifest);
            out.extend_from_slice(&w.member.to_le_bytes());
        }
    }
}

fn manifest_bytes(m: &Manifest, out: &mut Vec<u8>) {
    out.extend_from_slice(&m.job);
    out.extend_from_slice(&m.epoch.to_le_bytes());
    out.extend_from_slice(&m.step.to_le_bytes());
    out.push(m.attempt);
    out.extend_from_slice(&m.leader.to_le_bytes());
    out.extend_from_slice(&m.state_hash);
    out.extend_from_slice(&m.parent);
    out.extend_from_slice(&(m.entries.len() as u16).to_le_bytes());
    for (member, hash) in &m.entries {
        out.extend_from_slice(&member.to_le_bytes());
        out.extend_from_slice(hash);
    }
}

/// Encodes and signs `body` with the node key.
pub fn sign(body: &Body, key: &ed25519::Keypair) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    body_bytes(body, &mut out);
    let sig = key.sign(&signing_input(&out));
    out.extend_from_slice(&key.public().to_bytes());
    out.extend_from_slice(&sig);
    out
}

/// The signature in a signed envelope (its last 64 bytes).
pub fn signature(raw: &[u8]) -> Option<[u8; 64]> {
    raw.get(raw.len().checked_sub(64)?..)?.try_into().ok()
}

/// Whether `sig` is `signer`'s signature over `body`: a message checked
/// from its parts, as a false-sum accusation carries the aggregator's
/// claim (its body is rebuilt from the accusation, the signature quoted).
pub fn signed_by(body: &Body, signer: &[u8; 32], sig: &[u8; 64]) -> bool {
    let mut unsigned = Vec::with_capacity(160);
    unsigned.extend_from_slice(MAGIC);
    unsigned.push(VERSION);
    body_bytes(body, &mut unsigned);
    ed25519::PublicKey::try_from_bytes(signer)
        .is_ok_and(|k| k.verify(&signing_input(&unsigned), sig))
}

fn signing_input(unsigned: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + unsigned.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(unsigned);
    m
}

fn parse_body(r: &mut Reader) -> Result<Body, cohort_program::codec::CodecError> {
    Ok(match r.u8()? {
        1 => Body::Announce(Announce {
            job: r.array()?,
            epoch: r.u32()?,
            step: r.u32()?,
            member: r.u32()?,
            payload_hash: r.array()?,
            momentum_hash: r.array()?,
            basis: r.array()?,
            len: r.u32()?,
            produced_us: r.u64()?,
            chain_step: r.u32()?,
            chain: r.array()?,
        }),
        2 => {
            let job = r.array()?;
            let epoch = r.u32()?;
            let step = r.u32()?;
            let attempt = r.u8()?;
            let leader = r.u32()?;
            let state_hash = r.array()?;
            let parent = r.array()?;
            let n = r.u16()? as usize;
            if n > MAX_MANIFEST_ENTRIES {
                return Err(cohort_program::codec::CodecError);
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push((r.u32()?, r.array()?));
            }
            Body::Manifest(Manifest {
                job,
                epoch,
                step,
                attempt,
                leader,
                state_hash,
                parent,
                entries,
            })
        }
        3 => Body::Heartbeat(Heartbeat {
            job: r.array()?,
            epoch: r.u32()?,
            member: r.u32()?,
            seq: r.u64()?,
            ready_from: r.u32()?,
            applied: r.u32()?,
            auditing: r.u32()?,
            chain_step: r.u32()?,
            chain: r.array()?,
        }),
        4 => Body::Accuse(Accuse {
            job: r.array()?,
            epoch: r.u32()?,
            step: r.u32()?,
            accused: r.u32()?,
            witness: r.u32()?,
            evidence: r.array()?,
            overlap: r.u16()?,
            agreement: r.u16()?,
            ground: match r.u8()? {
                0 => Ground::Screened,
                1 => Ground::Drawn {
                    by: r.u32()?,
                    coin: r.array()?,
                },
                2 => Ground::Equivocation,
                3 => Ground::ForgedEntry,
                4 => Ground::FalseSum {
                    shard: r.u32()?,
                    manifest: r.array()?,
                    hash: r.array()?,
                    sig: r.array()?,
                },
                5 => Ground::Sampled { shard: r.u32()? },
                6 => Ground::ForeignBasis,
                _ => return Err(cohort_program::codec::CodecError),
            },
        }),
        5 => Body::SumHash(SumHash {
            job: r.array()?,
            epoch: r.u32()?,
            step: r.u32()?,
            shard: r.u32()?,
            aggregator: r.u32()?,
            manifest: r.array()?,
            hash: r.array()?,
        }),
        6 => Body::Withheld(Withheld {
            job: r.array()?,
            epoch: r.u32()?,
            step: r.u32()?,
            shard: r.u32()?,
            aggregator: r.u32()?,
            manifest: r.array()?,
            member: r.u32()?,
        }),
        _ => return Err(cohort_program::codec::CodecError),
    })
}

/// Size, format and signature checks. Membership, job and replay are the
/// receiving node's business (it knows the job).
pub fn open(raw: &[u8]) -> Result<Signed, Drop> {
    open_checked(raw, |_, _| Ok(()))
}

/// `open`, with `admit` (the receiver's cheap checks: job, membership,
/// window) run on the parsed body and claimed signer before the signature
/// is verified, so a flood from non-members costs no signature checks.
pub fn open_checked(
    raw: &[u8],
    admit: impl FnOnce(&Body, &[u8; 32]) -> Result<(), Drop>,
) -> Result<Signed, Drop> {
    if raw.len() > MAX_GOSSIP {
        return Err(Drop::Oversized);
    }
    if raw.len() < MAGIC.len() + 2 + TRAILER || &raw[..3] != MAGIC || raw[3] != VERSION {
        return Err(Drop::Malformed);
    }
    let (unsigned, trailer) = raw.split_at(raw.len() - TRAILER);
    let mut r = Reader::new(&unsigned[4..]);
    let body = parse_body(&mut r).map_err(|_| Drop::Malformed)?;
    if r.remaining() != 0 {
        return Err(Drop::Malformed);
    }
    if let Body::Manifest(m) = &body
        && !m.entries.windows(2).all(|w| w[0].0 < w[1].0)
    {
        return Err(Drop::Malformed);
    }
    let signer: [u8; 32] = trailer[..32].try_into().map_err(|_| Drop::Malformed)?;
    admit(&body, &signer)?;
    let key = ed25519::PublicKey::try_from_bytes(&signer).map_err(|_| Drop::BadSignature)?;
    if !key.verify(&signing_input(unsigned), &trailer[32..]) {
        return Err(Drop::BadSignature);
    }
    Ok(Signed {
        body,
        signer,
        raw: raw.to_vec(),
    })
}

/// Blob requests over request-response: payloads by hash, missed
/// manifests, checkpoint chunks for joiners, a member's momentum for an
/// audit, and a witness's co-signature on a fraud report. Every blob
/// (payload, state, momentum) is asked for by offset and answered in
/// [`Response::Part`]s of at most [`PART`] bytes, with u64 sizes: a
/// download resumes where it stopped, from any holder, and no blob is
/// bounded by one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The payload whose signed bytes hash to `hash`, from `offset` on.
    Payload {
        hash: [u8; 32],
        offset: u64,
    },
    Manifest {
        step: u32,
    },
    Snapshot {
        step: u32,
        offset: u64,
    },
    /// The momentum this member committed to in its contribution to `step`
    /// (answered in parts, as a snapshot is).
    Momentum {
        step: u32,
        offset: u64,
    },
    /// A Solana transaction message to co-sign (see `Cosigner`).
    Cosign(Vec<u8>),
    /// The sender's slice of `shard` for `step`, pushed to an aggregator of
    /// the shard before the sender announces (sharded exchange).
    Push {
        step: u32,
        shard: u32,
        slice: Slice,
    },
    /// `member`'s slice of `shard`, from the member or an aggregator.
    Slice {
        step: u32,
        shard: u32,
        member: u32,
    },
    /// An aggregator's vote sums of `shard` under the manifest `manifest`.
    Sum {
        step: u32,
        shard: u32,
        manifest: [u8; 32],
    },
    /// `member`'s slice of `shard`, handed to a seat that said nobody
    /// serves it (checked there against the member's root, as a push is).
    Hand {
        step: u32,
        shard: u32,
        member: u32,
        slice: Slice,
    },
    /// The sender's signed [`SumHash`] for `shard` (the sender is its
    /// aggregator), sent by a seat straight to every member: each gets it
    /// once, where gossip sent it about six times over a mesh.
    Claim {
        step: u32,
        shard: u32,
        manifest: [u8; 32],
        hash: [u8; 32],
        sig: [u8; 64],
    },
}

/// A seat's signature on its sum hash for one shard, as a sum answer
/// carries it: the rest of the signed [`SumHash`] (job, epoch, step,
/// shard, manifest) is the request's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub aggregator: u32,
    pub hash: [u8; 32],
    pub sig: [u8; 64],
}

impl Claim {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.aggregator.to_le_bytes());
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.sig);
    }

    fn decode(r: &mut Reader) -> Option<Self> {
        Some(Self {
            aggregator: r.u32().ok()?,
            hash: r.array().ok()?,
            sig: r.array().ok()?,
        })
    }
}

/// Most signed hashes one sum answer carries: a shard's seats and every
/// round of its reserve seats (`shard::RESERVE_ROUNDS` of `Plan::REDUNDANCY`),
/// with room to spare.
pub const MAX_CLAIMS: usize = 16;

/// A member's signs in one shard and the Merkle path from their leaf
/// ([`crate::shard::slice_leaf`]) to the root it signed in its
/// announcement: checkable alone, whoever serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub signs: Vec<bool>,
    pub path: Vec<[u8; 32]>,
}

impl Slice {
    /// Whether this is slice `shard` of `shards` under `root`.
    pub fn proves(&self, root: &[u8; 32], shards: usize, shard: usize) -> bool {
        crate::merkle::verify(
            root,
            shards,
            shard,
            &crate::shard::slice_leaf(shard, &self.signs),
            &self.path,
        )
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.signs.len() as u32).to_le_bytes());
        out.extend_from_slice(&crate::shard::pack_signs(&self.signs));
        out.push(self.path.len() as u8);
        for h in &self.path {
            out.extend_from_slice(h);
        }
    }

    fn decode(r: &mut Reader) -> Option<Self> {
        let count = r.u32().ok()? as usize;
        if count > MAX_SLICE_SIGNS {
            return None;
        }
        let signs = crate::shard::unpack_signs(r.bytes(count.div_ceil(8)).ok()?, count)?;
        let depth = r.u8().ok()? as usize;
        if depth > MAX_PATH {
            return None;
        }
        let path = (0..depth)
            .map(|_| r.array().ok())
            .collect::<Option<Vec<[u8; 32]>>>()?;
        Some(Self { signs, path })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The signed manifest envelope.
    Manifest(Vec<u8>),
    /// The piece of a blob of `total` bytes that starts at `offset`: all
    /// [`PART`] bytes long but the last.
    Part {
        total: u64,
        offset: u64,
        chunk: Vec<u8>,
    },
    /// An ed25519 signature over the message of a `Cosign` request.
    Signature([u8; 64]),
    NotFound,
    /// A pushed slice was kept.
    Taken,
    Slice(Slice),
    /// A shard's vote sums ([`crate::shard::pack_sums`] on the wire), with
    /// the signed hashes of them its server holds (its own among them, if
    /// a seat): the asker needs every seat's, and a lost `Request::Claim`
    /// would otherwise leave it waiting out `exchange::Timing::agree`.
    Sum {
        sums: Vec<i32>,
        claims: Vec<Claim>,
    },
}

/// Largest Solana transaction message a witness is asked to co-sign (the
/// packet size).
pub const MAX_COSIGN: usize = 1232;
/// Blobs are answered in parts of this size.
pub const PART: usize = 256 * 1024;
/// Most positions in one shard, so most signs in a slice: its vote sums
/// fit one response even at 32 bits each. A 1.21 B-parameter model has
/// about 1.2 M drawn positions, so a node splits it into 19 shards or more.
pub const MAX_SLICE_SIGNS: usize = PART / 4;
/// Deepest Merkle path a slice carries (2^32 shards).
pub const MAX_PATH: usize = 32;
/// Largest request on the wire: a handed slice of the most signs (kind,
/// step, shard, member, count, signs, path).
pub const MAX_REQUEST: usize = 1 + 12 + 4 + MAX_SLICE_SIGNS / 8 + 1 + 32 * MAX_PATH;
/// Largest response: a part plus its headers, a manifest, or a sum with
/// its claims.
pub const MAX_RESPONSE: usize = PART + 64 + MAX_CLAIMS * CLAIM_BYTES;
/// A [`Claim`] on the wire (aggregator, hash, signature).
pub const CLAIM_BYTES: usize = 4 + 32 + 64;
/// Largest payload a node downloads. A 1.21 B-parameter model's payload at
/// 4 coefficients per 64 x 64 chunk is 1.96 MB; this leaves room for 30
/// times more coefficients.
pub const MAX_PAYLOAD: u64 = 64 << 20;

/// Whether a part of `len` bytes at `offset` of a blob of `total` bytes
/// continues a download that holds `held` bytes: it starts where they end,
/// stays within the blob, and is full unless it is the last. The one rule
/// every blob download (payload, state, momentum) checks parts against.
pub fn part_continues(held: usize, total: u64, offset: u64, len: usize) -> bool {
    let end = offset + len as u64;
    offset == held as u64 && end <= total && (len == PART || end == total)
}

impl Response {
    /// Bytes of content it carries (headers aside).
    pub fn wire_len(&self) -> usize {
        match self {
            Response::Manifest(b) => b.len(),
            Response::Part { chunk, .. } => chunk.len(),
            Response::Signature(_) => 64,
            Response::NotFound | Response::Taken => 0,
            Response::Slice(s) => s.signs.len().div_ceil(8) + 32 * s.path.len(),
            Response::Sum { sums, claims } => {
                crate::shard::pack_sums(sums).len() + 1 + CLAIM_BYTES * claims.len()
            }
        }
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        match self {
            Request::Payload { hash, offset } => {
                out.push(0);
                out.extend_from_slice(hash);
                out.extend_from_slice(&offset.to_le_bytes());
            }
            Request::Manifest { step } => {
                out.push(1);
                out.extend_from_slice(&step.to_le_bytes());
            }
            Request::Snapshot { step, offset } => {
                out.push(2);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
            }
            Request::Momentum { step, offset } => {
                out.push(3);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
            }
            Request::Cosign(message) => {
                out.push(4);
                out.extend_from_slice(message);
            }
            Request::Push { step, shard, slice } => {
                out.push(5);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&shard.to_le_bytes());
                slice.encode(&mut out);
            }
            Request::Slice {
                step,
                shard,
                member,
            } => {
                out.push(6);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&shard.to_le_bytes());
                out.extend_from_slice(&member.to_le_bytes());
            }
            Request::Sum {
                step,
                shard,
                manifest,
            } => {
                out.push(7);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&shard.to_le_bytes());
                out.extend_from_slice(manifest);
            }
            Request::Hand {
                step,
                shard,
                member,
                slice,
            } => {
                out.push(8);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&shard.to_le_bytes());
                out.extend_from_slice(&member.to_le_bytes());
                slice.encode(&mut out);
            }
            Request::Claim {
                step,
                shard,
                manifest,
                hash,
                sig,
            } => {
                out.push(9);
                out.extend_from_slice(&step.to_le_bytes());
                out.extend_from_slice(&shard.to_le_bytes());
                out.extend_from_slice(manifest);
                out.extend_from_slice(hash);
                out.extend_from_slice(sig);
            }
        }
        out
    }
    pub fn decode(buf: &[u8]) -> Option<Self> {
        let mut r = Reader::new(buf);
        let req = match r.u8().ok()? {
            0 => Request::Payload {
                hash: r.array().ok()?,
                offset: r.u64().ok()?,
            },
            1 => Request::Manifest {
                step: r.u32().ok()?,
            },
            2 => Request::Snapshot {
                step: r.u32().ok()?,
                offset: r.u64().ok()?,
            },
            3 => Request::Momentum {
                step: r.u32().ok()?,
                offset: r.u64().ok()?,
            },
            4 if buf.len() > 1 && buf.len() <= 1 + MAX_COSIGN => {
                return Some(Request::Cosign(buf[1..].to_vec()));
            }
            5 => Request::Push {
                step: r.u32().ok()?,
                shard: r.u32().ok()?,
                slice: Slice::decode(&mut r)?,
            },
            6 => Request::Slice {
                step: r.u32().ok()?,
                shard: r.u32().ok()?,
                member: r.u32().ok()?,
            },
            7 => Request::Sum {
                step: r.u32().ok()?,
                shard: r.u32().ok()?,
                manifest: r.array().ok()?,
            },
            8 => Request::Hand {
                step: r.u32().ok()?,
                shard: r.u32().ok()?,
                member: r.u32().ok()?,
                slice: Slice::decode(&mut r)?,
            },
            9 => Request::Claim {
                step: r.u32().ok()?,
                shard: r.u32().ok()?,
                manifest: r.array().ok()?,
                hash: r.array().ok()?,
                sig: r.array().ok()?,
            },
            _ => return None,
        };
        (r.remaining() == 0).then_some(req)
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Response::Manifest(b) => {
                out.push(1);
                out.extend_from_slice(b);
            }
            Response::Part {
                total,
                offset,
                chunk,
            } => {
                out.reserve(17 + chunk.len());
                out.push(2);
                out.extend_from_slice(&total.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(chunk);
            }
            Response::NotFound => out.push(3),
            Response::Signature(sig) => {
                out.push(4);
                out.extend_from_slice(sig);
            }
            Response::Taken => out.push(5),
            Response::Slice(slice) => {
                out.push(6);
                slice.encode(&mut out);
            }
            Response::Sum { sums, claims } => {
                out.push(7);
                out.push(claims.len().min(MAX_CLAIMS) as u8);
                for c in claims.iter().take(MAX_CLAIMS) {
                    c.encode(&mut out);
                }
                out.extend_from_slice(&crate::shard::pack_sums(sums));
            }
        }
        out
    }
    pub fn decode(buf: &[u8]) -> Option<Self> {
        let (&tag, rest) = buf.split_first()?;
        Some(match tag {
            1 => Response::Manifest(rest.to_vec()),
            2 if rest.len() >= 16 => Response::Part {
                total: u64::from_le_bytes(rest[..8].try_into().ok()?),
                offset: u64::from_le_bytes(rest[8..16].try_into().ok()?),
                chunk: rest[16..].to_vec(),
            },
            3 if rest.is_empty() => Response::NotFound,
            4 => Response::Signature(rest.try_into().ok()?),
            5 if rest.is_empty() => Response::Taken,
            6 => {
                let mut r = Reader::new(rest);
                let slice = Slice::decode(&mut r)?;
                if r.remaining() != 0 {
                    return None;
                }
                Response::Slice(slice)
            }
            7 => {
                let mut r = Reader::new(rest);
                let count = usize::from(r.u8().ok()?);
                if count > MAX_CLAIMS {
                    return None;
                }
                let claims = (0..count)
                    .map(|_| Claim::decode(&mut r))
                    .collect::<Option<Vec<_>>>()?;
                let sums = crate::shard::unpack_sums(r.bytes(r.remaining()).ok()?)?;
                Response::Sum { sums, claims }
            }
            _ => return None,
        })
    }
}

/// The ed25519 key a member signs with, from its 32-byte secret seed.
pub fn keypair(secret: &[u8; 32]) -> ed25519::Keypair {
    let mut s = *secret;
    ed25519::Keypair::from(ed25519::SecretKey::try_from_bytes(&mut s).expect("32 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> ed25519::Keypair {
        keypair(&[i; 32])
    }

    fn manifest() -> Body {
        Body::Manifest(Manifest {
            job: [7; 32],
            epoch: 1,
            step: 9,
            attempt: 0,
            leader: 2,
            state_hash: [3; 32],
            parent: [4; 32],
            entries: vec![(0, [1; 32]), (2, [2; 32])],
        })
    }

    #[test]
    fn signed_messages_round_trip_and_any_bit_flip_is_refused() {
        let k = key(1);
        for body in [
            manifest(),
            Body::Heartbeat(Heartbeat {
                job: [7; 32],
                epoch: 2,
                member: 3,
                seq: 5,
                ready_from: 4,
                applied: 3,
                auditing: 1,
                chain_step: 3,
                chain: [6; 32],
            }),
            Body::Announce(Announce {
                job: [7; 32],
                epoch: 0,
                step: 4,
                member: 1,
                payload_hash: [9; 32],
                momentum_hash: [8; 32],
                basis: [5; 32],
                len: 600,
                produced_us: 12,
                chain_step: 3,
                chain: [4; 32],
            }),
            Body::Accuse(Accuse {
                job: [7; 32],
                epoch: 1,
                step: 9,
                accused: 2,
                witness: 0,
                evidence: [6; 32],
                overlap: 1200,
                agreement: 4999,
                ground: Ground::Drawn {
                    by: 1,
                    coin: [5; 64],
                },
            }),
            Body::Accuse(Accuse {
                job: [7; 32],
                epoch: 1,
                step: 9,
                accused: 3,
                witness: 0,
                evidence: [6; 32],
                overlap: 0,
                agreement: 0,
                ground: Ground::ForeignBasis,
            }),
            Body::SumHash(SumHash {
                job: [7; 32],
                epoch: 1,
                step: 9,
                shard: 3,
                aggregator: 2,
                manifest: [4; 32],
                hash: [5; 32],
            }),
            Body::Withheld(Withheld {
                job: [7; 32],
                epoch: 1,
                step: 9,
                shard: 3,
                aggregator: 2,
                manifest: [4; 32],
                member: 6,
            }),
        ] {
            let raw = sign(&body, &k);
            let got = open(&raw).unwrap();
            assert_eq!(got.body, body);
            assert_eq!(got.signer, k.public().to_bytes());
            for i in 0..raw.len() {
                let mut bad = raw.clone();
                bad[i] ^= 0x10;
                assert!(open(&bad).is_err(), "flip at byte {i} accepted");
            }
            for cut in 0..raw.len() {
                assert!(open(&raw[..cut]).is_err());
            }
        }
    }

    #[test]
    fn oversized_and_unsorted_manifests_are_refused() {
        let k = key(2);
        let mut raw = sign(&manifest(), &k);
        raw.resize(MAX_GOSSIP + 1, 0);
        assert_eq!(open(&raw), Err(Drop::Oversized));
        let Body::Manifest(mut m) = manifest() else {
            unreachable!()
        };
        m.entries.reverse();
        assert_eq!(open(&sign(&Body::Manifest(m), &k)), Err(Drop::Malformed));
    }

    #[test]
    fn a_manifest_for_the_largest_job_fits_and_one_more_member_does_not() {
        let k = key(3);
        let full = |n: usize| {
            let Body::Manifest(mut m) = manifest() else {
                unreachable!()
            };
            m.entries = (0..n as u32).map(|i| (i, [i as u8; 32])).collect();
            sign(&Body::Manifest(m), &k)
        };
        let raw = full(MAX_MANIFEST_ENTRIES);
        assert!(raw.len() <= MAX_GOSSIP, "{} bytes", raw.len());
        let Body::Manifest(m) = open(&raw).expect("largest manifest").body else {
            panic!("not a manifest")
        };
        assert_eq!(m.entries.len(), MAX_MANIFEST_ENTRIES);
        assert_eq!(
            open(&full(MAX_MANIFEST_ENTRIES + 1)).map(|_| ()),
            Err(Drop::Malformed)
        );
    }

    #[test]
    fn a_part_continues_a_download_only_where_it_ends_full_or_last() {
        assert!(part_continues(0, 3 * PART as u64, 0, PART));
        assert!(
            part_continues(PART, PART as u64 + 5, PART as u64, 5),
            "the last part"
        );
        assert!(
            !part_continues(PART, 3 * PART as u64, 0, PART),
            "an old part"
        );
        assert!(
            !part_continues(0, 3 * PART as u64, 0, 5),
            "a short part before the last"
        );
        assert!(!part_continues(0, 5, 0, 6), "past the end");
        assert!(part_continues(7, 7, 7, 0), "nothing left");
    }

    #[test]
    fn blob_requests_round_trip() {
        for r in [
            Request::Payload {
                hash: [4; 32],
                offset: 1 << 40,
            },
            Request::Manifest { step: 3 },
            Request::Snapshot {
                step: 2,
                offset: 1 << 33,
            },
            Request::Momentum { step: 5, offset: 7 },
            Request::Cosign(vec![1; MAX_COSIGN]),
        ] {
            assert_eq!(Request::decode(&r.encode()), Some(r));
        }
        for r in [
            Response::Manifest(vec![3]),
            Response::Part {
                total: 10 << 32,
                offset: 4 << 32,
                chunk: vec![5; 6],
            },
            Response::Signature([8; 64]),
            Response::NotFound,
        ] {
            assert_eq!(Response::decode(&r.encode()), Some(r));
        }
        assert_eq!(Request::decode(&[4]), None, "empty message");
        let mut long = Request::Cosign(vec![1; MAX_COSIGN]).encode();
        long.push(0);
        assert_eq!(Request::decode(&long), None, "longer than a packet");
        assert_eq!(Response::decode(&[4, 1, 2]), None, "short signature");
        assert_eq!(Request::decode(&[9]), None);
        assert_eq!(Request::decode(&[1, 0, 0, 0, 0, 0]), None);
    }

    fn slice() -> Slice {
        Slice {
            signs: (0..21).map(|i| i % 4 == 1).collect(),
            path: vec![[1; 32], [2; 32], [3; 32]],
        }
    }

    #[test]
    fn the_sharded_exchanges_requests_round_trip_and_oversized_slices_are_refused() {
        for r in [
            Request::Push {
                step: 4,
                shard: 2,
                slice: slice(),
            },
            Request::Push {
                step: 4,
                shard: 2,
                slice: Slice {
                    signs: vec![true; MAX_SLICE_SIGNS],
                    path: vec![[9; 32]; MAX_PATH],
                },
            },
            Request::Slice {
                step: 1,
                shard: 7,
                member: 40,
            },
            Request::Sum {
                step: 1,
                shard: 7,
                manifest: [6; 32],
            },
            Request::Hand {
                step: 4,
                shard: 2,
                member: 5,
                slice: Slice {
                    signs: vec![true; MAX_SLICE_SIGNS],
                    path: vec![[9; 32]; MAX_PATH],
                },
            },
            Request::Claim {
                step: 4,
                shard: 2,
                manifest: [6; 32],
                hash: [7; 32],
                sig: [8; 64],
            },
        ] {
            let bytes = r.encode();
            assert!(bytes.len() <= MAX_REQUEST);
            assert_eq!(Request::decode(&bytes), Some(r));
        }
        for r in [
            Response::Taken,
            Response::Slice(slice()),
            Response::Sum {
                sums: vec![-48, 0, 17, 48],
                claims: vec![],
            },
            Response::Sum {
                sums: vec![i32::MIN; MAX_SLICE_SIGNS],
                claims: vec![
                    Claim {
                        aggregator: 7,
                        hash: [3; 32],
                        sig: [4; 64],
                    };
                    MAX_CLAIMS
                ],
            },
        ] {
            let bytes = r.encode();
            assert!(bytes.len() <= MAX_RESPONSE);
            assert_eq!(Response::decode(&bytes), Some(r));
        }
        let push = |signs: usize, depth: usize| {
            Request::Push {
                step: 0,
                shard: 0,
                slice: Slice {
                    signs: vec![false; signs],
                    path: vec![[0; 32]; depth],
                },
            }
            .encode()
        };
        assert_eq!(Request::decode(&push(MAX_SLICE_SIGNS + 1, 0)), None);
        assert_eq!(Request::decode(&push(8, MAX_PATH + 1)), None);
        let mut trailing = Response::Slice(slice()).encode();
        trailing.push(0);
        assert_eq!(Response::decode(&trailing), None);
        let mut cut = Request::Push {
            step: 0,
            shard: 0,
            slice: slice(),
        }
        .encode();
        cut.pop();
        assert_eq!(Request::decode(&cut), None);
        // A sum answer that says it carries more claims than any shard has
        // seats is refused, and so is one whose claims run short.
        let mut many = Response::Sum {
            sums: vec![1],
            claims: vec![],
        }
        .encode();
        many[1] = MAX_CLAIMS as u8 + 1;
        assert_eq!(Response::decode(&many), None);
        let mut short = Response::Sum {
            sums: vec![],
            claims: vec![],
        }
        .encode();
        short[1] = 1;
        assert_eq!(Response::decode(&short), None);
    }

    #[test]
    fn a_slice_proves_its_place_under_the_root_its_member_signed_and_nowhere_else() {
        let slices: Vec<Vec<bool>> = (0..5)
            .map(|s| (0..9).map(|i| (i + s) % 3 == 0).collect())
            .collect();
        let root = crate::shard::commit(&slices);
        let leaves: Vec<_> = slices
            .iter()
            .enumerate()
            .map(|(i, x)| crate::shard::slice_leaf(i, x))
            .collect();
        let of = |i: usize| Slice {
            signs: slices[i].clone(),
            path: crate::merkle::path(&leaves, i),
        };
        for i in 0..5 {
            assert!(of(i).proves(&root, 5, i));
            assert!(
                !of(i).proves(&root, 5, (i + 1) % 5),
                "another shard's place"
            );
            assert!(!of(i).proves(&root, 6, i), "another count");
        }
        let mut flipped = of(2);
        flipped.signs[4] = !flipped.signs[4];
        assert!(!flipped.proves(&root, 5, 2));
    }

    #[test]
    fn a_false_sum_accusation_carries_the_aggregators_signature_and_anyone_checks_it() {
        let aggregator = key(3);
        let claim = SumHash {
            job: [7; 32],
            epoch: 1,
            step: 9,
            shard: 4,
            aggregator: 2,
            manifest: [5; 32],
            hash: sum_hash(&[3, -1, 0]),
        };
        let raw = sign(&Body::SumHash(claim.clone()), &aggregator);
        assert_eq!(open(&raw).unwrap().body, Body::SumHash(claim.clone()));
        let sig = signature(&raw).unwrap();
        let accuse = Body::Accuse(Accuse {
            job: [7; 32],
            epoch: 1,
            step: 9,
            accused: 2,
            witness: 0,
            evidence: [1; 32],
            overlap: 0,
            agreement: 0,
            ground: Ground::FalseSum {
                shard: 4,
                manifest: [5; 32],
                hash: claim.hash,
                sig,
            },
        });
        let got = open(&sign(&accuse, &key(1))).unwrap().body;
        assert_eq!(got, accuse);
        let Body::Accuse(Accuse {
            ground:
                Ground::FalseSum {
                    shard,
                    manifest,
                    hash,
                    sig,
                },
            ..
        }) = got
        else {
            unreachable!()
        };
        let rebuilt = |hash| {
            Body::SumHash(SumHash {
                shard,
                manifest,
                hash,
                ..claim.clone()
            })
        };
        let signer = aggregator.public().to_bytes();
        assert!(signed_by(&rebuilt(hash), &signer, &sig));
        assert!(
            !signed_by(&rebuilt(sum_hash(&[3, -1, 1])), &signer, &sig),
            "a claim the aggregator did not sign"
        );
        assert!(!signed_by(
            &rebuilt(hash),
            &key(4).public().to_bytes(),
            &sig
        ));
        assert_ne!(sum_hash(&[1]), sum_hash(&[1, 0]));
        // Any false claim of the seat at the step is the same case: two
        // witnesses that caught different ones count together.
        let other = SumHash {
            shard: 5,
            hash: sum_hash(&[0]),
            ..claim.clone()
        };
        assert_eq!(claim.evidence(), other.evidence());
        assert_ne!(
            claim.evidence(),
            SumHash {
                step: 10,
                ..claim.clone()
            }
            .evidence()
        );
    }
}
