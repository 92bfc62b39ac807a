//! `chain`: what the job board costs on chain. First a real job (localnet,
//! `cohort job create`, `cohort node` processes that train, attest and
//! claim as shipped), read back from the chain's history and balances
//! (`chain_job`); then, to see how it grows, jobs of 3, 30 and 300 modelled
//! members (real keys and real transactions on the embedded chain, no
//! training) in the best case: one crank and exactly `quorum` attestations
//! per epoch, one claim each at the end.

use crate::args::Args;
use crate::report::{self, Figures};
use anyhow::{Context, Result, anyhow, ensure};
use cohort_app::chain::embedded::Embedded;
use cohort_app::chain::{Chain, LAMPORTS_PER_SOL};
use cohort_app::job::SpecFile;
use cohort_app::node::benchmark;
use cohort_engine::ledger::ContributionLedger;
use cohort_program::client;
use cohort_program::instruction::NodeTerms;
use cohort_program::state::{AccountState, Epoch, Job, Member, Node};
use solana_sdk::message::Message;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::time::Instant;

const FLAGS: &[&str] = &["sizes", "epochs", "real-nodes", "real-epochs", "real-steps"];

struct Run {
    members: u32,
    epochs: u32,
    recurring_txs: u64,
    max_recurring_per_node_epoch: u64,
    one_off_txs: u64,
    signatures_recurring: u64,
    member_bytes: usize,
    secs: f64,
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let sizes: String = a.get("sizes", "3,30,300".to_string())?;
    let sizes: Vec<u32> = sizes
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| anyhow!("--sizes: `{s}` is not a number"))
        })
        .collect::<Result<_>>()?;
    let epochs: u32 = a.get("epochs", 3)?;
    let real_nodes: usize = a.get("real-nodes", 3)?;
    let real_epochs: u32 = a.get("real-epochs", 3)?;
    let real_steps: u32 = a.get("real-steps", 10)?;
    ensure!(
        (3..=4).contains(&real_nodes),
        "--real-nodes: 3 or 4 (the job's minimum, and four ports per run)"
    );
    println!(
        "chain: a real job, {real_nodes} node processes, {real_epochs} epochs of {real_steps} steps …"
    );
    let real = crate::chain_job::run(&crate::app::cohort()?, real_nodes, real_epochs, real_steps)?;
    println!("  done in {:.0} s", real.secs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let embedded = Embedded::start().await?;
        let chain = Chain::new(embedded.client(), "embedded chain");
        let probe = Keypair::new();
        let blockhash = chain
            .rpc
            .get_latest_blockhash()
            .await
            .map_err(|e| anyhow!("blockhash: {e}"))?;
        let fee_per_sig = chain
            .rpc
            .get_fee_for_message(&Message::new_with_blockhash(
                &[],
                Some(&probe.pubkey()),
                &blockhash,
            ))
            .await
            .map_err(|e| anyhow!("fee: {e}"))?;
        let mut runs = Vec::new();
        for (i, &m) in sizes.iter().enumerate() {
            println!("chain: {m} members, {epochs} epochs …");
            runs.push(one_job(&chain, i as u64 + 1, m, epochs).await?);
        }
        publish(&real, &runs, fee_per_sig)
    })
}

