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

mod crank;
mod earnings;
mod epoch;
mod local;
mod report;

pub use crank::seal;
pub use earnings::{Earnings, claim_now, earnings, leave};
pub use report::{OperatorEvent, Report, StepProgress, print_report};

use crate::chain::{Chain, sol};
use crate::cli::{CHAIN_FLAGS, Flags, sol_to_lamports};
use anyhow::{Context, Result, anyhow, bail};
use cohort_engine::adversary::Mode;
use cohort_engine::backend::BackendChoice;
use cohort_engine::data::Corpus;
use cohort_engine::recipe;
use cohort_program::client;
use cohort_program::instruction::NodeTerms;
use cohort_program::state::{
    Benchmark, Candidate, Epoch, Job, JobState, Member, MemberStatus, Node, may_join,
};
use earnings::send_claim;
use epoch::EpochRun;
use local::{Local, hex, ledger_of, parse_hex};
use report::say;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
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
pub struct OperatorConfig {
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
    /// Whether a pause also hands the GPU memory the backend pools back to
    /// the driver.
    pub release_memory_when_paused: bool,
    /// The device gradients are computed on (applying is always the same
    /// CPU code, so every member gets the same bits).
    pub device: BackendChoice,
    /// Tests only (`--adversary MODE`): this node attacks the job, to show
    /// it is caught and slashed.
    pub adversary: Option<Mode>,
}

