//! Account layouts. Every account starts with `[type, version]`, so a decoder can
//! refuse an account of another type (type cosplay) or an unknown layout before
//! reading a single field. Sizes are fixed: nothing grows with membership.

use crate::codec::{CodecError, Reader, Writer};
use crate::error::CohortError;
use solana_program::pubkey::Pubkey;

pub const VERSION: u8 = 2;
/// Upper bound on witnesses per epoch; votes live in a fixed array.
pub const MAX_WITNESSES: usize = 16;
/// A job's random audit rate is at most every contribution (10,000 basis points).
pub const MAX_AUDIT_RATE_BP: u16 = 10_000;
/// A node's stake is locked this long after it asks to deregister, so evidence
/// of fraud in its last job can still land.
pub const NODE_COOLDOWN_SECS: i64 = 2 * 24 * 3600;
/// After a job ends (or its last epoch finalizes, whichever is later),
/// members have this long to claim and witnesses to report fraud, before the
/// job may be closed; what is still owed then is burned.
pub const CLAIM_WINDOW_SECS: i64 = 7 * 24 * 3600;
pub const NO_VOTE: u32 = u32::MAX;
/// `Member::stint_to` while the member is active: its stint has no end yet.
pub const ONGOING: u32 = u32::MAX;
/// `Job::latest_epoch` before any epoch is finalized.
pub const NO_EPOCH: u32 = u32::MAX;
/// Fraud reports may target the current epoch and the one before it, so a
/// cheat caught while its epoch finalizes (or just after) is still slashable.
pub const FRAUD_LOOKBACK_EPOCHS: u32 = 1;

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountType {
    Node = 1,
    Job = 2,
    Member = 3,
    Epoch = 4,
    Requester = 5,
    FraudCase = 6,
}

/// A fixed-size, versioned account.
pub trait AccountState: Sized {
    const TYPE: AccountType;
    /// Bytes after the two-byte header.
    const BODY_LEN: usize;
    const LEN: usize = 2 + Self::BODY_LEN;
    fn write_body(&self, w: &mut Writer);
    fn read_body(r: &mut Reader) -> Result<Self, CodecError>;

    fn decode(data: &[u8]) -> Result<Self, CohortError> {
        match data.first() {
            Some(t) if *t == Self::TYPE as u8 => {}
            _ => return Err(CohortError::WrongAccountType),
        }
        if data.get(1) != Some(&VERSION) {
            return Err(CohortError::UnsupportedVersion);
        }
        if data.len() != Self::LEN {
            return Err(CohortError::WrongAccountType);
        }
        let mut r = Reader::new(&data[2..]);
        let out = Self::read_body(&mut r).map_err(|_| CohortError::WrongAccountType)?;
        r.finish().map_err(|_| CohortError::WrongAccountType)?;
        Ok(out)
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(Self::LEN);
        w.u8(Self::TYPE as u8).u8(VERSION);
        self.write_body(&mut w);
        debug_assert_eq!(w.buf.len(), Self::LEN);
        w.buf
    }
}

fn fixed_str<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    // Truncate on a char boundary so the stored bytes stay valid UTF-8.
    let mut end = s.len().min(N);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

fn str_of(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu = 0,
    Wgpu = 1,
    Cuda = 2,
}

impl Backend {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Cpu),
            1 => Some(Self::Wgpu),
            2 => Some(Self::Cuda),
            _ => None,
        }
    }
}

/// What a node measured about itself, signed by its key. On chain the
/// transaction signature already binds it to the node; the embedded signature
/// lets peers and requesters check it off chain without the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Benchmark {
    pub device: [u8; 32],
    pub backend: u8,
    pub fp32_gflops: u32,
    pub fp16_gflops: u32,
    pub mem_bw_gbps: u32,
    pub vram_mib: u32,
    pub version: u16,
    pub signature: [u8; 64],
}

impl Benchmark {
    pub const LEN: usize = 32 + 1 + 4 * 4 + 2 + 64;

    pub fn device_name(&self) -> String {
        str_of(&self.device)
    }

