//! The worker: the one owner of the wallet, the chain client, the node and
//! the benchmark. It runs on its own thread with a tokio runtime; the UI
//! sends it [`Command`]s and renders the [`Event`]s it sends back, so the
//! UI thread never waits on I/O, the chain or training.

use super::gpu::GpuHealth;
use super::sandbox::Sandbox;
use super::sensors::Sensors;
use super::settings::{Network, Settings};
use crate::benchmark;
use crate::chain::{Chain, LAMPORTS_PER_SOL, sol};
use crate::node::{self, Earnings, OperatorEvent};
use crate::wallet::{derive, keystore};
use crate::when;
use anyhow::{Context, Result, anyhow, bail};
use cohort_program::error::CohortError;
use cohort_program::state::{Benchmark, Candidate, Job, may_join};
use serde::{Deserialize, Serialize};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use zeroize::Zeroizing;

/// A fee per signature on Solana clusters today; used only when the chain
/// cannot quote one.
const DEFAULT_FEE: u64 = 5_000;

/// What the wallet is created from.
pub enum NewWallet {
    Phrase(Zeroizing<String>),
    KeypairFile(PathBuf),
}

pub enum Command {
    /// A fresh phrase to show once (12 or 24 words).
    NewPhrase {
        words: usize,
    },
    SaveWallet {
        from: NewWallet,
        pass: Zeroizing<String>,
    },
    Unlock {
        pass: Zeroizing<String>,
    },
    /// Forget the key in memory; training already started goes on.
    Lock,
    Airdrop,
    /// Quote the fee of a transfer (shown before it is confirmed).
    QuoteSend {
        to: Pubkey,
        lamports: u64,
    },
    Send {
        to: Pubkey,
        lamports: u64,
    },
    RunBenchmark,
    Join {
        job: Pubkey,
    },
    Pause,
    Resume,
    Leave,
    Claim,
    ApplySettings(Settings),
    Refresh,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub kind: String,
    /// Signed: positive into the wallet.
    pub lamports: i64,
    pub counterparty: String,
    pub unix: i64,
}

/// A job as the board shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub address: Pubkey,
    pub job: Job,
    /// Why this machine cannot join, if it cannot.
    pub blocker: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeUpdate {
    Line(String),
    Step(node::StepProgress),
    Links(Vec<cohort_engine::net::node::PeerLink>),
    /// An audit this node ran as a witness: whether it passed.
    Audit(bool),
    /// A quorum of this many witnesses convicted this node.
    Convicted(usize),
    Finished(Result<String, String>),
}

pub enum Event {
    Network {
        label: String,
        ready: Result<(), String>,
    },
    Keystore {
        exists: bool,
    },
    Phrase(Zeroizing<String>),
    Unlocked {
        address: String,
        recovered: bool,
    },
    Balance(u64),
    History(Vec<HistoryEntry>),
    Fee {
        to: Pubkey,
        lamports: u64,
        fee: u64,
    },
    Sent,
    Benchmarking,
    Benchmark(Box<benchmark::Report>, Benchmark),
    Jobs(Vec<JobRow>),
    Joined {
        job: Pubkey,
    },
    Node(NodeUpdate),
    /// Whether the node computes now, and why not (the user's pause or a
    /// "when to train" rule).
    Training(when::State),
    /// The "when to train" sources this machine cannot read.
    Sensors(Vec<&'static str>),
    /// The GPU's temperature, power, load and memory, where readable.
    Gpu(Option<GpuHealth>),
    Earnings(Earnings),
    Error(String),
    Info(String),
}

/// Where events go: a channel the UI drains each frame, and a repaint so
/// it drains it now rather than at the next input.
#[derive(Clone)]
pub struct Sink {
    tx: std::sync::mpsc::Sender<Event>,
    repaint: Arc<dyn Fn() + Send + Sync>,
}

impl Sink {
    pub fn send(&self, ev: Event) {
        let _ = self.tx.send(ev);
        (self.repaint)();
    }
    fn result(&self, r: Result<()>) {
        if let Err(e) = r {
            self.send(Event::Error(format!("{e:#}")));
        }
    }
}

/// The UI's end of the worker.
pub struct Handle {
    tx: mpsc::UnboundedSender<Command>,
    pub events: std::sync::mpsc::Receiver<Event>,
}

impl Handle {
    pub fn send(&self, c: Command) {
        let _ = self.tx.send(c);
    }
}

/// Starts the worker thread. `repaint` wakes the UI. With `desktop`, the
/// "start with the computer" setting changes the system's login items
/// (tests and the tour leave them alone).
pub fn spawn(settings: Settings, repaint: Arc<dyn Fn() + Send + Sync>, desktop: bool) -> Handle {
    let (tx, rx) = mpsc::unbounded_channel();
    let (etx, events) = std::sync::mpsc::channel();
    let sink = Sink { tx: etx, repaint };
    std::thread::Builder::new()
        .name("cohort-worker".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(Worker::new(settings, sink, desktop).run(rx));
            // Node tasks and the sandbox's peers are dropped with the runtime.
            rt.shutdown_timeout(Duration::from_millis(200));
        })
        .expect("worker thread");
    Handle { tx, events }
}