impl OperatorConfig {
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
            release_memory_when_paused: false,
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
            release_memory_when_paused: false,
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
    let opts = OperatorConfig::parse(&f)?;
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

/// A benchmark attestation: measured here, signed by the node's key over
/// its exact bytes (the signature field zeroed), so anyone can check who
/// claimed these figures.
pub fn benchmark(me: &Keypair, gflops: f64) -> Benchmark {
    crate::benchmark::attest(me, &crate::benchmark::Report::cpu(gflops))
}

pub async fn run(chain: &Chain, me: &Keypair, o: &OperatorConfig) -> Result<Outcome> {
    operate(chain, me, o, &print_report).await
}

/// A node operator's life on one job, reporting to `report`: register,
/// join, train and attest every epoch, then claim and close.
pub async fn operate(
    chain: &Chain,
    me: &Keypair,
    o: &OperatorConfig,
    report: Report<'_>,
) -> Result<Outcome> {
    let pk = me.pubkey();
    if o.airdrop > 0 {
        chain.airdrop(&pk, o.airdrop).await?;
    }
    register(chain, me, o, report).await?;
    let job = join(chain, me, o, report).await?;
    let dir = o.data.join(job.to_string());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut local = Local::load(&dir)?;
    let mut out = Outcome {
        job,
        ..Default::default()
    };
    epochs(chain, me, o, report, &job, &dir, &mut local, &mut out).await?;
    settle(chain, me, o, report, &job, &local, &mut out).await?;
    out.transactions = chain.sent();
    Ok(out)
}

/// Benchmarks this machine (unless the app did) and registers the node
/// once, re-attesting its terms only when they moved.
async fn register(
    chain: &Chain,
    me: &Keypair,
    o: &OperatorConfig,
    report: Report<'_>,
) -> Result<()> {
    let pk = me.pubkey();
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
    Ok(())
}

/// Finds a job this node qualifies for (or takes the one asked for) and
/// joins it, unless it is a member already.
async fn join(
    chain: &Chain,
    me: &Keypair,
    o: &OperatorConfig,
    report: Report<'_>,
) -> Result<Pubkey> {
    let pk = me.pubkey();
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
    Ok(job)
}

/// Every epoch of the job until it ends: crank what is due, train the
/// epochs this node is a member of, attest them as a witness.
#[allow(clippy::too_many_arguments)]
async fn epochs(
    chain: &Chain,
    me: &Keypair,
    o: &OperatorConfig,
    report: Report<'_>,
    job: &Pubkey,
    dir: &Path,
    local: &mut Local,
    out: &mut Outcome,
) -> Result<()> {
    let pk = me.pubkey();
    let member_addr = client::member_address(job, &pk);
    let corpus = Corpus::bundled()?;
    // When this node first saw each epoch due: others crank after a while.
    let mut due_since: Option<(u32, std::time::Instant)> = None;
    // Each epoch's members as read when it started: a member slashed
    // mid-epoch leaves the job on chain, but not the epoch's P2P layout.
    let mut epoch_members: Option<(u32, Vec<Pubkey>)> = None;
    // Closed epochs whose account was read: finalized or skipped, which
    // does not change.
    let mut looked_at = std::collections::BTreeSet::new();
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
        let j: Job = chain.must(job, "job").await?;
        if j.state.is_terminal() {
            if j.state != JobState::Completed {
                say(report, &pk, format!("job ended: {:?}", j.state));
            }
            return Ok(());
        }
        let started = j.epochs_started;
        // A skipped epoch's points are worth nothing: the ledger drops them
        // (its witnesses attest totals). Every closed epoch is looked at
        // once, so one skipped while this node was away, or just before the
        // next one started, is dropped too.
        for e in 0..j.epochs_closed() {
            if local.skipped.contains(&e) || !looked_at.insert(e) {
                continue;
            }
            if chain
                .state::<Epoch>(&client::epoch_address(job, e))
                .await?
                .is_some_and(|ep| ep.skipped)
            {
                local.drop_epoch(e);
                local.save(dir)?;
                say(
                    report,
                    &pk,
                    format!("epoch {e} timed out unattested: skipped, nobody is paid for it"),
                );
            }
        }
        let due =
            j.state == JobState::Open || (j.epochs_closed() == started && started < j.spec.epochs);
        if due {
            if j.member_count >= j.members_to_start() {
                let first_seen = due_since.filter(|(e, _)| *e == started).map(|(_, t)| t);
                crank::start_epoch(chain, me, job, &j, first_seen, report).await?;
                if first_seen.is_none() {
                    due_since = Some((started, std::time::Instant::now()));
                }
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        let e = started - 1;
        let epoch: Epoch = chain.must(&client::epoch_address(job, e), "epoch").await?;
        if !epoch.sealed {
            // Every member tries; the first seal wins and the rest are
            // refused harmlessly, so no refusal here is news.
            if let Err(err) = seal(chain, me, job, &j, &epoch).await {
                tracing::debug!("seal_epoch {e}: {err:#}");
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        if !epoch.finalized && unix_now() > epoch.deadline {
            crank::skip_epoch(chain, me, job, e).await;
            tokio::time::sleep(POLL).await;
            continue;
        }
        let members = match &epoch_members {
            Some((at, m)) if *at == e => m.clone(),
            _ => {
                let m = crank::members_at_start(chain, job, epoch.members_at_start).await?;
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
            let run = EpochRun {
                chain,
                me,
                o,
                report,
                job,
                j: &j,
                e,
                epoch: &epoch,
                members: &members,
                index: index as u32,
                dir,
                corpus: &corpus,
            };
            let (hash, loss) = run.train(local).await?;
            out.losses.push(loss);
            local.trained = e + 1;
            local.settled.insert(e, local.points.clone());
            local.model_hash.insert(e, hex(&hash));
            local.save(dir)?;
            out.epochs_trained += 1;
        }
        if let Some(e) = crank::attest(chain, me, job, e, &epoch, local, report).await? {
            out.attested.push(e);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// After the job: claim what the points earn, close the membership once
/// nothing is left to pay, and deregister when asked.
async fn settle(
    chain: &Chain,
    me: &Keypair,
    o: &OperatorConfig,
    report: Report<'_>,
    job: &Pubkey,
    local: &Local,
    out: &mut Outcome,
) -> Result<()> {
    let pk = me.pubkey();
    let j: Job = chain.must(job, "job").await?;
    // What the chain pays is the latest attested table: when the last
    // epoch was skipped, that is the one before it, not the running total.
    let table = j
        .latest_finalized()
        .and_then(|e| local.settled.get(&e))
        .unwrap_or(&local.points);
    let ledger = ledger_of(table)?;
    let (points, proof) = ledger.proof(&pk)?;
    out.points = points;
    out.model_hashes = local
        .model_hash
        .values()
        .map(|h| parse_hex(h))
        .collect::<Result<_>>()?;
    if let Some(m) = chain
        .state::<Member>(&client::member_address(job, &pk))
        .await?
    {
        out.claimed = send_claim(chain, me, job, &j, m.claimed, points, proof.clone()).await?;
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
            let ix = client::close_member(&pk, job, points, proof);
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
    Ok(())
}

/// `n` consecutive free TCP ports on loopback (member i listens on base +
/// i), outside the kernel's range for outgoing connections, so a member
/// that restarts finds its port still free.
pub fn free_port_base(n: u16) -> Result<u16> {
    cohort_engine::net::ports::free_base(n).context("picking loopback ports")
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