    pub fn set_device_name(&mut self, name: &str) {
        self.device = fixed_str(name);
    }

    /// The bytes the node key signs: domain tag, node key, every field but the signature.
    pub fn message(&self, node: &Pubkey) -> Vec<u8> {
        let mut w = Writer::with_capacity(16 + 32 + Self::LEN);
        w.bytes(b"cohort-bench-v1\0").pubkey(node);
        self.write_unsigned(&mut w);
        w.buf
    }

    fn write_unsigned(&self, w: &mut Writer) {
        w.bytes(&self.device)
            .u8(self.backend)
            .u32(self.fp32_gflops)
            .u32(self.fp16_gflops)
            .u32(self.mem_bw_gbps)
            .u32(self.vram_mib)
            .u16(self.version);
    }

    pub fn write(&self, w: &mut Writer) {
        self.write_unsigned(w);
        w.bytes(&self.signature);
    }

    pub fn read(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            device: r.array()?,
            backend: r.u8()?,
            fp32_gflops: r.u32()?,
            fp16_gflops: r.u32()?,
            mem_bw_gbps: r.u32()?,
            vram_mib: r.u32()?,
            version: r.u16()?,
            signature: r.array()?,
        })
    }
}

impl Default for Benchmark {
    fn default() -> Self {
        Self {
            device: [0; 32],
            backend: 0,
            fp32_gflops: 0,
            fp16_gflops: 0,
            mem_bw_gbps: 0,
            vram_mib: 0,
            version: 0,
            signature: [0; 64],
        }
    }
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    Active = 1,
    Deregistering = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub bump: u8,
    pub owner: Pubkey,
    /// Lamports held in this account on top of its rent.
    pub stake: u64,
    /// Lamports asked per node-epoch.
    pub price: u64,
    pub available_from: i64,
    pub available_until: i64,
    pub benchmark: Benchmark,
    pub status: NodeStatus,
    pub unlock_at: i64,
    pub epochs_attested: u32,
    pub audits_failed: u32,
    pub slashes: u32,
    /// `Pubkey::default()` when idle.
    pub active_job: Pubkey,
}

impl AccountState for Node {
    const TYPE: AccountType = AccountType::Node;
    const BODY_LEN: usize = 1 + 32 + 8 * 4 + Benchmark::LEN + 1 + 8 + 4 * 3 + 32;

    fn write_body(&self, w: &mut Writer) {
        w.u8(self.bump)
            .pubkey(&self.owner)
            .u64(self.stake)
            .u64(self.price)
            .i64(self.available_from)
            .i64(self.available_until);
        self.benchmark.write(w);
        w.u8(self.status as u8)
            .i64(self.unlock_at)
            .u32(self.epochs_attested)
            .u32(self.audits_failed)
            .u32(self.slashes)
            .pubkey(&self.active_job);
    }

    fn read_body(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            bump: r.u8()?,
            owner: r.pubkey()?,
            stake: r.u64()?,
            price: r.u64()?,
            available_from: r.i64()?,
            available_until: r.i64()?,
            benchmark: Benchmark::read(r)?,
            status: match r.u8()? {
                1 => NodeStatus::Active,
                2 => NodeStatus::Deregistering,
                _ => return Err(CodecError),
            },
            unlock_at: r.i64()?,
            epochs_attested: r.u32()?,
            audits_failed: r.u32()?,
            slashes: r.u32()?,
            active_job: r.pubkey()?,
        })
    }
}

/// What `join_job` needs to know about a node: the one rule for who may
/// join a job ([`may_join`]) reads only this, so `cohort node`, the GUI and
/// the program decide alike, even for a node not registered yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub fp32_gflops: u32,
    pub price: u64,
    pub stake: u64,
    pub available_from: i64,
    pub available_until: i64,
    /// Active (not deregistering) and in no other job.
    pub idle: bool,
}

impl Candidate {
    pub fn of(node: &Node) -> Self {
        Self {
            fp32_gflops: node.benchmark.fp32_gflops,
            price: node.price,
            stake: node.stake,
            available_from: node.available_from,
            available_until: node.available_until,
            idle: node.status == NodeStatus::Active && node.active_job == Pubkey::default(),
        }
    }
}

