//! `cohort demo`: one job through its whole on-chain life on an embedded
//! chain (a real bank with the Cohort program loaded as a builtin).
//!
//! The nodes really train: a small byte-level transformer on the bundled
//! corpus, in this process (the in-process runner; nodes as separate
//! processes over libp2p come with the P2P layer). Each epoch's batches are
//! drawn from the seed the program fixed at `start_epoch`, every applied
//! contribution earns its member one point, and witnesses attest the real
//! model hash and contribution root.

use crate::chain::embedded::Embedded;
use crate::chain::{Chain, LAMPORTS_PER_SOL};
use anyhow::{Context, Result, anyhow, bail, ensure};
use cohort_engine::backend;
use cohort_engine::data::Corpus;
use cohort_engine::ledger::ContributionLedger;
use cohort_engine::model::ModelConfig;
use cohort_engine::runner::Cluster;
use cohort_engine::trainer::TrainConfig;
use cohort_program::client;
use cohort_program::instruction::NodeTerms;
use cohort_program::schedule::Committee;
use cohort_program::state::{
    AccountState, Backend, Benchmark, Epoch, Job, JobSpec, JobState, Member,
};
use solana_sdk::instruction::Instruction;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};

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
    pub val_loss: Vec<f32>,
    pub earned: Vec<u64>,
    pub refunded: u64,
    pub deposit: u64,
    pub epochs_finalized: u32,
    pub transactions_per_node_epoch: f64,
}

/// The embedded chain behind the stock RPC client, plus a sandbox wallet
/// that pays every fee (so balances show only what the job moved).
struct Sandbox {
    chain: Chain,
    fees: Keypair,
    txs: u64,
}

impl Sandbox {
    async fn start() -> Result<Self> {
        let embedded = Embedded::start().await?;
        let chain = Chain::new(embedded.client(), "embedded chain");
        let fees = Keypair::new();
        chain
            .airdrop(&fees.pubkey(), 100 * LAMPORTS_PER_SOL)
            .await?;
        Ok(Self {
            chain,
            fees,
            txs: 0,
        })
    }

    async fn send(&mut self, what: &str, ixs: &[Instruction], signers: &[&Keypair]) -> Result<()> {
        self.chain.send(what, ixs, &self.fees, signers).await?;
        self.txs += 1;
        Ok(())
    }

    async fn balance(&mut self, k: &Pubkey) -> Result<u64> {
        self.chain.balance(k).await
    }

    async fn state<T: AccountState>(&mut self, k: &Pubkey) -> Result<T> {
        self.chain.must(k, "account").await
    }

    async fn fund(&mut self, to: &Pubkey, lamports: u64) -> Result<()> {
        self.chain.airdrop(to, lamports).await
    }
}

fn sol(l: u64) -> String {
    format!("{:.6} SOL", l as f64 / LAMPORTS_PER_SOL as f64)
}

