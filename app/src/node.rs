//! `cohort node`: a node operator's life on one job, headless. Load the
//! wallet → benchmark → register (once) → find a job it qualifies for →
//! join → for each epoch: crank `start_epoch` when due, train through the
//! P2P layer, and as a witness attest the epoch → claim → close.
//!
//! Everything is re-derived from the chain plus a small local state file
//! (points credited per applied step, and the training checkpoint), so a
//! restarted node picks up where it was; every transaction is either
//! guarded by a chain read (registered? joined? voted?) or refused by the
//! program when repeated, so nothing is submitted twice.

use crate::chain::{Chain, sol};
use crate::cli::{CHAIN_FLAGS, Flags, sol_to_lamports};
use crate::fraud;
use anyhow::{Context, Result, anyhow, bail};
use cohort_engine::adversary::Mode;
use cohort_engine::audit::AuditConfig;
use cohort_engine::backend::{self, BackendChoice};
use cohort_engine::data::Corpus;
use cohort_engine::ledger::ContributionLedger;
use cohort_engine::net::node::{self as p2p, Control, Defence, NodeConfig, NodeEvent};
use cohort_engine::net::shaper::Link;
use cohort_engine::net::step::Timing;
use cohort_engine::net::swarm;
use cohort_engine::recipe;
use cohort_program::client;
use cohort_program::error::CohortError;
use cohort_program::instruction::NodeTerms;
use cohort_program::state::{
    Benchmark, Candidate, Epoch, Job, JobState, Member, MemberStatus, Node, may_join,
};
use serde::{Deserialize, Serialize};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub const USAGE: &str = "\
Usage: cohort node [--job JOB] [--price SOL] [--stake SOL] [--data DIR]
                   [--p2p-port PORT] [--p2p-host IP] [--url URL] [--keypair FILE]
  --job JOB        the job to join (default: the first open job this node qualifies for)
  --price SOL      asked per epoch                                   [0.001]
  --stake SOL      posted when registering                           [0.01]
  --data DIR       checkpoints and local state             [~/.cohort/node]
  --p2p-port PORT  member i listens on PORT + i                      [47000]
  --p2p-host IP    address members listen on and dial                [127.0.0.1]
  --airdrop SOL    local chains: fund this node's wallet from the faucet first
  --leave yes|no   deregister after the job (the stake unlocks after a cooldown)  [no]
";

const POLL: Duration = Duration::from_millis(400);

#[derive(Debug, Clone)]
pub struct Options {
    pub job: Option<Pubkey>,
    pub price: u64,
    pub stake: u64,
    pub data: PathBuf,
    pub p2p_port: u16,
    pub p2p_host: String,
    /// Local chains: ask the faucet for this much first.
    pub airdrop: u64,
    /// After the job: deregister (the stake unlocks after the cooldown).
    pub leave: bool,
    /// A benchmark attestation measured beforehand (the desktop app's);
    /// `None` measures the CPU here.
    pub benchmark: Option<Benchmark>,
    /// While set, the node keeps applying steps but computes no gradients
    /// (its owner wants the GPU back); those steps earn nothing.
    pub pause: Arc<AtomicBool>,
    /// The device gradients are computed on (applying is always the same
    /// CPU code, so every member gets the same bits).
    pub device: BackendChoice,
    /// Tests only (`--adversary MODE`): this node attacks the job, to show
    /// it is caught and slashed.
    pub adversary: Option<Mode>,
}

impl Options {
    /// What this node offers: its price, always available, and `bench`.
    fn terms(&self, bench: Benchmark) -> NodeTerms {
        NodeTerms {
            price: self.price,
            available_from: 0,
            available_until: i64::MAX,
            benchmark: bench,
        }
    }

    /// A node on a local chain for `job`, as the demo and the Sandbox run
    /// them in-process: funded from the faucet, asking 0.001 SOL per epoch,
    /// staking 0.01 SOL, training on the CPU over 127.0.0.1.
    pub fn local(job: Pubkey, p2p_port: u16, data: PathBuf) -> Self {
        Self {
            job: Some(job),
            price: crate::chain::LAMPORTS_PER_SOL / 1000,
            stake: crate::chain::LAMPORTS_PER_SOL / 100,
            data,
            p2p_port,
            p2p_host: "127.0.0.1".into(),
            airdrop: crate::chain::LAMPORTS_PER_SOL,
            leave: false,
            benchmark: None,
            pause: Arc::default(),
            device: BackendChoice::Cpu,
            adversary: None,
        }
    }

