//! `cohort demo`: the whole system on one machine, with no setup. An
//! embedded chain (a real bank with the Cohort program as a builtin, behind
//! the stock `RpcClient`), a requester that posts a job with the same code
//! as `cohort job create`, and N nodes that each run the same lifecycle as
//! `cohort node` (register, join, train over libp2p on 127.0.0.1, attest,
//! claim) concurrently in this process.

use crate::chain::embedded::Embedded;
use crate::chain::{Chain, LAMPORTS_PER_SOL, sol};
use crate::job::{self, SpecFile};
use crate::node::{self, OperatorEvent};
use anyhow::{Context, Result, anyhow, bail, ensure};
use cohort_engine::data::Corpus;
use cohort_program::state::{Job, JobState};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::io::IsTerminal;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub nodes: u16,
    pub epochs: u32,
    pub steps: u32,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut o = Self {
            nodes: 3,
            epochs: 3,
            steps: 20,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| it.next().ok_or_else(|| anyhow!("{name} needs a value"));
            match a.as_str() {
                "--nodes" => {
                    o.nodes = value("--nodes")?
                        .parse()
                        .context("--nodes must be a number")?
                }
                "--epochs" => {
                    o.epochs = value("--epochs")?
                        .parse()
                        .context("--epochs must be a number")?
                }
                "--steps" => {
                    o.steps = value("--steps")?
                        .parse()
                        .context("--steps must be a number")?
                }
                other => bail!("unknown option `{other}` for `cohort demo`"),
            }
        }
        ensure!(
            (3..=64).contains(&o.nodes),
            "--nodes must be between 3 and 64"
        );
        ensure!(
            (1..=100).contains(&o.epochs),
            "--epochs must be between 1 and 100"
        );
        ensure!(
            (1..=10_000).contains(&o.steps),
            "--steps must be between 1 and 10000"
        );
        Ok(o)
    }
}

/// What the demo ended with, for the caller and for tests.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Training loss at the end of each epoch (node 0's view).
    pub loss: Vec<f32>,
    pub earned: Vec<u64>,
    pub refunded: u64,
    pub deposit: u64,
    pub epochs_finalized: u32,
    pub transactions_per_node_epoch: f64,
    /// Each node's model hash after each epoch.
    pub models: Vec<Vec<[u8; 32]>>,
}