pub async fn run(opts: Options) -> Result<Summary> {
    println!(
        "Cohort demo: embedded local chain, {} nodes, {} epochs of {} steps",
        opts.nodes, opts.epochs, opts.steps
    );
    let model = ModelConfig::tiny();
    let corpus = Corpus::bundled()?;
    let mut chain = Sandbox::start().await?;
    let requester = Keypair::new();
    chain
        .fund(&requester.pubkey(), 10 * LAMPORTS_PER_SOL)
        .await?;
    let price = LAMPORTS_PER_SOL / 1000;
    let stake = LAMPORTS_PER_SOL / 100;

    let mut nodes = Vec::new();
    for i in 0..opts.nodes {
        let node = Keypair::new();
        chain.fund(&node.pubkey(), LAMPORTS_PER_SOL).await?;
        let mut benchmark = Benchmark {
            backend: Backend::Cpu as u8,
            fp32_gflops: 50 + i as u32,
            version: 1,
            ..Default::default()
        };
        benchmark.set_device_name("sandbox cpu (not benchmarked)");
        let terms = NodeTerms {
            price,
            available_from: 0,
            available_until: i64::MAX,
            benchmark,
        };
        chain
            .send(
                "register_node",
                &[client::register_node(&node.pubkey(), terms, stake)],
                &[&node],
            )
            .await?;
        println!(
            "  node {i} registered: {} staked, asks {} per epoch",
            sol(stake),
            sol(price)
        );
        nodes.push(node);
    }

    let train = TrainConfig::small(opts.epochs * opts.steps);
    let mut spec = JobSpec {
        model_hash: model.config_hash(),
        arch: [0; 64],
        dataset_id: corpus.id,
        global_batch: (train.batch * opts.nodes as usize) as u32,
        seq_len: model.seq_len as u32,
        steps_per_epoch: opts.steps,
        epochs: opts.epochs,
        expected_epoch_secs: 600,
        max_epoch_secs: 3600,
        join_window_secs: 3600,
        min_nodes: 3,
        // One slot stays empty, so the requester sees a refund.
        max_nodes: opts.nodes + 1,
        min_fp32_gflops: 10,
        max_price: price,
        min_stake: stake,
        witness_count: 3,
        quorum: 2,
    };
    spec.set_arch(&model.arch());
    let deposit = spec.full_budget().context("job budget overflows")?;
    let requester_start = chain.balance(&requester.pubkey()).await?;
    let job = client::job_address(&requester.pubkey(), 1);
    chain
        .send(
            "create_job",
            &[client::create_job(&requester.pubkey(), 1, spec, deposit)],
            &[&requester],
        )
        .await?;
    println!("job {job} posted: {} escrowed", sol(deposit));

    for (i, n) in nodes.iter().enumerate() {
        chain
            .send("join_job", &[client::join_job(&n.pubkey(), &job)], &[n])
            .await?;
        println!("  node {i} admitted");
    }

    let engines = (0..opts.nodes).map(|_| backend::cpu()).collect();
    let mut cluster = Cluster::new(train, job.to_bytes(), &job.to_bytes(), &corpus, engines)?;
    println!(
        "training {} ({} parameters) on {} ({} bytes, id {}), cpu",
        model.arch(),
        model.num_params(),
        corpus.name,
        corpus.len(),
        hex8(&corpus.id)
    );
    let mut ledger = ContributionLedger::default();
    let mut val_loss = Vec::new();
    let mut per_epoch_node_txs = 0u64;
    let cranker = chain.fees.insecure_clone();
    for e in 0..opts.epochs {
        chain
            .send(
                "start_epoch",
                &[client::start_epoch(&cranker.pubkey(), &job, e)],
                &[],
            )
            .await?;
        let epoch: Epoch = chain.state(&client::epoch_address(&job, e)).await?;
        let (mut loss, mut bytes) = (0.0, 0);
        for _ in 0..opts.steps {
            let r = cluster.step(&epoch.seed, e)?;
            for i in &r.applied {
                ledger.credit(nodes[*i].pubkey(), 1)?;
            }
            (loss, bytes) = (r.loss, r.bytes_per_member);
        }
        let v = cluster.validation_loss(32)?;
        val_loss.push(v);
        let committee = Committee::new(&epoch.seed, epoch.members_at_start, spec.witness_count);
        let mut by_index = vec![None; epoch.members_at_start as usize];
        for n in &nodes {
            let m: Member = chain
                .state(&client::member_address(&job, &n.pubkey()))
                .await?;
            by_index[m.index as usize] = Some(n);
        }
        let model_hash = cluster.trainers[0].model_hash();
        let att = ledger.attestation(&cohort_program::ID, &job, e, model_hash)?;
        let mut voted = Vec::new();
        for seat in committee.members().take(spec.quorum as usize) {
            let w = by_index[seat as usize].context("witness seat is empty")?;
            let ix = client::attest_epoch(
                &w.pubkey(),
                &job,
                &requester.pubkey(),
                e,
                model_hash,
                att.root,
                att.total_points,
            );
            chain.send("attest_epoch", &[ix], &[w]).await?;
            per_epoch_node_txs += 1;
            voted.push(seat);
        }
        let j: Job = chain.state(&job).await?;
        ensure!(j.epochs_finalized == e + 1, "epoch {e} did not finalize");
        println!(
            "epoch {e}: train loss {loss:.3}, validation loss {v:.3}, {bytes} bytes per member per step; witnesses {voted:?} attested model {} (digest {}), {} points, {} owed",
            hex8(&model_hash),
            hex8(&att.digest),
            att.total_points,
            sol(j.owed)
        );
    }

    let mut earned = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let before = chain.balance(&n.pubkey()).await?;
        let (points, proof) = ledger.proof(&n.pubkey())?;
        chain
            .send(
                "claim",
                &[client::claim(&n.pubkey(), &job, points, proof)],
                &[n],
            )
            .await?;
        per_epoch_node_txs += 1;
        let got = chain.balance(&n.pubkey()).await? - before;
        println!("  node {i} claimed {} for {points} contributions", sol(got));
        earned.push(got);
    }

    let j: Job = chain.state(&job).await?;
    ensure!(j.state == JobState::Completed, "job did not complete");
    for n in &nodes {
        chain
            .send(
                "close_member",
                &[client::close_member(&n.pubkey(), &job)],
                &[n],
            )
            .await?;
    }
    for e in 0..opts.epochs {
        chain
            .send(
                "close_epoch",
                &[client::close_epoch(&cranker.pubkey(), &job, e)],
                &[],
            )
            .await?;
    }
    chain
        .send(
            "close_job",
            &[client::close_job(&requester.pubkey(), &job)],
            &[&requester],
        )
        .await?;
    let requester_end = chain.balance(&requester.pubkey()).await?;
    let spent = requester_start - requester_end;

    let node_epochs = opts.nodes as f64 * opts.epochs as f64;
    let summary = Summary {
        val_loss,
        earned,
        refunded: j.refunded,
        deposit,
        epochs_finalized: j.epochs_finalized,
        transactions_per_node_epoch: per_epoch_node_txs as f64 / node_epochs,
    };
    println!("\nsummary");
    println!("  epochs attested on chain : {}", summary.epochs_finalized);
    println!(
        "  validation loss by epoch : {}",
        summary
            .val_loss
            .iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    println!(
        "  paid to nodes            : {}",
        sol(summary.earned.iter().sum())
    );
    println!(
        "  refunded to requester    : {} of {} deposit",
        sol(summary.refunded),
        sol(summary.deposit)
    );
    println!(
        "  requester paid in total  : {} (the sandbox faucet pays fees)",
        sol(spent)
    );
    println!(
        "  node transactions        : {:.2} per node per epoch (attests + one claim; register and join once per job)",
        summary.transactions_per_node_epoch
    );
    println!("  chain transactions       : {}", chain.txs);
    Ok(summary)
}

fn hex8(h: &[u8; 32]) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn demo_trains_pays_every_node_and_refunds_the_empty_slot() {
        let opts = Options {
            nodes: 3,
            epochs: 2,
            steps: 15,
        };
        let s = run(opts).await.unwrap();
        assert_eq!(s.epochs_finalized, 2);
        assert!(
            s.val_loss[1] < s.val_loss[0] && s.val_loss[0] < 5.0,
            "{:?}",
            s.val_loss
        );
        // Every node contributed every step: the full price for each epoch.
        let price = LAMPORTS_PER_SOL / 1000;
        assert_eq!(s.earned, vec![2 * price; 3]);
        // The fourth slot stayed empty: its budget comes back.
        assert_eq!(s.refunded, 2 * price);
        assert_eq!(s.deposit, 4 * 2 * price);
        assert!(s.transactions_per_node_epoch <= 2.0);
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