/// The one rule for who may join `job` at `now`, in the order `join_job`
/// reports it: the job takes members (Open or Running), the node is idle,
/// there is a free slot, and the node's benchmark, price, stake and
/// availability meet the spec.
pub fn may_join(job: &Job, node: &Candidate, now: i64) -> Result<(), CohortError> {
    if !matches!(job.state, JobState::Open | JobState::Running) {
        return Err(CohortError::InvalidJobState);
    }
    if !node.idle {
        return Err(CohortError::NodeBusy);
    }
    if job.member_count >= job.spec.max_nodes as u32 {
        return Err(CohortError::JobFull);
    }
    if node.fp32_gflops < job.spec.min_fp32_gflops {
        return Err(CohortError::Underpowered);
    }
    if node.price > job.spec.max_price {
        return Err(CohortError::Overpriced);
    }
    if node.stake < job.spec.min_stake {
        return Err(CohortError::InsufficientStake);
    }
    if now < node.available_from || now >= node.available_until {
        return Err(CohortError::NodeUnavailable);
    }
    Ok(())
}

/// What the requester asks for. Validated once, at `create_job`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpec {
    /// Hash of the model config the engine builds from `arch`.
    pub model_hash: [u8; 32],
    /// Human-readable architecture, e.g. `gpt l4 d256 h4 s128`.
    pub arch: [u8; 64],
    /// Hash of the versioned training recipe (compression, learning-rate
    /// schedule, batch, momentum decay) every member must train with: a
    /// member on another build refuses the job instead of silently
    /// rejecting its peers' payloads.
    pub recipe_hash: [u8; 32],
    /// Content hash of the dataset.
    pub dataset_id: [u8; 32],
    pub global_batch: u32,
    pub seq_len: u32,
    pub steps_per_epoch: u32,
    pub epochs: u32,
    pub expected_epoch_secs: u32,
    /// An epoch not finalized this long after it started lets anyone expire the job.
    pub max_epoch_secs: u32,
    /// The job may be expired if it has not started this long after creation.
    pub join_window_secs: u32,
    pub min_nodes: u16,
    pub max_nodes: u16,
    pub min_fp32_gflops: u32,
    /// Lamports per node-epoch the requester pays; nodes asking more cannot join.
    pub max_price: u64,
    pub min_stake: u64,
    pub witness_count: u8,
    pub quorum: u8,
    /// Share of contributions the witnesses audit at random, in basis
    /// points (on top of every one the screen flags). Auditing costs the
    /// witnesses compute, so the requester who pays for it chooses it.
    pub audit_rate_bp: u16,
}

impl JobSpec {
    pub const LEN: usize = 32 + 64 + 32 + 32 + 4 * 7 + 2 * 2 + 4 + 8 + 8 + 1 + 1 + 2;

    pub fn arch_name(&self) -> String {
        str_of(&self.arch)
    }

    pub fn set_arch(&mut self, arch: &str) {
        self.arch = fixed_str(arch);
    }