pub async fn run(opts: Options) -> Result<Summary> {
    println!(
        "Cohort demo: embedded local chain, {} nodes training over libp2p on 127.0.0.1, {} epochs of {} steps",
        opts.nodes, opts.epochs, opts.steps
    );
    let embedded = Embedded::start().await?;
    let requester_chain = Chain::new(embedded.client(), "embedded chain");
    let requester = Keypair::new();
    requester_chain
        .airdrop(&requester.pubkey(), 10 * LAMPORTS_PER_SOL)
        .await?;
    let spec = SpecFile {
        epochs: opts.epochs,
        steps_per_epoch: opts.steps,
        min_nodes: opts.nodes,
        // One slot stays empty, so the requester sees a refund.
        max_nodes: opts.nodes + 1,
        witnesses: 3,
        quorum: 2,
        ..SpecFile::default()
    };
    let spec = spec.to_spec(Corpus::bundled()?.id)?;
    let deposit = spec
        .full_budget()
        .ok_or_else(|| anyhow!("job budget overflows"))?;
    let job = job::create(&requester_chain, &requester, 1, spec).await?;
    println!("requester posted job {job}: {} escrowed", sol(deposit));

    let base = node::free_port_base(opts.nodes)?;
    let data = std::env::temp_dir().join(format!("cohort-demo-{}", std::process::id()));
    let mut tasks = tokio::task::JoinSet::new();
    // Bars on a terminal; plain lines otherwise (logs, CI), where bars hide.
    let tty = std::io::stderr().is_terminal();
    let bars = MultiProgress::new();
    let style = ProgressStyle::with_template("node {prefix} {bar:32} {pos:>4}/{len} steps  {msg}")
        .map_err(|e| anyhow!("progress style: {e}"))?;
    for i in 0..opts.nodes {
        let bar = bars.add(ProgressBar::new((opts.epochs * opts.steps) as u64));
        bar.set_style(style.clone());
        bar.set_prefix(i.to_string());
        let lines = bars.clone();
        let chain = Chain::new(embedded.client(), "embedded chain");
        let me = Keypair::new();
        let o = node::OperatorConfig::local(job, base, data.join(format!("node{i}")));
        tasks.spawn(async move {
            let report = move |pk: &Pubkey, p: OperatorEvent| {
                if !tty {
                    return node::print_report(pk, p);
                }
                match p {
                    OperatorEvent::Line(l) => {
                        let _ = lines.println(format!("[node {i}] {l}"));
                    }
                    OperatorEvent::Step(node::StepProgress {
                        epoch,
                        done,
                        of,
                        loss,
                        contributors,
                        ..
                    }) => {
                        bar.set_position((epoch * of + done) as u64);
                        bar.set_message(format!(
                            "epoch {epoch}, loss {loss:.3}, {contributors} contributors"
                        ));
                    }
                    OperatorEvent::Links(_)
                    | OperatorEvent::Audit(_)
                    | OperatorEvent::Convicted { .. } => {}
                }
            };
            let r = node::operate(&chain, &me, &o, &report).await;
            (i, r)
        });
    }
    let mut outcomes = vec![None; opts.nodes as usize];
    while let Some(r) = tasks.join_next().await {
        let (i, r) = r.map_err(|e| anyhow!("node task: {e}"))?;
        outcomes[i as usize] = Some(r.map_err(|e| anyhow!("node {i}: {e:#}"))?);
    }
    let _ = std::fs::remove_dir_all(&data);
    let outcomes: Vec<node::Outcome> = outcomes.into_iter().flatten().collect();
    let j: Job = requester_chain.must(&job, "job").await?;
    ensure!(
        j.state == JobState::Completed,
        "job did not complete: {:?}",
        j.state
    );
    // Refunds are pulled by the requester, never pushed by the last vote.
    if job::withdrawable(&j) > 0 {
        job::withdraw(&requester_chain, &requester, &job).await?;
    }
    let j: Job = requester_chain.must(&job, "job").await?;
    let node_txs: u64 = outcomes.iter().map(|o| o.transactions).sum();
    let summary = Summary {
        loss: outcomes[0].losses.clone(),
        earned: outcomes.iter().map(|o| o.claimed).collect(),
        refunded: j.refunded,
        deposit,
        epochs_finalized: j.epochs_finalized,
        // Registration, airdrop-free joining and closing happen once per job;
        // per epoch a node sends at most a crank and an attestation.
        transactions_per_node_epoch: node_txs as f64 / (opts.nodes as f64 * opts.epochs as f64),
        models: outcomes.iter().map(|o| o.model_hashes.clone()).collect(),
    };
    if summary.models.iter().any(|m| *m != summary.models[0]) {
        bail!("nodes ended with different models");
    }
    println!("\nsummary");
    println!("  epochs attested on chain : {}", summary.epochs_finalized);
    println!(
        "  training loss by epoch   : {}",
        summary
            .loss
            .iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    for (i, e) in summary.earned.iter().enumerate() {
        println!("  {:<25}: {}", format!("node {i} earned"), sol(*e));
    }
    println!(
        "  refunded to requester    : {} of {} deposit",
        sol(summary.refunded),
        sol(summary.deposit)
    );
    println!(
        "  node transactions        : {:.2} per node per epoch, all included (register, join, cranks, attests, claim, close)",
        summary.transactions_per_node_epoch
    );
    println!(
        "  model after each epoch   : {} (equal on every node)",
        summary.models[0]
            .iter()
            .map(|h| h[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_trains_pays_every_node_and_refunds_the_empty_slot() {
        let opts = Options {
            nodes: 3,
            epochs: 2,
            steps: 12,
        };
        let s = run(opts).await.unwrap();
        assert_eq!(s.epochs_finalized, 2);
        assert!(s.loss[1] < s.loss[0] && s.loss[0] < 6.0, "{:?}", s.loss);
        // Every node contributed every step: the full price for each epoch.
        let price = LAMPORTS_PER_SOL / 1000;
        assert_eq!(s.earned, vec![2 * price; 3]);
        // The fourth slot stayed empty: its budget comes back.
        assert_eq!(s.refunded, 2 * price);
        assert_eq!(s.deposit, 4 * 2 * price);
        assert_eq!(s.models[0].len(), 2);
    }

    #[test]
    fn bad_options_are_clear_errors() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Options::parse(&[]).unwrap(),
            Options {
                nodes: 3,
                epochs: 3,
                steps: 20
            }
        );
        let e = Options::parse(&args(&["--nodes", "2"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("between 3 and 64"), "{e}");
        let e = Options::parse(&args(&["--epochs"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a value"), "{e}");
        let e = Options::parse(&args(&["--bogus"])).unwrap_err().to_string();
        assert!(e.contains("unknown option"), "{e}");
    }
}