struct Running {
    job: Pubkey,
    pause: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

struct Worker {
    settings: Settings,
    sink: Sink,
    chain: Option<Arc<Chain>>,
    sandbox: Option<Sandbox>,
    me: Option<Arc<Keypair>>,
    attestation: Option<Benchmark>,
    report: Option<benchmark::Report>,
    node: Option<Running>,
    /// The job this wallet is (or was) a member of, for earnings.
    job: Option<Pubkey>,
    history: Vec<HistoryEntry>,
    /// When to train: the user's rules and pause, applied to the node's
    /// pause flag from the machine's readings every tick.
    when: when::Policy,
    sensors: Sensors,
    /// The GPU health last sent to the UI.
    gpu: Option<GpuHealth>,
    /// Whether settings may change the system's login items.
    desktop: bool,
}

impl Worker {
    fn new(settings: Settings, sink: Sink, desktop: bool) -> Self {
        Self {
            desktop,
            when: when::Policy::new(settings.when),
            sensors: Sensors::new(),
            gpu: None,
            settings,
            sink,
            chain: None,
            sandbox: None,
            me: None,
            attestation: None,
            report: None,
            node: None,
            job: None,
            history: Vec::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        self.sink.send(Event::Keystore {
            exists: keystore::exists(&self.settings.keystore()),
        });
        self.sink.send(Event::Sensors(self.sensors.missing()));
        self.connect().await;
        let mut tick = tokio::time::interval(Duration::from_millis(1500));
        loop {
            tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => {
                        let r = self.handle(c).await;
                        self.sink.result(r);
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    self.apply_when(false);
                    let r = self.refresh().await;
                    self.sink.result(r);
                }
            }
        }
        if let Some(n) = self.node.take() {
            n.task.abort();
        }
    }

    /// (Re)connects to the network the settings name.
    async fn connect(&mut self) {
        self.chain = None;
        self.sandbox = None;
        let s = &self.settings;
        let r: Result<Arc<Chain>> = async {
            match s.network {
                Network::Sandbox => {
                    let sb = Sandbox::start(&s.data_dir).await?;
                    let c = Arc::new(sb.chain());
                    self.sandbox = Some(sb);
                    Ok(c)
                }
                n => {
                    let url = n.url().map(str::to_string).unwrap_or(s.custom_url.clone());
                    let program = Pubkey::from_str(s.program_id.trim())
                        .map_err(|_| anyhow!("`{}` is not a program id", s.program_id))?;
                    Ok(Arc::new(Chain::connect(&url, &program).await?))
                }
            }
        }
        .await;
        let label = self.settings.network.label().to_string();
        match r {
            Ok(c) => {
                self.chain = Some(c);
                self.sink.send(Event::Network {
                    label,
                    ready: Ok(()),
                });
                let _ = self.refresh().await;
            }
            Err(e) => self.sink.send(Event::Network {
                label,
                ready: Err(format!("{e:#}")),
            }),
        }
    }