    pub fn parse(f: &Flags) -> Result<Self> {
        let job = f
            .str("job")
            .map(|j| Pubkey::from_str(j).map_err(|_| anyhow!("--job `{j}` is not a job address")))
            .transpose()?;
        let host = f.str("p2p-host").unwrap_or("127.0.0.1").to_string();
        host.parse::<std::net::IpAddr>()
            .map_err(|_| anyhow!("--p2p-host `{host}` is not an IP address"))?;
        Ok(Self {
            job,
            price: sol_to_lamports(f.get("price")?.unwrap_or(0.001), "--price")?,
            stake: sol_to_lamports(f.get("stake")?.unwrap_or(0.01), "--stake")?,
            data: f
                .str("data")
                .map(PathBuf::from)
                .unwrap_or_else(|| crate::chain::keys::home().join("node")),
            p2p_port: f.get("p2p-port")?.unwrap_or(47000),
            p2p_host: host,
            airdrop: match f.get::<f64>("airdrop")? {
                Some(v) => sol_to_lamports(v, "--airdrop")?,
                None => 0,
            },
            leave: match f.str("leave") {
                None | Some("no") => false,
                Some("yes") => true,
                Some(v) => bail!("--leave takes yes or no, not `{v}`"),
            },
            benchmark: None,
            pause: Arc::default(),
            device: BackendChoice::Cpu,
            adversary: f
                .str("adversary")
                .map(|m| Mode::parse(m).ok_or_else(|| anyhow!("--adversary: unknown mode `{m}`")))
                .transpose()?,
        })
    }
}

/// What a node ends a job with.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub job: Pubkey,
    pub epochs_trained: u32,
    pub attested: Vec<u32>,
    pub points: u64,
    pub claimed: u64,
    pub model_hashes: Vec<[u8; 32]>,
    /// Training loss of the last step of each epoch trained in this run.
    pub losses: Vec<f32>,
    /// Transactions this node sent.
    pub transactions: u64,
}

/// The node's own record for one job, saved after every applied step.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Local {
    /// Each credited step's contributors (member indices), applied here or
    /// backfilled. A step applied again after a rewind replaces its entry.
    contributors: BTreeMap<u32, Vec<u32>>,
    /// Epochs fully trained.
    trained: u32,
    points: BTreeMap<String, u64>,
    /// The points table as each epoch ended: what that epoch's witnesses
    /// attested, so a claim mid-job proves against the latest root.
    #[serde(default)]
    settled: BTreeMap<u32, BTreeMap<String, u64>>,
    model_hash: BTreeMap<u32, String>,
    /// Epochs skipped on chain, whose points were dropped.
    #[serde(default)]
    skipped: std::collections::BTreeSet<u32>,
}

impl Local {
    /// Forgets epoch `e`'s contributions: it was skipped, so the points
    /// table goes back to what the last epoch before it ended with.
    fn drop_epoch(&mut self, e: u32, steps_per_epoch: u32) {
        let from = e.saturating_mul(steps_per_epoch);
        let to = from.saturating_add(steps_per_epoch);
        self.contributors.retain(|s, _| !(from..to).contains(s));
        self.settled.remove(&e);
        self.points = self
            .settled
            .range(..e)
            .next_back()
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        self.skipped.insert(e);
    }

    fn path(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }
    fn load(dir: &Path) -> Result<Self> {
        let p = Self::path(dir);
        if !p.exists() {
            return Ok(Self::default());
        }
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is corrupt", p.display()))
    }
    fn save(&self, dir: &Path) -> Result<()> {
        let p = Self::path(dir);
        let tmp = crate::chain::keys::stage(&p, &serde_json::to_vec(self)?)?;
        std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))
    }
    fn ledger(&self) -> Result<ContributionLedger> {
        ledger_of(&self.points)
    }
}

fn ledger_of(points: &BTreeMap<String, u64>) -> Result<ContributionLedger> {
    let mut l = ContributionLedger::default();
    for (k, p) in points {
        l.credit(
            Pubkey::from_str(k).map_err(|_| anyhow!("bad key in state"))?,
            *p,
        )?;
    }
    Ok(l)
}

/// A node's earnings on one job, from the chain and its own record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Earnings {
    /// Lamports earned in each trained epoch, by epoch index.
    pub per_epoch: Vec<(u32, u64)>,
    /// What a claim would pay now (attested epochs only).
    pub claimable: u64,
    pub claimed: u64,
    pub epochs_finalized: u32,
}

/// What `me` has earned on `job`: each epoch's share from the points it
/// ended with, and what the latest attested root lets it claim now.
pub async fn earnings(chain: &Chain, me: &Pubkey, job: &Pubkey, data: &Path) -> Result<Earnings> {
    let j: Job = chain.must(job, "job").await?;
    let local = Local::load(&data.join(job.to_string()))?;
    let key = me.to_string();
    let mut out = Earnings {
        epochs_finalized: j.epochs_finalized,
        ..Default::default()
    };
    let mut before = 0;
    for (e, table) in &local.settled {
        let p = table.get(&key).copied().unwrap_or(0);
        out.per_epoch
            .push((*e, j.points_value(p.saturating_sub(before)).unwrap_or(0)));
        before = p;
    }
    if let Some(m) = chain
        .state::<Member>(&client::member_address(job, me))
        .await?
    {
        out.claimed = m.claimed;
        if let Some(table) = j.latest_finalized().and_then(|e| local.settled.get(&e)) {
            let p = table.get(&key).copied().unwrap_or(0);
            out.claimable = j.points_value(p).unwrap_or(0).saturating_sub(m.claimed);
        }
    }
    Ok(out)
}

