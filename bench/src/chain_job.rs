//! A real job's chain costs, read from the chain: `cohort localnet`, a
//! requester's `cohort job create` and `cohort node` processes that train
//! over libp2p, attest and claim as shipped; afterwards every node's
//! transactions come from the chain's own history (`getSignaturesForAddress`)
//! and its balance from `getBalance`, not from counters in the node.

use anyhow::{Context, Result, ensure};
use cohort_app::chain::keys;
use solana_rpc_client::nonblocking::rpc_client::RpcClient;
use solana_sdk::message::Message;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// What the chain shows for one real job.
pub struct Measured {
    pub nodes: usize,
    pub epochs: u32,
    pub steps_per_epoch: u32,
    /// Transactions each node signed over the whole job (airdrops left
    /// out), as the chain's history lists them.
    pub txs: Vec<u64>,
    /// Lamports each node's wallet gained or lost over the job, against
    /// what the faucet gave it.
    pub balance_change: Vec<i64>,
    /// Lamports each node reports claimed (`done:` line), for comparison.
    pub claimed: Vec<u64>,
    pub fee_per_signature: u64,
    pub secs: f64,
}

/// The node's airdrop, in SOL and lamports.
const AIRDROP_SOL: &str = "1";
const AIRDROP: i64 = 1_000_000_000;

/// Kills a process on every way out.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cohort(bin: &Path, home: &Path) -> Command {
    let mut c = Command::new(bin);
    c.env("COHORT_HOME", home).env("RUST_LOG", "error");
    c
}

fn ok(c: &mut Command, what: &str) -> Result<String> {
    let o = c.output().with_context(|| format!("running {what}"))?;
    ensure!(
        o.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Four free consecutive loopback ports: each node takes base + its index.
fn p2p_base() -> Result<u16> {
    cohort_engine::net::ports::free_base(4).context("picking loopback ports")
}

pub fn run(bin: &Path, nodes: usize, epochs: u32, steps_per_epoch: u32) -> Result<Measured> {
    let t = Instant::now();
    let tmp = tempfile::tempdir()?;
    let req = tmp.path().join("requester");
    std::fs::create_dir_all(&req)?;
    let mut chain = cohort(bin, &req)
        .args(["localnet", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting cohort localnet")?;
    let out = chain.stdout.take().context("localnet stdout")?;
    let chain = Proc(chain);
    let mut lines = BufReader::new(out).lines();
    let (mut url, mut faucet) = (None, None);
    while url.is_none() || faucet.is_none() {
        let line = lines
            .next()
            .context("localnet ended before it was ready")??;
        if line.contains("JSON-RPC at") {
            url = line.rsplit(' ').next().map(str::to_string);
        } else if let Some(rest) = line.trim().strip_prefix("faucet") {
            faucet = rest
                .split_whitespace()
                .next()
                .map(Pubkey::from_str)
                .transpose()?;
        }
    }
    let (url, faucet) = (url.unwrap_or_default(), faucet.unwrap_or_default());
    // Keep reading so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let (e, s, n) = (
        epochs.to_string(),
        steps_per_epoch.to_string(),
        nodes.to_string(),
    );
    ok(
        cohort(bin, &req).args(["airdrop", "5", "--url", &url]),
        "airdrop",
    )?;
    let created = ok(
        cohort(bin, &req).args([
            "job",
            "create",
            "--url",
            &url,
            "--epochs",
            &e,
            "--steps-per-epoch",
            &s,
            "--min-nodes",
            &n,
            "--max-nodes",
            &n,
            "--id",
            "1",
        ]),
        "cohort job create",
    )?;
    let job = created
        .split_whitespace()
        .nth(1)
        .context("job create printed no address")?
        .to_string();
    let base = p2p_base()?.to_string();
    let mut wallets = Vec::new();
    let mut procs = Vec::new();
    let mut readers = Vec::new();
    for i in 0..nodes {
        let home = tmp.path().join(format!("node{i}"));
        std::fs::create_dir_all(&home)?;
        let key = home.join("node.json");
        let k: Keypair = keys::load_or_create(&key)?;
        wallets.push(k.pubkey());
        let mut child = cohort(bin, &home)
            .args(["node", "--url", &url, "--job", &job, "--p2p-port", &base])
            .args(["--airdrop", AIRDROP_SOL, "--keypair"])
            .arg(&key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting cohort node")?;
        let out = child.stdout.take();
        // Killed on every way out from here on.
        procs.push(Proc(child));
        // One reader per node, so no node blocks on a full pipe.
        readers.push(std::thread::spawn(move || {
            out.and_then(|o| {
                BufReader::new(o)
                    .lines()
                    .map_while(std::result::Result::ok)
                    .find(|l| l.starts_with("done:"))
            })
        }));
    }
    // All nodes at once, under one deadline: a node that dies stalls the
    // others (the job needs every one), so the first failure ends the run.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut finished = vec![false; nodes];
    while finished.iter().any(|f| !f) {
        for (i, p) in procs.iter_mut().enumerate() {
            if !finished[i]
                && let Some(status) = p.0.try_wait()?
            {
                ensure!(status.success(), "node {i} failed ({status})");
                finished[i] = true;
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the job did not finish within 15 minutes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut claimed = Vec::new();
    for (i, r) in readers.into_iter().enumerate() {
        let done = r.join().map_err(|_| anyhow::anyhow!("reader panicked"))?;
        let done = done.with_context(|| format!("node {i} printed no `done:` line"))?;
        let c: u64 = done
            .split("claimed ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|v| v.parse().ok())
            .context("no claim in the node's done line")?;
        claimed.push(c);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (txs, balance_change, fee_per_signature) = rt.block_on(async {
        let rpc = RpcClient::new(url.clone());
        let sigs = |k: Pubkey| {
            let rpc = &rpc;
            async move {
                let list = rpc.get_signatures_for_address(&k).await?;
                ensure!(list.len() < 1000, "more than one page of history");
                Ok::<_, anyhow::Error>(
                    list.into_iter()
                        .map(|s| s.signature)
                        .collect::<BTreeSet<_>>(),
                )
            }
        };
        // Every transaction naming the faucet is an airdrop.
        let airdrops = sigs(faucet).await?;
        let mut txs = Vec::new();
        let mut change = Vec::new();
        for w in &wallets {
            txs.push(sigs(*w).await?.difference(&airdrops).count() as u64);
            change.push(rpc.get_balance(w).await? as i64 - AIRDROP);
        }
        let blockhash = rpc.get_latest_blockhash().await?;
        let probe = Message::new_with_blockhash(&[], Some(&wallets[0]), &blockhash);
        let fee = rpc.get_fee_for_message(&probe).await?;
        Ok::<_, anyhow::Error>((txs, change, fee))
    })?;
    drop(chain);
    Ok(Measured {
        nodes,
        epochs,
        steps_per_epoch,
        txs,
        balance_change,
        claimed,
        fee_per_signature,
        secs: t.elapsed().as_secs_f64(),
    })
}