    /// The human-readable architecture, as `set_arch` stored it.
    pub fn arch_str(&self) -> String {
        let end = self
            .arch
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.arch.len());
        String::from_utf8_lossy(&self.arch[..end]).into_owned()
    }

    /// The checks `create_job` applies; clients call it too, to fail before sending.
    pub fn validate(&self) -> Result<(), CohortError> {
        let w = self.witness_count as usize;
        let ok = self.steps_per_epoch > 0
            && self.recipe_hash != [0; 32]
            && self.epochs > 0
            && self.global_batch > 0
            && self.seq_len > 0
            && self.max_epoch_secs > 0
            && self.join_window_secs > 0
            && self.min_nodes > 0
            && self.min_nodes <= self.max_nodes
            && self.max_price > 0
            && self.min_stake > 0
            && (1..=MAX_WITNESSES).contains(&w)
            && w <= self.min_nodes as usize
            // A strict majority of the committee, so two digests can never both reach quorum.
            && (self.quorum as usize) * 2 > w
            && self.quorum as usize <= w
            && self.audit_rate_bp <= MAX_AUDIT_RATE_BP;
        if ok {
            Ok(())
        } else {
            Err(CohortError::InvalidSpec)
        }
    }

    /// `max_price * max_nodes * epochs`, the deposit that fully funds the job.
    pub fn full_budget(&self) -> Option<u64> {
        let v = (self.max_price as u128)
            .checked_mul(self.max_nodes as u128)?
            .checked_mul(self.epochs as u128)?;
        u64::try_from(v).ok()
    }

    pub fn write(&self, w: &mut Writer) {
        w.bytes(&self.model_hash)
            .bytes(&self.arch)
            .bytes(&self.recipe_hash)
            .bytes(&self.dataset_id)
            .u32(self.global_batch)
            .u32(self.seq_len)
            .u32(self.steps_per_epoch)
            .u32(self.epochs)
            .u32(self.expected_epoch_secs)
            .u32(self.max_epoch_secs)
            .u32(self.join_window_secs)
            .u16(self.min_nodes)
            .u16(self.max_nodes)
            .u32(self.min_fp32_gflops)
            .u64(self.max_price)
            .u64(self.min_stake)
            .u8(self.witness_count)
            .u8(self.quorum)
            .u16(self.audit_rate_bp);
    }

    pub fn read(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            model_hash: r.array()?,
            arch: r.array()?,
            recipe_hash: r.array()?,
            dataset_id: r.array()?,
            global_batch: r.u32()?,
            seq_len: r.u32()?,
            steps_per_epoch: r.u32()?,
            epochs: r.u32()?,
            expected_epoch_secs: r.u32()?,
            max_epoch_secs: r.u32()?,
            join_window_secs: r.u32()?,
            min_nodes: r.u16()?,
            max_nodes: r.u16()?,
            min_fp32_gflops: r.u32()?,
            max_price: r.u64()?,
            min_stake: r.u64()?,
            witness_count: r.u8()?,
            quorum: r.u8()?,
            audit_rate_bp: r.u16()?,
        })
    }
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Open = 1,
    Running = 2,
    Completed = 3,
    Cancelled = 4,
    Expired = 5,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Cancelled | Self::Expired)
    }
}

/// The job and its escrow: the account's lamports are rent + deposit + slashed
/// stake - paid out - refunded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub bump: u8,
    pub requester: Pubkey,
    pub job_id: u64,
    pub spec: JobSpec,
    pub deposit: u64,
    /// Stake slashed from fraudulent members; refunded to the requester.
    pub slashed: u64,
    /// Lamports earned by members per finalized roots: `total_points * price / steps`.
    pub owed: u64,
    pub paid_out: u64,
    pub refunded: u64,
    /// Most the open epoch can add to `owed`; held back from refunds until it closes.
    pub reserve: u64,
    pub state: JobState,
    /// Epochs started so far; the current epoch's index is `epochs_started - 1`.
    pub epochs_started: u32,
    pub epochs_finalized: u32,
    /// Epochs that timed out unattested (`skip_epoch`): closed, never paid.
    pub epochs_skipped: u32,
    /// The epoch whose root is `latest_root` (`NO_EPOCH` before the first).
    pub latest_epoch: u32,
    pub member_count: u32,
    pub created_at: i64,
    /// When the job may be expired if nothing moves it forward first.
    pub deadline: i64,
    pub ended_at: i64,
    /// Cumulative accepted contributions over all members, per the latest root.
    pub total_points: u64,
    pub latest_root: [u8; 32],
    pub latest_model_hash: [u8; 32],
}

impl Job {
    pub fn current_epoch(&self) -> Option<u32> {
        self.epochs_started.checked_sub(1)
    }

    /// Epochs that are over, paid (finalized) or not (skipped).
    pub fn epochs_closed(&self) -> u32 {
        self.epochs_finalized.saturating_add(self.epochs_skipped)
    }

    /// The epoch whose attested root a claim proves against, if any.
    pub fn latest_finalized(&self) -> Option<u32> {
        (self.latest_epoch != NO_EPOCH).then_some(self.latest_epoch)
    }