/// Claims what the latest attested epoch owes `me` on `job`, while the
/// job may still be running; the lamports paid.
pub async fn claim_now(chain: &Chain, me: &Keypair, job: &Pubkey, data: &Path) -> Result<u64> {
    let pk = me.pubkey();
    let j: Job = chain.must(job, "job").await?;
    let Some(last) = j.latest_finalized() else {
        bail!("nothing to claim yet: no epoch of this job has been attested");
    };
    let local = Local::load(&data.join(job.to_string()))?;
    let table = local.settled.get(&last).with_context(|| {
        format!("this machine did not train epoch {last}, so it cannot prove its points")
    })?;
    let ledger = ledger_of(table)?;
    if ledger
        .attestation(&cohort_program::ID, job, last, [0; 32])?
        .root
        != j.latest_root
    {
        bail!(
            "this node's record of epoch {last} does not match the attested one; nothing claimed"
        );
    }
    let (points, proof) = ledger.proof(&pk)?;
    let m: Member = chain
        .must(&client::member_address(job, &pk), "membership")
        .await?;
    match send_claim(chain, me, job, &j, m.claimed, points, proof).await? {
        0 => bail!("nothing to claim: everything attested so far is paid"),
        paid => Ok(paid),
    }
}

/// Claims `points` (proved by `proof`) if they are worth more than the
/// `claimed` already paid; the lamports paid, 0 when nothing is owed.
async fn send_claim(
    chain: &Chain,
    me: &Keypair,
    job: &Pubkey,
    j: &Job,
    claimed: u64,
    points: u64,
    proof: Vec<cohort_program::merkle::Hash32>,
) -> Result<u64> {
    let owed = j.points_value(points).context("points overflow")?;
    if owed <= claimed {
        return Ok(0);
    }
    let pk = me.pubkey();
    chain
        .send("claim", &[client::claim(&pk, job, points, proof)], me, &[])
        .await?;
    let after: Member = chain
        .must(&client::member_address(job, &pk), "membership")
        .await?;
    Ok(after.claimed - claimed)
}

/// Stops being a member of `job` (the last member's owner is needed to
/// keep indices dense). What was earned stays claimable.
pub async fn leave(chain: &Chain, me: &Keypair, job: &Pubkey) -> Result<()> {
    let pk = me.pubkey();
    let j: Job = chain.must(job, "job").await?;
    let last_index = j
        .member_count
        .checked_sub(1)
        .context("the job has no members")?;
    let mut last = None;
    for (_, m) in chain.all::<Member>().await? {
        if m.job == *job && m.index == last_index && m.status == MemberStatus::Active {
            last = Some(m.node);
        }
    }
    let last = last.context("cannot find the job's last member")?;
    chain
        .send("leave_job", &[client::leave_job(&pk, job, &last)], me, &[])
        .await?;
    Ok(())
}

pub async fn main(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return Ok(());
    }
    let mut allowed = CHAIN_FLAGS.to_vec();
    allowed.extend([
        "job",
        "price",
        "stake",
        "data",
        "p2p-port",
        "p2p-host",
        "airdrop",
        "adversary",
    ]);
    let f = Flags::parse(args, "cohort node", &allowed)?;
    if let Some(w) = f.words.first() {
        bail!("unexpected argument `{w}` for `cohort node`");
    }
    let opts = Options::parse(&f)?;
    let chain = f.chain().await?;
    let me = f.keypair("node.json")?;
    let o = run(&chain, &me, &opts).await?;
    println!(
        "done: job {} trained {} epochs, attested {:?}, {} contributions, claimed {} lamports ({}), models {}",
        o.job,
        o.epochs_trained,
        o.attested,
        o.points,
        o.claimed,
        sol(o.claimed),
        o.model_hashes.iter().map(hex).collect::<Vec<_>>().join(",")
    );
    Ok(())
}

/// One applied step, as a node reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepProgress {
    pub epoch: u32,
    /// Steps of the epoch applied so far, of `of`.
    pub done: u32,
    pub of: u32,
    pub loss: f32,
    pub contributors: usize,
    /// Seconds of this step spent computing and on the network.
    pub compute: f64,
    pub comm: f64,
}

