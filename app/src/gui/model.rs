//! What the views render: the worker's events folded into one state. Only
//! [`Model::apply`] changes it; views read it and queue commands.

use super::worker::{Event, HistoryEntry, JobRow, NodeUpdate};
use crate::benchmark::Report;
use crate::chain::sol;
use crate::node::Earnings;
use cohort_program::state::Benchmark;
use solana_sdk::pubkey::Pubkey;
use std::collections::VecDeque;
use std::time::Instant;
use zeroize::Zeroizing;

#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    Error(String),
    Info(String),
}

/// Something a user away from the window would want to hear: shown as a
/// desktop notification while the window is not in front.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    pub title: String,
    pub body: String,
}

/// What the tray shows: the state in a few words and the day's earnings.
#[derive(Debug, Clone, PartialEq)]
pub struct TrayStatus {
    pub state: String,
    /// Lamports earned since local midnight.
    pub today: u64,
}

impl TrayStatus {
    pub fn line(&self) -> String {
        format!("{} · today {}", self.state, crate::chain::sol(self.today))
    }
}

/// Another member as the training view shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    pub member: u32,
    pub rtt_ms: Option<f64>,
    pub bytes_in: u64,
    /// Bytes per second received from it since the previous sample.
    pub rate: f64,
    at: Instant,
}

#[derive(Default)]
pub struct Training {
    pub job: Option<Pubkey>,
    /// Seconds after the app started that this node joined the job.
    pub joined_at: f64,
    pub epoch: u32,
    pub done: u32,
    pub of: u32,
    pub steps_applied: u32,
    /// (global step, loss)
    pub loss: Vec<[f64; 2]>,
    pub compute: f64,
    pub comm: f64,
    pub contributors: usize,
    pub peers: Vec<Peer>,
    /// Audits this node ran as a witness, and how many failed.
    pub audits: u32,
    pub audits_failed: u32,
    pub paused: bool,
    /// Why it is paused, in words (the user, or a "when to train" rule).
    pub pause_reason: Option<String>,
    pub lines: VecDeque<String>,
    pub finished: Option<Result<String, String>>,
}

impl Training {
    /// One line for the state the node is in.
    pub fn status(&self) -> String {
        match (&self.finished, self.job) {
            (Some(Ok(m)), _) => format!("Finished: {m}"),
            (Some(Err(e)), _) => format!("Stopped: {e}"),
            (None, None) => "Not training".into(),
            (None, Some(_)) if self.paused => format!(
                "{}: applying updates, computing nothing",
                upper_first(self.pause_reason.as_deref().unwrap_or("paused"))
            ),
            (None, Some(_)) if self.of == 0 => "Joining: waiting for the job to start".into(),
            (None, Some(_)) => format!("Training epoch {}", self.epoch + 1),
        }
    }
}

pub struct Model {
    pub network: String,
    pub network_state: Option<Result<(), String>>,
    pub keystore_exists: Option<bool>,
    /// A new phrase, shown once until the wallet is saved.
    pub phrase: Option<Zeroizing<String>>,
    pub address: Option<String>,
    pub recovered: bool,
    pub balance: Option<u64>,
    pub history: Vec<HistoryEntry>,
    /// A transfer awaiting confirmation: (to, lamports, fee).
    pub quote: Option<(Pubkey, u64, u64)>,
    pub benchmarking: bool,
    pub bench: Option<(Box<Report>, Benchmark)>,
    pub jobs: Vec<JobRow>,
    pub training: Training,
    pub earnings: Option<Earnings>,
    /// (seconds since start, SOL earned so far: claimed + claimable)
    pub earned_series: Vec<[f64; 2]>,
    pub notice: Option<Notice>,
    /// Work the UI asked for and is waiting on (shown with a spinner).
    pub pending: Option<String>,
    pub started: Instant,
    /// "When to train" sources this machine cannot read (their rules never
    /// pause).
    pub sensors_missing: Vec<&'static str>,
    /// Desktop notifications not yet handed to the system.
    pub alerts: Vec<Alert>,
    /// The GPU's health, where this machine lets it be read.
    pub gpu: Option<super::gpu::GpuHealth>,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            network: String::new(),
            network_state: None,
            keystore_exists: None,
            phrase: None,
            address: None,
            recovered: false,
            balance: None,
            history: Vec::new(),
            quote: None,
            benchmarking: false,
            bench: None,
            jobs: Vec::new(),
            training: Training::default(),
            earnings: None,
            earned_series: Vec::new(),
            notice: None,
            pending: None,
            started: Instant::now(),
            sensors_missing: Vec::new(),
            alerts: Vec::new(),
            gpu: None,
        }
    }
}