    /// Members needed to start the next epoch: `min_nodes` to begin, then
    /// enough to attest (a quorum), so a member slashed or gone mid-job
    /// does not strand the others.
    pub fn members_to_start(&self) -> u32 {
        if self.state == JobState::Open {
            self.spec.min_nodes as u32
        } else {
            (self.spec.quorum as u32).max(1)
        }
    }

    /// Lamports owed to members for `points` cumulative contributions: a node that
    /// contributes every step of an epoch earns exactly `max_price` for it.
    pub fn points_value(&self, points: u64) -> Option<u64> {
        let v = (points as u128).checked_mul(self.spec.max_price as u128)?
            / self.spec.steps_per_epoch as u128;
        u64::try_from(v).ok()
    }

    /// What the requester may take back without touching what is owed or
    /// reserved. Slashed stake never enters the job (it is burned), so it is
    /// not part of this.
    pub fn refundable(&self) -> Option<u64> {
        self.deposit
            .checked_sub(self.refunded)?
            .checked_sub(self.owed)?
            .checked_sub(self.reserve)
    }

    /// The epoch still being trained and attested, if any: the current epoch
    /// of a running job, or of a cancelled job whose open epoch may still finish.
    pub fn open_epoch(&self) -> Option<u32> {
        let open = match self.state {
            JobState::Running => self.epochs_closed() < self.epochs_started,
            JobState::Cancelled => self.reserve > 0,
            _ => false,
        };
        if open { self.current_epoch() } else { None }
    }

    /// Members may claim (and witnesses report) until this time; it counts
    /// from the job's end or its latest finalization, whichever is later.
    pub fn claim_deadline(&self) -> i64 {
        self.ended_at.saturating_add(CLAIM_WINDOW_SECS)
    }

    /// Still inside the claim window: terminal, and the window has not run out.
    pub fn in_claim_window(&self, now: i64) -> bool {
        self.state.is_terminal() && now < self.claim_deadline()
    }

    /// Whether a fraud report may still target epoch `e`: it has started, it
    /// is the current epoch or at most `FRAUD_LOOKBACK_EPOCHS` before it, and
    /// the job is running or still inside its claim window. `close_epoch`
    /// keeps every such epoch, so the report always finds its committee.
    pub fn fraud_targetable(&self, e: u32, now: i64) -> bool {
        let recent = e < self.epochs_started
            && e.saturating_add(FRAUD_LOOKBACK_EPOCHS + 1) >= self.epochs_started;
        let live = match self.state {
            JobState::Open | JobState::Running => true,
            _ => self.in_claim_window(now),
        };
        recent && live
    }

    /// The most cumulative points a member present in `epochs_present`
    /// epochs can have earned: one per step of each.
    pub fn points_cap(&self, epochs_present: u32) -> u64 {
        (self.spec.steps_per_epoch as u64).saturating_mul(epochs_present as u64)
    }
}

impl AccountState for Job {
    const TYPE: AccountType = AccountType::Job;
    const BODY_LEN: usize = 1 + 32 + 8 + JobSpec::LEN + 8 * 6 + 1 + 4 * 5 + 8 * 3 + 8 + 32 + 32;

    fn write_body(&self, w: &mut Writer) {
        w.u8(self.bump).pubkey(&self.requester).u64(self.job_id);
        self.spec.write(w);
        w.u64(self.deposit)
            .u64(self.slashed)
            .u64(self.owed)
            .u64(self.paid_out)
            .u64(self.refunded)
            .u64(self.reserve)
            .u8(self.state as u8)
            .u32(self.epochs_started)
            .u32(self.epochs_finalized)
            .u32(self.epochs_skipped)
            .u32(self.latest_epoch)
            .u32(self.member_count)
            .i64(self.created_at)
            .i64(self.deadline)
            .i64(self.ended_at)
            .u64(self.total_points)
            .bytes(&self.latest_root)
            .bytes(&self.latest_model_hash);
    }