/// What a node reports as it goes: lines for people, step ticks for bars.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    Line(&'a str),
    Step(StepProgress),
    /// The other members' links (every 2 s while training).
    Links(&'a [p2p::PeerLink]),
    /// This node, as a witness, audited another member's contribution.
    Audit(&'a p2p::AuditReport),
}

/// Where progress goes: stdout for `cohort node`, bars for the demo.
pub type Report<'a> = &'a (dyn Fn(&Pubkey, Progress) + Send + Sync);

/// Prints lines, and a quarter of an epoch's steps.
pub fn print_report(me: &Pubkey, p: Progress) {
    let who = &me.to_string()[..6];
    match p {
        Progress::Line(l) => println!("[node {who}] {l}"),
        Progress::Step(StepProgress {
            epoch,
            done,
            of,
            loss,
            contributors,
            ..
        }) => {
            if done % of.div_ceil(4).max(1) == 0 || done == of {
                println!(
                    "[node {who}] epoch {epoch} step {done}/{of}: loss {loss:.3}, {contributors} contributors"
                );
            }
        }
        Progress::Links(_) | Progress::Audit(_) => {}
    }
}

fn say(report: Report, me: &Pubkey, line: impl AsRef<str>) {
    report(me, Progress::Line(line.as_ref()));
}

/// A benchmark attestation: measured here, signed by the node's key over
/// its exact bytes (the signature field zeroed), so anyone can check who
/// claimed these figures.
pub fn benchmark(me: &Keypair, gflops: f64) -> Benchmark {
    crate::benchmark::attest(me, &crate::benchmark::Report::cpu(gflops))
}

pub async fn run(chain: &Chain, me: &Keypair, o: &Options) -> Result<Outcome> {
    run_with(chain, me, o, &print_report).await
}

pub async fn run_with(
    chain: &Chain,
    me: &Keypair,
    o: &Options,
    report: Report<'_>,
) -> Result<Outcome> {
    let pk = me.pubkey();
    if o.airdrop > 0 {
        chain.airdrop(&pk, o.airdrop).await?;
    }
    // 1. Benchmark.
    let bench = match o.benchmark {
        Some(b) => b,
        None => {
            let gflops = tokio::task::spawn_blocking(|| {
                cohort_engine::probe::cpu_fp32_gflops(Duration::from_millis(300))
            })
            .await?;
            benchmark(me, gflops)
        }
    };
    say(
        report,
        &pk,
        format!(
            "benchmark: {} fp32 GFLOPS on {}",
            bench.fp32_gflops,
            bench.device_name()
        ),
    );
    // 2. Register once.
    let node_addr = client::node_address(&pk);
    match chain.state::<Node>(&node_addr).await? {
        Some(n) if n.status == cohort_program::state::NodeStatus::Active => {
            // Re-attest only when the terms moved: a new price, or a
            // benchmark more than 10% off (measurements jitter run to run).
            let drift = (n.benchmark.fp32_gflops as f64 - bench.fp32_gflops as f64).abs()
                > 0.1 * n.benchmark.fp32_gflops as f64;
            if n.price != o.price || drift {
                chain
                    .send(
                        "update_node",
                        &[client::update_node(&pk, o.terms(bench), 0)],
                        me,
                        &[],
                    )
                    .await?;
                say(
                    report,
                    &pk,
                    format!(
                        "updated terms: {} per epoch, {} GFLOPS",
                        sol(o.price),
                        bench.fp32_gflops
                    ),
                );
            } else {
                say(
                    report,
                    &pk,
                    format!("registered already, {} staked", sol(n.stake)),
                );
            }
        }
        Some(_) => bail!("node {pk} is deregistered; its stake is unlocking"),
        None => {
            let have = chain.balance(&pk).await?;
            if have < o.stake + 5_000_000 {
                bail!(
                    "insufficient funds: registering stakes {} (plus rent and fees) but {pk} holds {}",
                    sol(o.stake),
                    sol(have)
                );
            }
            chain
                .send(
                    "register_node",
                    &[client::register_node(&pk, o.terms(bench), o.stake)],
                    me,
                    &[],
                )
                .await?;
            say(
                report,
                &pk,
                format!(
                    "registered: {} staked, asking {} per epoch",
                    sol(o.stake),
                    sol(o.price)
                ),
            );
        }
    }
    // 3. Find a job and join it.
    let job = match o.job {
        Some(j) => j,
        None => find_job(chain, &pk, report).await?,
    };
    let spec = chain.must::<Job>(&job, "job").await?.spec;
    recipe::check(&spec).with_context(|| format!("cannot train job {job}"))?;
    let member_addr = client::member_address(&job, &pk);
    if chain.state::<Member>(&member_addr).await?.is_none() {
        chain
            .send("join_job", &[client::join_job(&pk, &job)], me, &[])
            .await?;
        say(report, &pk, format!("joined job {job}"));
    } else {
        say(
            report,
            &pk,
            format!("member of job {job} already (resuming)"),
        );
    }
    let dir = o.data.join(job.to_string());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut local = Local::load(&dir)?;
    let mut out = Outcome {
        job,
        ..Default::default()
    };
    let corpus = Corpus::bundled()?;
    // 4. Epochs.
    let mut cranked_at: Option<(u32, std::time::Instant)> = None;
    // Each epoch's members as read when it started: a member slashed
    // mid-epoch leaves the job on chain, but not the epoch's P2P layout.
    let mut epoch_members: Option<(u32, Vec<Pubkey>)> = None;
    loop {
        if chain
            .state::<Member>(&member_addr)
            .await?
            .is_some_and(|m| m.status == MemberStatus::Slashed)
        {
            bail!(
                "this node was slashed in job {job}: a quorum of witnesses found its \
                 contributions fraudulent, and its stake was burned"
            );
        }
        let j: Job = chain.must(&job, "job").await?;
        if j.state.is_terminal() {
            if j.state != JobState::Completed {
                say(report, &pk, format!("job ended: {:?}", j.state));
            }
            break;
        }
        let started = j.epochs_started;
        // A skipped epoch's points are worth nothing: the ledger drops them
        // before the next epoch counts on top (its witnesses attest totals).
        if let Some(e) = started.checked_sub(1)
            && !local.skipped.contains(&e)
            && j.epochs_closed() == started
            && j.latest_finalized() != Some(e)
            && chain
                .state::<Epoch>(&client::epoch_address(&job, e))
                .await?
                .is_some_and(|ep| ep.skipped)
        {
            local.drop_epoch(e, j.spec.steps_per_epoch);
            local.save(&dir)?;
            say(
                report,
                &pk,
                format!("epoch {e} timed out unattested: skipped, nobody is paid for it"),
            );
        }
        let due =
            j.state == JobState::Open || (j.epochs_closed() == started && started < j.spec.epochs);
        if due {
            if j.member_count >= j.members_to_start() {
                // One member cranks; the others step in if it has not after a while.
                let m: Member = chain.must(&member_addr, "membership").await?;
                let mine = started % j.member_count == m.index;
                let waited = cranked_at
                    .is_some_and(|(e, t)| e == started && t.elapsed() > Duration::from_secs(8));
                if mine || waited {
                    match chain
                        .send(
                            "start_epoch",
                            &[client::start_epoch(&pk, &job, started)],
                            me,
                            &[],
                        )
                        .await
                    {
                        Ok(_) => say(report, &pk, format!("started epoch {started}")),
                        // Another member was first (expected: not news), or
                        // the chain is away: the next read decides.
                        Err(e)
                            if crate::chain::refused_with(&e, CohortError::AlreadyInitialized)
                                || crate::chain::refused_with(
                                    &e,
                                    CohortError::EpochNotFinalized,
                                ) =>
                        {
                            tracing::debug!("start_epoch {started}: another member was first");
                        }
                        Err(e) => say(report, &pk, format!("start_epoch {started}: {e}")),
                    }
                }
                if cranked_at.is_none_or(|(e, _)| e != started) {
                    cranked_at = Some((started, std::time::Instant::now()));
                }
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        let e = started - 1;
        let epoch: Epoch = chain.must(&client::epoch_address(&job, e), "epoch").await?;
        if !epoch.sealed {
            // Every member tries; the first seal wins and the rest are
            // refused harmlessly, so no refusal here is news.
            if let Err(err) = seal(chain, me, &job, &j, &epoch).await {
                tracing::debug!("seal_epoch {e}: {err:#}");
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        if !epoch.finalized && unix_now() > epoch.deadline {
            // No quorum in time: the epoch is skipped (unpaid) so the job goes on.
            if let Err(err) = chain
                .send("skip_epoch", &[client::skip_epoch(&job, e)], me, &[])
                .await
            {
                tracing::debug!("skip_epoch {e}: {err:#}");
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        let members = match &epoch_members {
            Some((at, m)) if *at == e => m.clone(),
            _ => {
                let m = members_at_start(chain, &job, epoch.members_at_start).await?;
                epoch_members = Some((e, m.clone()));
                m
            }
        };
        let Some(index) = members.iter().position(|m| *m == pk) else {
            // Joined after this epoch started: the next one includes us.
            tokio::time::sleep(POLL).await;
            continue;
        };
        if local.trained <= e {
            let (hash, loss) = train_epoch(
                chain,
                &j,
                &job,
                e,
                &epoch,
                &members,
                index as u32,
                me,
                o,
                &dir,
                &mut local,
                &corpus,
                report,
            )
            .await?;
            out.losses.push(loss);
            local.trained = e + 1;
            local.settled.insert(e, local.points.clone());
            local.model_hash.insert(e, hex(&hash));
            local.save(&dir)?;
            out.epochs_trained += 1;
        }
        if !epoch.finalized
            && let Some(seat) = epoch.seat_of(&pk)
            && epoch.voted_mask & (1 << seat) == 0
        {
            let model_hash = parse_hex(
                local
                    .model_hash
                    .get(&e)
                    .context("no model hash for the epoch")?,
            )?;
            let att = local
                .ledger()?
                .attestation(&cohort_program::ID, &job, e, model_hash)?;
            let ix = client::attest_epoch(&pk, &job, e, model_hash, att.root, att.total_points);
            match chain.send("attest_epoch", &[ix], me, &[]).await {
                Ok(_) => {
                    out.attested.push(e);
                    say(
                        report,
                        &pk,
                        format!(
                            "attested epoch {e} as witness seat {seat}: model {}, {} points",
                            &hex(&model_hash)[..16],
                            att.total_points
                        ),
                    );
                }
                // A quorum may have finalized it meanwhile (the race every
                // late witness loses): nothing to tell the user; the next
                // read of the epoch says so, and nothing is resent then.
                Err(err) if crate::chain::refused_with(&err, CohortError::EpochFinalized) => {
                    tracing::debug!("attest_epoch {e}: finalized before this vote landed");
                }
                Err(err) => say(report, &pk, format!("attest_epoch {e}: {err}")),
            }
        }
        tokio::time::sleep(POLL).await;
    }
    // 5. Claim and close.
    let ledger = local.ledger()?;
    let (points, proof) = ledger.proof(&pk)?;
    out.points = points;
    out.model_hashes = local
        .model_hash
        .values()
        .map(|h| parse_hex(h))
        .collect::<Result<_>>()?;
    if let Some(m) = chain.state::<Member>(&member_addr).await? {
        let j: Job = chain.must(&job, "job").await?;
        out.claimed = send_claim(chain, me, &job, &j, m.claimed, points, proof.clone()).await?;
        if out.claimed > 0 {
            say(
                report,
                &pk,
                format!("claimed {} for {points} contributions", sol(out.claimed)),
            );
        }
        // The Member account stays until its job has ended; inside the
        // claim window closing re-checks the proof (nothing is left to pay
        // after the claim above).
        if j.state.is_terminal() && j.reserve == 0 {
            let ix = client::close_member(&pk, &job, points, proof);
            if let Err(e) = chain.send("close_member", &[ix], me, &[]).await {
                // Its rent is not lost: the account can be closed once the
                // claim window is over, with no proof.
                say(report, &pk, format!("member account kept: {e:#}"));
            }
        }
    }
    if o.leave {
        chain
            .send("deregister_node", &[client::deregister_node(&pk)], me, &[])
            .await?;
        say(
            report,
            &pk,
            "deregistered: the stake unlocks after the cooldown",
        );
    }
    out.transactions = chain.sent();
    Ok(out)
}

/// `n` consecutive free TCP ports on loopback (member i listens on base + i).
pub fn free_port_base(n: u16) -> Result<u16> {
    for _ in 0..50 {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let base = l.local_addr()?.port();
        drop(l);
        if base < 65535 - n
            && (1..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return Ok(base);
        }
    }
    bail!("no {n} consecutive free ports on 127.0.0.1")
}

async fn find_job(chain: &Chain, pk: &Pubkey, report: Report<'_>) -> Result<Pubkey> {
    let mut said = false;
    loop {
        // The program's own rule (`state::may_join`), on the node as
        // registered: the same answer `join_job` will give.
        let node: Node = chain.must(&client::node_address(pk), "node").await?;
        let me = Candidate::of(&node);
        let now = unix_now();
        let mut jobs = chain.all::<Job>().await?;
        jobs.sort_by_key(|(_, j)| j.created_at);
        // The program's rule, then this build's: a job whose training
        // recipe this build does not train is not one it can join.
        let open = jobs.iter().filter(|(_, j)| may_join(j, &me, now).is_ok());
        let mut other_builds = 0;
        for (k, j) in open {
            match recipe::check(&j.spec) {
                Ok(_) => return Ok(*k),
                Err(_) => other_builds += 1,
            }
        }
        if other_builds > 0 && !said {
            say(
                report,
                pk,
                format!(
                    "{other_builds} open job(s) train with a recipe this build does not: \
                     they need another Cohort version"
                ),
            );
        }
        if !said {
            say(
                report,
                pk,
                "waiting for an open job this node qualifies for",
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Seconds since the Unix epoch, as the chain's clock counts them.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Sends `seal_epoch` for the open epoch once its seal slot has a hash,
/// naming the member the program will draw at each seat.
pub async fn seal(chain: &Chain, me: &Keypair, job: &Pubkey, j: &Job, epoch: &Epoch) -> Result<()> {
    let hashes = chain
        .data(&solana_sdk::sysvar::slot_hashes::ID)
        .await?
        .context("the chain has no SlotHashes sysvar")?;
    let Some(seats) = client::committee_to_seal(&hashes, job, j, epoch) else {
        bail!("the seal slot has no hash yet");
    };
    let mut by_index = BTreeMap::new();
    for (_, m) in chain.all::<Member>().await? {
        if m.job == *job && m.status == MemberStatus::Active {
            by_index.insert(m.index, m.node);
        }
    }
    let owners = seats
        .iter()
        .map(|i| {
            by_index
                .get(i)
                .copied()
                .with_context(|| format!("no active member at index {i}"))
        })
        .collect::<Result<Vec<_>>>()?;
    chain
        .send(
            "seal_epoch",
            &[client::seal_epoch(job, epoch.index, &owners)],
            me,
            &[],
        )
        .await?;
    Ok(())
}

/// The epoch's members by index (the P2P layer's member order).
async fn members_at_start(chain: &Chain, job: &Pubkey, n: u32) -> Result<Vec<Pubkey>> {
    let mut slots = vec![None; n as usize];
    let all = chain.all::<Member>().await?;
    for (_, m) in &all {
        if m.job == *job && m.status == MemberStatus::Active && m.index < n {
            slots[m.index as usize] = Some(m.node);
        }
    }
    // A member slashed in this epoch keeps its index; if it held the last
    // slot nobody moved into it.
    for (_, m) in &all {
        if m.job == *job && m.status == MemberStatus::Slashed && m.index < n {
            slots[m.index as usize].get_or_insert(m.node);
        }
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| anyhow!("member {i} of job {job} is missing")))
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn train_epoch(
    chain: &Chain,
    j: &Job,
    job: &Pubkey,
    e: u32,
    epoch: &Epoch,
    members: &[Pubkey],
    index: u32,
    me: &Keypair,
    o: &Options,
    dir: &Path,
    local: &mut Local,
    corpus: &Corpus,
    report: Report<'_>,
) -> Result<([u8; 32], f32)> {
    let pk = me.pubkey();
    if corpus.id != j.spec.dataset_id {
        bail!("job {job} trains on a dataset this node does not have");
    }
    let spe = j.spec.steps_per_epoch;
    let train = recipe::check(&j.spec).with_context(|| format!("job {job}"))?;
    let addr = |i: usize| format!("/ip4/{}/tcp/{}", o.p2p_host, o.p2p_port as usize + i);
    let mut bootstrap = Vec::new();
    for (i, m) in members.iter().enumerate() {
        if i as u32 == index {
            continue;
        }
        let id = swarm::peer_id(&m.to_bytes()).context("member key is not an ed25519 key")?;
        bootstrap.push(format!("{}/p2p/{id}", addr(i)).parse()?);
    }
    let job_bytes = job.to_bytes();
    // The epoch's witnesses (seated by key at the seal) audit; a quorum of
    // their accusations slashes.
    let witnesses: Vec<u32> = epoch
        .seated()
        .filter_map(|(_, w)| members.iter().position(|m| m == w))
        .map(|i| i as u32)
        .collect();
    let quorum = j.spec.quorum as usize;
    let cfg = NodeConfig {
        train,
        job: job_bytes,
        epoch: e,
        seed: epoch.seed,
        init_seed: cohort_engine::runner::epoch_seed(&job_bytes, u32::MAX),
        members: members.iter().map(|m| m.to_bytes()).collect(),
        me: index,
        secret: *me.secret_bytes(),
        listen: vec![addr(index as usize).parse()?],
        bootstrap,
        steps: (e + 1) * spe,
        checkpoint: Some(dir.join("checkpoint.bin")),
        // A member that joined a running job has no state of its own from
        // the last epoch: it downloads the members' state instead.
        join: e > 0 && !dir.join("checkpoint.bin").exists(),
        link: Link::new(0.0, Duration::ZERO),
        timing: Timing::default(),
        mdns: false,
        min_peers: 0,
        epoch_start: Some(e * spe),
        backfill_from: Some(e * spe),
        pause: o.pause.clone(),
        defence: Defence {
            audit: AuditConfig {
                quorum,
                rate: f64::from(j.spec.audit_rate_bp) / 10_000.0,
                ..AuditConfig::default()
            },
            witnesses,
            adversary: o.adversary,
            // Each witness votes on chain by itself (see `fraud`).
            cosigner: None,
        },
    };
    say(
        report,
        &pk,
        format!(
            "epoch {e}: training steps {}..{} as member {index} of {}",
            e * spe,
            (e + 1) * spe,
            members.len()
        ),
    );
    let mut last_hash = None;
    let mut last_loss = f32::NAN;
    let mut failure = None;
    let corpus = corpus.clone();
    let engine = match o.device {
        BackendChoice::Cpu => backend::cpu(),
        choice => {
            let s = backend::select(choice).map_err(|e| anyhow!("training device: {e}"))?;
            say(report, &pk, &s.reason);
            s.engine
        }
    };
    // This witness's fraud votes go to a task of their own, so training
    // never waits on the chain; the epoch ends only once they are sent.
    let (cases, mut case_rx) = tokio::sync::mpsc::unbounded_channel::<fraud::Case>();
    let (control, control_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut voted_against = std::collections::BTreeSet::new();
    let reporter = async {
        while let Some(case) = case_rx.recv().await {
            let mut outcome = Err(anyhow!("not sent"));
            for _ in 0..3 {
                outcome = fraud::vote(chain, me, job, e, members, &case).await;
                if outcome.is_ok() {
                    break;
                }
            }
            let line = match outcome {
                Ok(fraud::Voted::Slashed) => format!(
                    "reported member {} on chain: a quorum of {quorum} witnesses voted, slashed",
                    case.accused
                ),
                Ok(fraud::Voted::Recorded) => format!(
                    "voted against member {} on chain (a quorum of {quorum} slashes)",
                    case.accused
                ),
                Err(err) => format!("could not report member {}: {err:#}", case.accused),
            };
            say(report, &pk, line);
        }
    };
    let training = async {
        let out = p2p::run_with_control(cfg, corpus, engine, Some(control_rx), |ev| match ev {
            NodeEvent::Applied {
                step,
                model_hash,
                contributors,
                loss,
                times,
            } => {
                last_hash = Some(*model_hash);
                last_loss = *loss;
                if credit(local, members, *step, contributors)
                    && let Err(err) = local.save(dir)
                {
                    failure.get_or_insert(err);
                }
                report(
                    &pk,
                    Progress::Step(StepProgress {
                        epoch: e,
                        done: (step + 1).saturating_sub(e * spe),
                        of: spe,
                        loss: *loss,
                        contributors: contributors.len(),
                        compute: times.compute,
                        comm: times.comm + times.wait,
                    }),
                );
            }
            NodeEvent::Backfilled { step, contributors }
                if !local.contributors.contains_key(step)
                    && credit(local, members, *step, contributors) =>
            {
                if let Err(err) = local.save(dir) {
                    failure.get_or_insert(err);
                }
                say(
                    report,
                    &pk,
                    format!(
                        "step {step} happened while away: credited its {} contributors",
                        contributors.len()
                    ),
                );
            }
            NodeEvent::Links(l) => report(&pk, Progress::Links(l)),
            NodeEvent::Rewound { step } => say(
                report,
                &pk,
                format!("a better manifest for step {step} turned up: applying again from there"),
            ),
            NodeEvent::ForgedEntry {
                step,
                leader,
                member,
            } => say(
                report,
                &pk,
                format!(
                    "member {leader} led step {step} listing bytes under member {member}'s name \
                     that {member} never signed: skipped, evidence against the leader"
                ),
            ),
            NodeEvent::WrongStateHash { step, leader } => say(
                report,
                &pk,
                format!(
                    "member {leader} led step {step} with a state hash nobody else has: \
                     its manifest was applied, the mismatch kept as evidence against it"
                ),
            ),
            NodeEvent::Diverged { step } => {
                failure.get_or_insert(anyhow!("model diverged from the job's at step {step}"));
            }
            NodeEvent::Audited(r) => {
                report(&pk, Progress::Audit(r));
                if !r.passed {
                    // The chain is checked only after the recomputation passed.
                    let why = match (r.comparison, r.chain_error) {
                        (None, _) => "withheld or misstated its momentum",
                        (Some(_), None) => "does not match its recomputation",
                        (Some(_), Some(_)) => {
                            "rests on a momentum that does not follow from its last one"
                        }
                    };
                    say(
                        report,
                        &pk,
                        format!(
                            "audit: member {}'s step {} {why}: accused",
                            r.member, r.step
                        ),
                    );
                    if voted_against.insert(r.member) {
                        let _ = cases.send(fraud::Case {
                            accused: r.member,
                            evidence: r.evidence,
                        });
                    }
                }
            }
            NodeEvent::Slashed {
                member, witnesses, ..
            } => {
                say(
                    report,
                    &pk,
                    format!(
                        "member {member} convicted by witnesses {witnesses:?}: dropped from the job"
                    ),
                );
                // Votes go on chain one by one, so the node need not stay
                // up as the lead of a co-signed report.
                let _ = control.send(Control::Settled { member: *member });
            }
            _ => {}
        })
        .await;
        // Ends the reporter once the reports asked for are sent.
        drop(cases);
        out
    };
    let (out, ()) = tokio::join!(training, reporter);
    let stats = out.map_err(|err| anyhow!("training epoch {e}: {err}"))?;
    if stats.audits > 0 {
        say(
            report,
            &pk,
            format!(
                "epoch {e}: audited {} contributions as a witness, {} failed; audits took {:.2} s, {:.1}% of this node's training compute",
                stats.audits,
                stats.audits_failed,
                stats.audit_secs,
                100.0 * stats.audit_secs / stats.compute_secs.max(1e-9)
            ),
        );
    }
    if let Some(err) = failure {
        return Err(err);
    }
    let hash = last_hash.ok_or_else(|| anyhow!("epoch {e} applied no step"))?;
    Ok((hash, last_loss))
}

/// Records `step`'s contributors and moves points to match; whether
/// anything changed.
fn credit(local: &mut Local, members: &[Pubkey], step: u32, contributors: &[u32]) -> bool {
    if local.contributors.get(&step).map(Vec::as_slice) == Some(contributors) {
        return false;
    }
    let old = local.contributors.insert(step, contributors.to_vec());
    let mut tally = |c: &u32, up: bool| {
        if let Some(m) = members.get(*c as usize) {
            let p = local.points.entry(m.to_string()).or_insert(0);
            *p = if up { *p + 1 } else { p.saturating_sub(1) };
        }
    };
    for c in old.iter().flatten() {
        tally(c, false);
    }
    for c in contributors {
        tally(c, true);
    }
    true
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(s: &str) -> Result<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        bail!("bad hash in local state");
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow!("bad hash in local state"))?;
    }
    Ok(out)
}