async fn one_job(chain: &Chain, id: u64, members: u32, epochs: u32) -> Result<Run> {
    let t = Instant::now();
    let faucet = Keypair::new();
    chain
        .airdrop(&faucet.pubkey(), 1_000 * LAMPORTS_PER_SOL)
        .await?;
    let requester = Keypair::new();
    chain
        .airdrop(&requester.pubkey(), 100 * LAMPORTS_PER_SOL)
        .await?;
    let witnesses = members.min(16) as u8;
    let spec = SpecFile {
        epochs,
        steps_per_epoch: 10,
        min_nodes: members as u16,
        max_nodes: members as u16,
        witnesses,
        quorum: witnesses / 2 + 1,
        ..SpecFile::default()
    };
    let spec = spec.to_spec([7; 32])?;
    let job = cohort_app::job::create(chain, &requester, id, spec).await?;
    let mut nodes = Vec::new();
    let mut one_off = 0u64;
    for _ in 0..members {
        let n = Keypair::new();
        let fund = solana_system_interface::instruction::transfer(
            &faucet.pubkey(),
            &n.pubkey(),
            LAMPORTS_PER_SOL / 10,
        );
        chain.send("fund", &[fund], &faucet, &[]).await?;
        let terms = NodeTerms {
            price: spec.max_price,
            available_from: 0,
            available_until: i64::MAX,
            benchmark: benchmark(&n, 100.0),
        };
        chain
            .send(
                "register_node",
                &[client::register_node(&n.pubkey(), terms, spec.min_stake)],
                &n,
                &[],
            )
            .await?;
        chain
            .send("join_job", &[client::join_job(&n.pubkey(), &job)], &n, &[])
            .await?;
        one_off += 2;
        nodes.push(n);
    }
    let mut by_index = vec![0usize; members as usize];
    for (i, n) in nodes.iter().enumerate() {
        let m: Member = chain
            .must(&client::member_address(&job, &n.pubkey()), "member")
            .await?;
        by_index[m.index as usize] = i;
    }
    let mut ledger = ContributionLedger::default();
    let mut busiest = 0u64;
    let mut recurring = 0u64;
    for e in 0..epochs {
        let mut per_node = vec![0u64; members as usize];
        // The member whose turn it is cranks (what `cohort node` does).
        let cranker = by_index[(e % members) as usize];
        chain
            .send(
                "start_epoch",
                &[client::start_epoch(&nodes[cranker].pubkey(), &job, e)],
                &nodes[cranker],
                &[],
            )
            .await?;
        per_node[cranker] += 1;
        recurring += 1;
        for n in &nodes {
            ledger.credit(n.pubkey(), spec.steps_per_epoch as u64)?;
        }
        // The cranker seals the committee once the seal slot has a hash.
        let epoch = loop {
            let epoch: Epoch = chain.must(&client::epoch_address(&job, e), "epoch").await?;
            if epoch.sealed {
                break epoch;
            }
            let j: Job = chain.must(&job, "job").await?;
            if cohort_app::node::seal(chain, &nodes[cranker], &job, &j, &epoch)
                .await
                .is_ok()
            {
                let sealed: Epoch = chain.must(&client::epoch_address(&job, e), "epoch").await?;
                if sealed.sealed {
                    per_node[cranker] += 1;
                    recurring += 1;
                    break sealed;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        let att = ledger.attestation(&cohort_program::ID, &job, e, [e as u8; 32])?;
        let seated: Vec<Pubkey> = epoch.seated().map(|(_, k)| *k).collect();
        for key in seated.iter().take(spec.quorum as usize) {
            let w = nodes
                .iter()
                .position(|n| n.pubkey() == *key)
                .context("a seated witness that is not a member")?;
            let ix = client::attest_epoch(
                &nodes[w].pubkey(),
                &job,
                e,
                [e as u8; 32],
                att.root,
                att.total_points,
            );
            chain.send("attest_epoch", &[ix], &nodes[w], &[]).await?;
            per_node[w] += 1;
            recurring += 1;
        }
        let j: Job = chain.must(&job, "job").await?;
        ensure!(j.epochs_finalized == e + 1, "epoch {e} did not finalize");
        busiest = busiest.max(per_node.iter().copied().max().unwrap_or(0));
    }
    for n in &nodes {
        let (points, proof) = ledger.proof(&n.pubkey())?;
        chain
            .send(
                "claim",
                &[client::claim(&n.pubkey(), &job, points, proof)],
                n,
                &[],
            )
            .await?;
        one_off += 1;
    }
    Ok(Run {
        members,
        epochs,
        recurring_txs: recurring,
        // A node's busiest epoch: it can crank and attest in the same one.
        max_recurring_per_node_epoch: busiest,
        one_off_txs: one_off,
        signatures_recurring: recurring,
        member_bytes: Member::LEN,
        secs: t.elapsed().as_secs_f64(),
    })
}

fn publish(real: &crate::chain_job::Measured, runs: &[Run], fee_per_sig: u64) -> Result<()> {
    let mut f = Figures::default();
    let node_epochs = real.epochs as f64;
    let per_node: Vec<f64> = real.txs.iter().map(|t| *t as f64 / node_epochs).collect();
    let mean = per_node.iter().sum::<f64>() / per_node.len() as f64;
    let max = per_node.iter().copied().fold(0.0, f64::max);
    let min = per_node.iter().copied().fold(f64::INFINITY, f64::min);
    let fees = mean * real.fee_per_signature as f64;
    let bal: Vec<f64> = real.balance_change.iter().map(|b| *b as f64).collect();
    let bal_mean = bal.iter().sum::<f64>() / bal.len() as f64;
    let claimed = real.claimed.iter().sum::<u64>() as f64 / real.claimed.len() as f64;
    f.num("real_nodes", real.nodes as f64)
        .num("real_epochs", real.epochs as f64)
        .num("real_steps_per_epoch", real.steps_per_epoch as f64)
        .num("real_txs_per_node_epoch_mean", mean)
        .num("real_txs_per_node_epoch_min", min)
        .num("real_txs_per_node_epoch_max", max)
        .num("real_fees_lamports_per_node_epoch", fees)
        .num("real_balance_change_lamports_mean", bal_mean)
        .num("real_claimed_lamports_mean", claimed)
        .num("real_seconds", real.secs);
    f.num("fee_lamports_per_signature", fee_per_sig as f64)
        .num("node_account_bytes", Node::LEN as f64)
        .num("job_account_bytes", Job::LEN as f64)
        .num("epoch_account_bytes", Epoch::LEN as f64)
        .num("goal_txs_per_node_epoch", 2.0);
    let mut md = format!(
        "## Chain costs\n\n`cargo run --release -p cohort-bench -- chain`.\n\n\
**A real job**, read from the chain: `cohort localnet`, `cohort job create`, and {} `cohort node` processes that register, join, train {} epochs of {} steps over libp2p, crank, attest and claim exactly as shipped (every seated witness attests until the epoch is final, and backup cranks run). Each node's transactions are the signatures the chain's history (`getSignaturesForAddress`) lists for its wallet, airdrops left out; its balance change is `getBalance` at the end minus the airdrop.\n\n\
| chain txs per node per epoch, mean (min–max) | goal | fees per node per epoch | balance change per node over the job | claimed per node |\n|---|---|---|---|---|\n\
| {mean:.2} ({min:.2}–{max:.2}) | ≤ 2 ({}) | {fees:.0} lamports ({} per signature, from the bank) | {:+.6} SOL | {:.6} SOL |\n\n\
The balance change is the claim less fees, stake and account rent still held by the program.\n\n\
**How it grows** (modelled members: real keys and real transactions on the embedded chain, no training), in the best case: per epoch one member cranks `start_epoch` and, two slots later, `seal_epoch`, and exactly `quorum` witnesses attest (16 witnesses, quorum 9, for 30 and 300 members); each member claims once at the end. Register, join and claim happen once per job; the table spreads the claim over the job's epochs. A real node attests from every seat until the epoch is final, so the real job above is the figure to hold against the goal.\n\n",
        real.nodes,
        real.epochs,
        real.steps_per_epoch,
        if mean <= 2.0 { "met" } else { "not met" },
        real.fee_per_signature,
        bal_mean / 1e9,
        claimed / 1e9,
    );
    md.push_str("| members | epochs | chain txs per node per epoch (mean) | busiest node, txs per epoch | fees per node per epoch (lamports) | bytes per member | epoch account bytes |\n|---|---|---|---|---|---|---|\n");
    println!(
        "\nreal job: {mean:.2} ({min:.2}–{max:.2}) txs per node per epoch, {fees:.0} lamports fees per node per epoch\n\n| members | txs/node/epoch | busiest | fees/node/epoch | bytes/member |"
    );
    for r in runs {
        let node_epochs = r.members as f64 * r.epochs as f64;
        // Recurring transactions plus the one claim, per node per epoch.
        let per = (r.recurring_txs as f64 + r.members as f64) / node_epochs;
        let fees =
            (r.signatures_recurring + r.members as u64) as f64 * fee_per_sig as f64 / node_epochs;
        let line = format!(
            "| {} | {} | {per:.3} | {} | {fees:.0} | {} | {} |",
            r.members,
            r.epochs,
            r.max_recurring_per_node_epoch,
            r.member_bytes,
            Epoch::LEN
        );
        println!(
            "| {} | {per:.3} | {} | {fees:.0} | {} |   ({:.1} s)",
            r.members, r.max_recurring_per_node_epoch, r.member_bytes, r.secs
        );
        md.push_str(&line);
        md.push('\n');
        let k = format!("members{}", r.members);
        f.num(&format!("{k}_epochs"), r.epochs as f64)
            .num(&format!("{k}_txs_per_node_epoch"), per)
            .num(
                &format!("{k}_busiest_node_txs_per_epoch"),
                r.max_recurring_per_node_epoch as f64,
            )
            .num(&format!("{k}_fees_lamports_per_node_epoch"), fees)
            .num(&format!("{k}_member_bytes"), r.member_bytes as f64)
            .num(
                &format!("{k}_one_off_txs_per_node"),
                r.one_off_txs as f64 / r.members as f64,
            );
    }
    md.push_str(&format!(
        "\nPer member the chain holds one `Member` account ({} bytes) and, once per operator, one `Node` account ({} bytes); the job ({} bytes) and each epoch ({} bytes, votes of up to 16 witnesses) do not grow with members. Fees at {} lamports per signature.\n",
        Member::LEN,
        Node::LEN,
        Job::LEN,
        Epoch::LEN,
        fee_per_sig
    ));
    report::publish("chain", &f, &md)
}