    fn read_body(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            bump: r.u8()?,
            requester: r.pubkey()?,
            job_id: r.u64()?,
            spec: JobSpec::read(r)?,
            deposit: r.u64()?,
            slashed: r.u64()?,
            owed: r.u64()?,
            paid_out: r.u64()?,
            refunded: r.u64()?,
            reserve: r.u64()?,
            state: match r.u8()? {
                1 => JobState::Open,
                2 => JobState::Running,
                3 => JobState::Completed,
                4 => JobState::Cancelled,
                5 => JobState::Expired,
                _ => return Err(CodecError),
            },
            epochs_started: r.u32()?,
            epochs_finalized: r.u32()?,
            epochs_skipped: r.u32()?,
            latest_epoch: r.u32()?,
            member_count: r.u32()?,
            created_at: r.i64()?,
            deadline: r.i64()?,
            ended_at: r.i64()?,
            total_points: r.u64()?,
            latest_root: r.array()?,
            latest_model_hash: r.array()?,
        })
    }
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberStatus {
    Active = 1,
    Left = 2,
    Slashed = 3,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub bump: u8,
    pub job: Pubkey,
    /// The node operator's key (the `Node` account's owner).
    pub node: Pubkey,
    /// Dense position among the job's active members: `0..job.member_count`.
    /// Leaving swaps the last member into the gap so committees stay dense.
    pub index: u32,
    /// First epoch index this member may witness.
    pub joined_epoch: u32,
    pub status: MemberStatus,
    pub last_voted_epoch: u32,
    pub claimed: u64,
    /// First epoch this member ever took part in (joined before it started,
    /// or while it was open).
    pub first_epoch: u32,
    /// Epochs counted in finished stints (a stint ends when the member leaves).
    pub epochs_present: u32,
    /// First epoch of the current (or last) stint not yet counted.
    pub stint_from: u32,
    /// End (exclusive) of the last stint; `ONGOING` while active.
    pub stint_to: u32,
    /// Lamports of stake burned when this member was slashed.
    pub slashed: u64,
    /// Hash of the evidence the slashing quorum voted on; zero if never slashed.
    pub evidence: [u8; 32],
}

impl Member {
    /// Epochs this member took part in, counting the open one: a rejoin
    /// adds to the count, and no epoch is counted twice.
    pub fn epochs_present(&self, epochs_started: u32) -> u32 {
        let current = if self.stint_to == ONGOING {
            epochs_started.saturating_sub(self.stint_from)
        } else {
            0
        };
        self.epochs_present.saturating_add(current)
    }

    /// Whether this member may be held to account for epoch `e`: it took part
    /// in the job from `first_epoch` and had not left before `e`.
    pub fn present_in(&self, e: u32) -> bool {
        e >= self.first_epoch && e < self.stint_to
    }

    /// Ends the current stint at `epochs_started` (the open epoch counts).
    pub fn end_stint(&mut self, epochs_started: u32) {
        self.epochs_present = self.epochs_present(epochs_started);
        self.stint_from = epochs_started.max(self.stint_from);
        self.stint_to = self.stint_from;
    }

    /// Starts a stint at `from`, never re-counting an epoch already counted.
    pub fn start_stint(&mut self, from: u32) {
        self.stint_from = from.max(self.stint_from);
        self.stint_to = ONGOING;
    }
}

impl AccountState for Member {
    const TYPE: AccountType = AccountType::Member;
    const BODY_LEN: usize = 1 + 32 + 32 + 4 + 4 + 1 + 4 + 8 + 4 * 4 + 8 + 32;

    fn write_body(&self, w: &mut Writer) {
        w.u8(self.bump)
            .pubkey(&self.job)
            .pubkey(&self.node)
            .u32(self.index)
            .u32(self.joined_epoch)
            .u8(self.status as u8)
            .u32(self.last_voted_epoch)
            .u64(self.claimed)
            .u32(self.first_epoch)
            .u32(self.epochs_present)
            .u32(self.stint_from)
            .u32(self.stint_to)
            .u64(self.slashed)
            .bytes(&self.evidence);
    }