    fn chain(&self) -> Result<Arc<Chain>> {
        self.chain
            .clone()
            .context("not connected to a chain: see Settings")
    }

    fn me(&self) -> Result<Arc<Keypair>> {
        self.me.clone().context("unlock the wallet first")
    }

    fn history_path(&self, address: &str) -> PathBuf {
        self.settings.data_dir.join(format!(
            "history-{}-{address}.json",
            self.settings.network.label()
        ))
    }

    fn record(&mut self, kind: &str, lamports: i64, counterparty: String) {
        self.history.insert(
            0,
            HistoryEntry {
                kind: kind.into(),
                lamports,
                counterparty,
                unix: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
            },
        );
        if let Some(me) = &self.me {
            let p = self.history_path(&me.pubkey().to_string());
            if let Ok(bytes) = serde_json::to_vec(&self.history)
                && let Ok(tmp) = crate::chain::keys::stage(&p, &bytes)
            {
                let _ = std::fs::rename(tmp, p);
            }
        }
        self.sink.send(Event::History(self.history.clone()));
    }

    async fn handle(&mut self, c: Command) -> Result<()> {
        match c {
            Command::NewPhrase { words } => {
                self.sink.send(Event::Phrase(derive::new_phrase(words)?));
            }
            Command::SaveWallet { from, pass } => {
                let secret = match from {
                    NewWallet::Phrase(p) => keystore::Secret::Phrase(derive::parse_phrase(&p)?),
                    NewWallet::KeypairFile(path) => {
                        let k = crate::chain::keys::load(&path)?;
                        keystore::Secret::Keypair(Zeroizing::new(k.to_bytes().to_vec()))
                    }
                };
                let path = self.settings.keystore();
                std::fs::create_dir_all(&self.settings.data_dir)
                    .with_context(|| format!("creating {}", self.settings.data_dir.display()))?;
                let kdf = self.settings.kdf;
                let (address, kp) = tokio::task::spawn_blocking(move || -> Result<_> {
                    let a = keystore::save(&path, &secret, &pass, kdf)?;
                    Ok((a, secret.keypair()?))
                })
                .await??;
                self.unlocked(kp, address, false).await;
            }
            Command::Unlock { pass } => {
                let path = self.settings.keystore();
                let u = tokio::task::spawn_blocking(move || keystore::load(&path, &pass)).await?;
                let u = u.map_err(|e| {
                    if e.to_string().contains("wrong passphrase") {
                        anyhow!("Wrong passphrase: the wallet stays locked")
                    } else {
                        e
                    }
                })?;
                let kp = u.secret.keypair()?;
                self.unlocked(kp, u.address, u.recovered).await;
            }
            Command::Lock => {
                self.me = None;
                self.history.clear();
                self.sink.send(Event::Keystore { exists: true });
            }
            Command::Airdrop => {
                let (chain, me) = (self.chain()?, self.me()?);
                if self.settings.network != Network::Sandbox {
                    bail!("airdrops are for the Sandbox; on Devnet use the public faucet");
                }
                chain.airdrop(&me.pubkey(), 2 * LAMPORTS_PER_SOL).await?;
                self.record("airdrop", 2 * LAMPORTS_PER_SOL as i64, "faucet".into());
                self.sink.send(Event::Info(format!(
                    "Airdropped {} to this wallet",
                    sol(2 * LAMPORTS_PER_SOL)
                )));
                self.refresh().await?;
            }
            Command::QuoteSend { to, lamports } => {
                let (chain, me) = (self.chain()?, self.me()?);
                let fee = affordable(&chain, &me, &to, lamports).await?;
                self.sink.send(Event::Fee { to, lamports, fee });
            }
            Command::Send { to, lamports } => {
                let (chain, me) = (self.chain()?, self.me()?);
                // Checked again: the balance may have moved since the quote.
                affordable(&chain, &me, &to, lamports).await?;
                let ix =
                    solana_system_interface::instruction::transfer(&me.pubkey(), &to, lamports);
                chain.send("transfer", &[ix], &me, &[]).await?;
                self.record("sent", -(lamports as i64), to.to_string());
                self.sink.send(Event::Sent);
                self.sink
                    .send(Event::Info(format!("Sent {} to {to}", sol(lamports))));
                self.refresh().await?;
            }
            Command::RunBenchmark => {
                let me = self.me()?;
                self.sink.send(Event::Benchmarking);
                let r = tokio::task::spawn_blocking(|| benchmark::run(Duration::from_millis(400)))
                    .await?;
                let att = benchmark::attest(&me, &r);
                self.attestation = Some(att);
                self.report = Some(r.clone());
                self.sink.send(Event::Benchmark(Box::new(r), att));
                self.refresh().await?;
            }
            Command::Join { job } => self.join(job).await?,
            Command::Pause | Command::Resume => {
                self.node
                    .as_ref()
                    .context("not training: join a job first")?;
                self.when.by_user = matches!(c, Command::Pause);
                self.apply_when(true);
            }
            Command::Leave => {
                let n = self.node.take().context("not training")?;
                n.task.abort();
                let (chain, me) = (self.chain()?, self.me()?);
                let j: Job = chain.must(&n.job, "job").await?;
                if !j.state.is_terminal() {
                    node::leave(&chain, &me, &n.job).await?;
                }
                self.sink
                    .send(Event::Node(NodeUpdate::Finished(Ok("left the job".into()))));
                self.sink.send(Event::Info(
                    "Left the job; what it earned stays claimable".into(),
                ));
            }
            Command::Claim => {
                let (chain, me) = (self.chain()?, self.me()?);
                let job = self.job.context("no job joined yet")?;
                let paid = node::claim_now(&chain, &me, &job, &self.node_dir()).await?;
                self.record("claim", paid as i64, job.to_string());
                self.sink
                    .send(Event::Info(format!("Claimed {}", sol(paid))));
                self.refresh().await?;
            }
            Command::ApplySettings(s) => {
                s.save()?;
                if self.desktop && s.start_with_computer != self.settings.start_with_computer {
                    super::autostart::set(s.start_with_computer).context(
                        "the setting is saved, but the computer's login items could not be changed",
                    )?;
                }
                let reconnect = s.network != self.settings.network
                    || s.custom_url != self.settings.custom_url
                    || s.program_id != self.settings.program_id;
                self.when.rules = s.when;
                self.settings = s;
                self.apply_when(true);
                self.sink.send(Event::Info("Settings saved".into()));
                if reconnect {
                    if let Some(n) = self.node.take() {
                        n.task.abort();
                    }
                    self.job = None;
                    self.connect().await;
                }
            }
            Command::Refresh => self.refresh().await?,
        }
        Ok(())
    }