impl Model {
    pub fn apply(&mut self, ev: Event) {
        match ev {
            Event::Network { label, ready } => {
                self.network = label;
                self.network_state = Some(ready);
            }
            Event::Keystore { exists } => self.keystore_exists = Some(exists),
            Event::Phrase(p) => {
                self.phrase = Some(p);
                self.pending = None;
            }
            Event::Unlocked { address, recovered } => {
                self.address = Some(address);
                self.recovered = recovered;
                self.phrase = None;
                self.keystore_exists = Some(true);
                self.pending = None;
                if recovered {
                    self.notice = Some(Notice::Info(
                        "The wallet file was damaged; the backup copy was used and restored".into(),
                    ));
                }
            }
            Event::Balance(b) => self.balance = Some(b),
            Event::History(h) => self.history = h,
            Event::Fee { to, lamports, fee } => {
                self.quote = Some((to, lamports, fee));
                self.pending = None;
            }
            Event::Sent => {
                self.quote = None;
                self.pending = None;
            }
            Event::Benchmarking => self.benchmarking = true,
            Event::Benchmark(r, att) => {
                self.benchmarking = false;
                self.bench = Some((r, att));
            }
            Event::Jobs(j) => self.jobs = j,
            Event::Joined { job } => {
                self.training = Training {
                    job: Some(job),
                    joined_at: self.started.elapsed().as_secs_f64(),
                    ..Default::default()
                };
                self.pending = None;
            }
            Event::Node(u) => self.node(u),
            Event::Sensors(m) => self.sensors_missing = m,
            Event::Gpu(g) => self.gpu = g,
            Event::Training(s) => {
                self.training.paused = s.paused();
                self.training.pause_reason = match s {
                    crate::when::State::Paused(r) => Some(r.words()),
                    crate::when::State::Training => None,
                };
            }
            Event::Earnings(e) => {
                let before = self.earnings.as_ref().map(|p| p.claimed + p.claimable);
                let now = e.claimed + e.claimable;
                if let Some(before) = before.filter(|b| now > *b) {
                    self.alerts.push(Alert {
                        title: format!("Paid {}", sol(now - before)),
                        body: format!(
                            "An epoch you trained was attested: {} earned on this job so far.",
                            sol(now)
                        ),
                    });
                }
                let total = (e.claimed + e.claimable) as f64 / 1e9;
                let t = self.started.elapsed().as_secs_f64();
                if self.earned_series.last().is_none_or(|l| l[1] != total) {
                    self.earned_series.push([t, total]);
                }
                self.earnings = Some(e);
            }
            Event::Error(e) => {
                self.notice = Some(Notice::Error(e));
                self.pending = None;
                self.benchmarking = false;
            }
            Event::Info(i) => {
                self.notice = Some(Notice::Info(i));
                self.pending = None;
            }
        }
    }

    fn node(&mut self, u: NodeUpdate) {
        let t = &mut self.training;
        match u {
            NodeUpdate::Line(l) => {
                t.lines.push_back(l);
                while t.lines.len() > 8 {
                    t.lines.pop_front();
                }
            }
            NodeUpdate::Step(s) => {
                t.epoch = s.epoch;
                t.done = s.done;
                t.of = s.of;
                t.steps_applied += 1;
                t.loss
                    .push([(s.epoch * s.of + s.done) as f64, s.loss as f64]);
                t.compute = s.compute;
                t.comm = s.comm;
                t.contributors = s.contributors;
            }
            NodeUpdate::Links(links) => {
                let now = Instant::now();
                t.peers = links
                    .into_iter()
                    .map(|l| {
                        let prev = t.peers.iter().find(|p| p.member == l.member);
                        let rate = prev.map_or(0.0, |p| {
                            let secs = now.duration_since(p.at).as_secs_f64().max(1e-3);
                            l.bytes_in.saturating_sub(p.bytes_in) as f64 / secs
                        });
                        Peer {
                            member: l.member,
                            rtt_ms: l.rtt.map(|d| d.as_secs_f64() * 1e3),
                            bytes_in: l.bytes_in,
                            rate,
                            at: now,
                        }
                    })
                    .collect();
            }
            NodeUpdate::Audit(passed) => {
                t.audits += 1;
                t.audits_failed += u32::from(!passed);
            }
            NodeUpdate::Convicted(witnesses) => self.alerts.push(Alert {
                title: "This node was convicted of cheating".into(),
                body: format!(
                    "{witnesses} witnesses found that its work did not match a recomputation: \
                     it left the job and its stake is slashed. If nobody changed this machine, \
                     its GPU may compute wrongly: run the benchmark again before joining."
                ),
            }),
            NodeUpdate::Finished(r) => {
                self.alerts.push(match &r {
                    Ok(m) => Alert {
                        title: "Job finished".into(),
                        body: m.clone(),
                    },
                    Err(e) => Alert {
                        title: "Training stopped".into(),
                        body: format!("{e}. Open Cohort to see what happened and join again."),
                    },
                });
                t.finished = Some(r);
            }
        }
    }

    /// Earnings so far as (seconds since the app started, lamports). What
    /// the first reading found was earned before the app started, at no
    /// time this session can place: it counts as the starting total.
    fn earned(&self) -> Vec<(f64, u64)> {
        let points = self
            .earned_series
            .iter()
            .map(|p| (p[0], (p[1] * 1e9).round() as u64));
        let start = points.clone().next().map(|(_, v)| (f64::NEG_INFINITY, v));
        start.into_iter().chain(points).collect()
    }

    /// Lamports an hour earned since joining the job being trained.
    pub fn earning_rate(&self) -> Option<u64> {
        self.training.job?;
        let now = self.started.elapsed().as_secs_f64();
        crate::estimate::earned_per_hour(&self.earned(), self.training.joined_at, now)
    }

    /// The tray's words, `secs_since_midnight` being the local time of day.
    pub fn tray_status(&self, secs_since_midnight: f64) -> TrayStatus {
        let t = &self.training;
        let state = match (t.job, &t.finished) {
            (Some(_), None) if t.paused => {
                upper_first(t.pause_reason.as_deref().unwrap_or("paused"))
            }
            (Some(_), None) => "Training".into(),
            _ => "Idle".into(),
        };
        let now = self.started.elapsed().as_secs_f64();
        TrayStatus {
            state,
            today: crate::estimate::earned_between(&self.earned(), now - secs_since_midnight, now),
        }
    }

    /// The job being trained, as the board last saw it.
    pub fn training_job(&self) -> Option<&JobRow> {
        let k = self.training.job?;
        self.jobs.iter().find(|r| r.address == k)
    }
}

/// "paused by you" → "Paused by you".
fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