    fn read_body(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            bump: r.u8()?,
            job: r.pubkey()?,
            node: r.pubkey()?,
            index: r.u32()?,
            joined_epoch: r.u32()?,
            status: match r.u8()? {
                1 => MemberStatus::Active,
                2 => MemberStatus::Left,
                3 => MemberStatus::Slashed,
                _ => return Err(CodecError),
            },
            last_voted_epoch: r.u32()?,
            claimed: r.u64()?,
            first_epoch: r.u32()?,
            epochs_present: r.u32()?,
            stint_from: r.u32()?,
            stint_to: r.u32()?,
            slashed: r.u64()?,
            evidence: r.array()?,
        })
    }
}

/// One per requester key, never closed: job ids only go up, so no job
/// address is ever used twice (a closed job's members and epochs can never
/// be attached to a new job at the same address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    pub bump: u8,
    pub requester: Pubkey,
    /// The lowest job id `create_job` accepts next.
    pub next_job_id: u64,
}

impl AccountState for Requester {
    const TYPE: AccountType = AccountType::Requester;
    const BODY_LEN: usize = 1 + 32 + 8;

    fn write_body(&self, w: &mut Writer) {
        w.u8(self.bump)
            .pubkey(&self.requester)
            .u64(self.next_job_id);
    }

    fn read_body(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            bump: r.u8()?,
            requester: r.pubkey()?,
            next_job_id: r.u64()?,
        })
    }
}

/// One epoch of a job. `start_epoch` opens it; `seal_epoch` then fixes its
/// seed and committee from the hash of a slot after the start (`seal_slot`),
/// so nobody, the cranker included, knows the committee when the epoch starts;
/// the seats are stored as keys, so a member leaving mid-epoch moves no seat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    pub bump: u8,
    pub job: Pubkey,
    pub index: u32,
    /// Zero until sealed.
    pub seed: [u8; 32],
    /// Active members when the epoch started (the P2P layout; caps its points).
    pub members_at_start: u32,
    pub started_at: i64,
    pub deadline: i64,
    /// Who paid the rent (the cranker); `close_epoch` returns it there.
    pub rent_payer: Pubkey,
    /// The seed is the hash of the first slot at or after this one.
    pub seal_slot: u64,
    pub sealed: bool,
    /// Seat `s`'s node owner; `Pubkey::default()` is an empty seat.
    /// Boxed, as `votes`: together they are 1 KiB of an SBF stack frame's 4.
    pub witnesses: Box<[Pubkey; MAX_WITNESSES]>,
    /// Bit `s` set: seat `s` has voted `votes[s]`.
    pub voted_mask: u16,
    pub votes: Box<[[u8; 32]; MAX_WITNESSES]>,
    pub finalized: bool,
    /// Timed out unattested (`skip_epoch`): closed, and nobody is paid for it.
    pub skipped: bool,
    pub digest: [u8; 32],
    pub root: [u8; 32],
    pub total_points: u64,
    pub model_hash: [u8; 32],
}

impl Epoch {
    /// The seat `node` (an owner key) holds, once the epoch is sealed.
    pub fn seat_of(&self, node: &Pubkey) -> Option<usize> {
        if !self.sealed || *node == Pubkey::default() {
            return None;
        }
        self.witnesses.iter().position(|w| w == node)
    }

    /// The seated witnesses, in seat order (empty seats left out).
    pub fn seated(&self) -> impl Iterator<Item = (usize, &Pubkey)> {
        self.witnesses
            .iter()
            .enumerate()
            .filter(move |(_, w)| self.sealed && **w != Pubkey::default())
    }
}

fn flag(r: &mut Reader) -> Result<bool, CodecError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(CodecError),
    }
}

impl AccountState for Epoch {
    const TYPE: AccountType = AccountType::Epoch;
    const BODY_LEN: usize = 1
        + 32
        + 4
        + 32
        + 4
        + 8
        + 8
        + 32
        + 8
        + 1
        + 32 * MAX_WITNESSES
        + 2
        + 32 * MAX_WITNESSES
        + 1
        + 1
        + 32
        + 32
        + 8
        + 32;