    fn node_dir(&self) -> PathBuf {
        self.settings
            .data_dir
            .join(format!("node-{}", self.settings.network.label()))
    }

    async fn unlocked(&mut self, kp: Keypair, address: String, recovered: bool) {
        self.history = std::fs::read(self.history_path(&address))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        self.me = Some(Arc::new(kp));
        self.sink.send(Event::Unlocked { address, recovered });
        self.sink.send(Event::History(self.history.clone()));
        let _ = self.refresh().await;
    }

    async fn join(&mut self, job: Pubkey) -> Result<()> {
        let (chain, me) = (self.chain()?, self.me()?);
        if self.node.as_ref().is_some_and(|n| !n.task.is_finished()) {
            bail!("already training a job: leave it first");
        }
        let j: Job = chain.must(&job, "job").await?;
        if let Some(why) = blocker(&j, self.attestation.as_ref(), &self.settings) {
            bail!("cannot join: {why}");
        }
        let stake = stake_for(&j);
        let balance = chain.balance(&me.pubkey()).await?;
        if balance < stake + 5_000_000 {
            bail!(
                "Insufficient funds: joining stakes {} (plus rent and fees) but the wallet holds {}",
                sol(stake),
                sol(balance)
            );
        }
        // A new job starts as the rules say, not paused by an old click.
        self.when.by_user = false;
        let pause = Arc::new(AtomicBool::new(false));
        let o = node::OperatorConfig {
            job: Some(job),
            price: j.spec.max_price,
            stake,
            data: self.node_dir(),
            p2p_port: self.sandbox.as_ref().map_or(47000, |s| s.port_base),
            p2p_host: "127.0.0.1".into(),
            airdrop: 0,
            leave: false,
            benchmark: self.attestation,
            pause: pause.clone(),
            release_memory_when_paused: self.settings.release_gpu_memory_when_paused,
            device: self.settings.gpu.choice(),
            adversary: None,
        };
        let sink = self.sink.clone();
        let task = tokio::spawn(async move {
            let report = |_: &Pubkey, p: OperatorEvent| {
                sink.send(Event::Node(match p {
                    OperatorEvent::Line(l) => NodeUpdate::Line(l.to_string()),
                    OperatorEvent::Step(s) => NodeUpdate::Step(s),
                    OperatorEvent::Links(l) => NodeUpdate::Links(l.to_vec()),
                    OperatorEvent::Audit(a) => NodeUpdate::Audit(a.passed),
                    OperatorEvent::Convicted { witnesses } => NodeUpdate::Convicted(witnesses),
                }))
            };
            let r = node::operate(&chain, &me, &o, &report).await;
            sink.send(Event::Node(NodeUpdate::Finished(match r {
                Ok(out) => Ok(format!(
                    "job finished: {} epochs trained, {} claimed",
                    out.epochs_trained,
                    sol(out.claimed)
                )),
                Err(e) => Err(format!("{e:#}")),
            })));
        });
        self.node = Some(Running { job, pause, task });
        self.job = Some(job);
        self.sink.send(Event::Joined { job });
        self.apply_when(true);
        Ok(())
    }