    fn write_body(&self, w: &mut Writer) {
        w.u8(self.bump)
            .pubkey(&self.job)
            .u32(self.index)
            .bytes(&self.seed)
            .u32(self.members_at_start)
            .i64(self.started_at)
            .i64(self.deadline)
            .pubkey(&self.rent_payer)
            .u64(self.seal_slot)
            .u8(self.sealed as u8);
        for k in self.witnesses.iter() {
            w.pubkey(k);
        }
        w.u16(self.voted_mask);
        for v in self.votes.iter() {
            w.bytes(v);
        }
        w.u8(self.finalized as u8)
            .u8(self.skipped as u8)
            .bytes(&self.digest)
            .bytes(&self.root)
            .u64(self.total_points)
            .bytes(&self.model_hash);
    }

    fn read_body(r: &mut Reader) -> Result<Self, CodecError> {
        let bump = r.u8()?;
        let job = r.pubkey()?;
        let index = r.u32()?;
        let seed = r.array()?;
        let members_at_start = r.u32()?;
        let started_at = r.i64()?;
        let deadline = r.i64()?;
        let rent_payer = r.pubkey()?;
        let seal_slot = r.u64()?;
        let sealed = flag(r)?;
        let mut witnesses = Box::new([Pubkey::default(); MAX_WITNESSES]);
        for k in witnesses.iter_mut() {
            *k = r.pubkey()?;
        }
        let voted_mask = r.u16()?;
        let mut votes = Box::new([[0u8; 32]; MAX_WITNESSES]);
        for v in votes.iter_mut() {
            *v = r.array()?;
        }
        Ok(Self {
            bump,
            job,
            index,
            seed,
            members_at_start,
            started_at,
            deadline,
            rent_payer,
            seal_slot,
            sealed,
            witnesses,
            voted_mask,
            votes,
            finalized: flag(r)?,
            skipped: flag(r)?,
            digest: r.array()?,
            root: r.array()?,
            total_points: r.u64()?,
            model_hash: r.array()?,
        })
    }
}

/// Fraud votes against one member for one epoch, gathered over as many
/// transactions as the witnesses like (one each, or several co-signed):
/// the stake is slashed when `voters` reaches the quorum. Closed by its
/// rent payer once it is settled or can no longer be voted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FraudCase {
    pub bump: u8,
    pub job: Pubkey,
    /// The accused node owner.
    pub accused: Pubkey,
    pub epoch: u32,
    /// Who paid the rent (the first voter's payer); `close_fraud_case` returns it there.
    pub rent_payer: Pubkey,
    pub votes: u8,
    /// Distinct witnesses that voted, `voters[..votes]`.
    pub voters: [Pubkey; MAX_WITNESSES],
    /// The evidence hash the case was opened with.
    pub evidence: [u8; 32],
    pub slashed: bool,
}

impl AccountState for FraudCase {
    const TYPE: AccountType = AccountType::FraudCase;
    const BODY_LEN: usize = 1 + 32 + 32 + 4 + 32 + 1 + 32 * MAX_WITNESSES + 32 + 1;

    fn write_body(&self, w: &mut Writer) {
        w.u8(self.bump)
            .pubkey(&self.job)
            .pubkey(&self.accused)
            .u32(self.epoch)
            .pubkey(&self.rent_payer)
            .u8(self.votes);
        for v in &self.voters {
            w.pubkey(v);
        }
        w.bytes(&self.evidence).u8(self.slashed as u8);
    }

    fn read_body(r: &mut Reader) -> Result<Self, CodecError> {
        let bump = r.u8()?;
        let job = r.pubkey()?;
        let accused = r.pubkey()?;
        let epoch = r.u32()?;
        let rent_payer = r.pubkey()?;
        let votes = r.u8()?;
        if votes as usize > MAX_WITNESSES {
            return Err(CodecError);
        }
        let mut voters = [Pubkey::default(); MAX_WITNESSES];
        for v in voters.iter_mut() {
            *v = r.pubkey()?;
        }
        Ok(Self {
            bump,
            job,
            accused,
            epoch,
            rent_payer,
            votes,
            voters,
            evidence: r.array()?,
            slashed: match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(CodecError),
            },
        })
    }
}