    /// Reads the machine, folds it into the "when to train" rule and sets
    /// the node's pause flag; tells the UI when the state changed (or
    /// always, with `tell`).
    fn apply_when(&mut self, tell: bool) {
        let (sample, gpu) = self.sensors.read();
        if gpu != self.gpu || tell {
            self.gpu = gpu.clone();
            self.sink.send(Event::Gpu(gpu));
        }
        let (state, changed) = self.when.update(&sample);
        let Some(n) = &self.node else {
            return;
        };
        n.pause.store(state.paused(), Ordering::Relaxed);
        if changed || tell {
            self.sink.send(Event::Training(state));
        }
    }

    /// Balance, the job board and earnings, re-read from the chain.
    async fn refresh(&mut self) -> Result<()> {
        let Some(chain) = self.chain.clone() else {
            return Ok(());
        };
        let mut jobs = Vec::new();
        for (address, job) in chain.all::<Job>().await? {
            let blocker = blocker(&job, self.attestation.as_ref(), &self.settings);
            jobs.push(JobRow {
                address,
                job,
                blocker,
            });
        }
        jobs.sort_by_key(|r| std::cmp::Reverse(r.job.created_at));
        self.sink.send(Event::Jobs(jobs));
        let Some(me) = self.me.clone() else {
            return Ok(());
        };
        self.sink
            .send(Event::Balance(chain.balance(&me.pubkey()).await?));
        if let Some(job) = self.job {
            let e = node::earnings(&chain, &me.pubkey(), &job, &self.node_dir()).await?;
            self.sink.send(Event::Earnings(e));
        }
        Ok(())
    }
}

/// The fee of sending `lamports` to `to`, if the wallet can pay both.
async fn affordable(chain: &Chain, me: &Keypair, to: &Pubkey, lamports: u64) -> Result<u64> {
    let ix = solana_system_interface::instruction::transfer(&me.pubkey(), to, lamports);
    let msg = solana_sdk::message::Message::new(&[ix], Some(&me.pubkey()));
    let fee = chain
        .rpc
        .get_fee_for_message(&msg)
        .await
        .unwrap_or(DEFAULT_FEE);
    check_funds(chain.balance(&me.pubkey()).await?, lamports, fee)?;
    Ok(fee)
}

fn check_funds(balance: u64, lamports: u64, fee: u64) -> Result<()> {
    if lamports == 0 {
        bail!("Enter an amount above zero");
    }
    let need = lamports.saturating_add(fee);
    if need > balance {
        bail!(
            "Insufficient funds: sending {} plus a {} fee needs {}, the wallet holds {}",
            sol(lamports),
            sol(fee),
            sol(need),
            sol(balance)
        );
    }
    Ok(())
}

/// Why this machine cannot join `j`, if it cannot: the program's own rule
/// (`state::may_join`) on the node this app would register (it asks the
/// job's price and stakes `stake_for(j)`), then the local memory cap.
pub fn blocker(j: &Job, att: Option<&Benchmark>, s: &Settings) -> Option<String> {
    let me = Candidate {
        // Not benchmarked yet: the benchmark runs before joining, and
        // `join_job` checks it then.
        fp32_gflops: att.map_or(u32::MAX, |b| b.fp32_gflops),
        price: j.spec.max_price,
        stake: stake_for(j),
        available_from: 0,
        available_until: i64::MAX,
        idle: true,
    };
    if let Err(e) = may_join(j, &me, node::unix_now()) {
        return Some(match e {
            CohortError::InvalidJobState => {
                format!("the job is {:?}, not taking members", j.state).to_lowercase()
            }
            CohortError::JobFull => "no slots left".into(),
            CohortError::Underpowered => format!(
                "needs {} fp32 GFLOPS, this machine measured {}",
                j.spec.min_fp32_gflops, me.fp32_gflops
            ),
            other => other.to_string(),
        });
    }
    if cohort_engine::recipe::check(&j.spec).is_err() {
        return Some(
            "made for another version of Cohort (its training recipe differs): update Cohort"
                .into(),
        );
    }
    let need = memory_estimate_mib(j);
    if s.memory_cap_mib > 0 && need > s.memory_cap_mib as u64 {
        return Some(format!(
            "needs about {need} MiB, above the {} MiB memory cap in Settings",
            s.memory_cap_mib
        ));
    }
    None
}

/// What this app stakes to join `j`: the job's minimum, at least 0.01 SOL.
pub fn stake_for(j: &Job) -> u64 {
    j.spec.min_stake.max(LAMPORTS_PER_SOL / 100)
}

/// Rough training memory for a job on one member: weights, gradients,
/// momentum and error feedback in f32, plus activations for its share of
/// the batch.
pub fn memory_estimate_mib(j: &Job) -> u64 {
    let Ok(m) = cohort_engine::model::ModelConfig::parse(&j.spec.arch_str()) else {
        return 0;
    };
    // A GPT block is about 12·d² weights; plus byte embeddings and positions.
    let d = m.d_model as u64;
    let params = 12 * m.layers as u64 * d * d + 2 * 256 * d + m.seq_len as u64 * d;
    let share = (j.spec.global_batch / j.spec.max_nodes.max(1) as u32).max(1) as u64;
    let acts = share * m.seq_len as u64 * m.d_model as u64 * m.layers as u64 * 16;
    ((params * 4 + acts) * 4) >> 20
}
