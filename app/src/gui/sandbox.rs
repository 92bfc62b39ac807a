//! Sandbox: the whole job board on this machine with no setup. The
//! embedded chain, a requester that posts a demo job, and two in-process
//! peers that register and join it, so the job starts the moment the user
//! clicks Join (it needs three members).

use crate::chain::embedded::Embedded;
use crate::chain::{Chain, LAMPORTS_PER_SOL};
use crate::job::{self, SpecFile};
use crate::node::{self, OperatorEvent};
use anyhow::Result;
use cohort_engine::data::Corpus;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::path::Path;

/// The demo job's shape: small enough for a laptop CPU, long enough to
/// watch a loss curve fall and an epoch get attested and paid.
pub const EPOCHS: u32 = 6;
pub const STEPS: u32 = 16;
pub const PEERS: u16 = 2;

pub struct Sandbox {
    pub embedded: Embedded,
    pub job: Pubkey,
    /// Members listen on 127.0.0.1:port_base + index.
    pub port_base: u16,
    peers: tokio::task::JoinSet<()>,
}

impl Sandbox {
    pub async fn start(data: &Path) -> Result<Self> {
        let embedded = Embedded::start().await?;
        let chain = Chain::new(embedded.client(), "Sandbox");
        let requester = Keypair::new();
        chain
            .airdrop(&requester.pubkey(), 10 * LAMPORTS_PER_SOL)
            .await?;
        let spec = SpecFile {
            epochs: EPOCHS,
            steps_per_epoch: STEPS,
            min_nodes: PEERS + 1,
            max_nodes: PEERS + 1,
            witnesses: 3,
            quorum: 2,
            ..SpecFile::default()
        }
        .to_spec(Corpus::bundled()?.id)?;
        let job = job::create(&chain, &requester, 1, spec).await?;
        let port_base = node::free_port_base(PEERS + 1)?;
        let mut peers = tokio::task::JoinSet::new();
        for i in 0..PEERS {
            let chain = Chain::new(embedded.client(), "Sandbox");
            let o =
                node::OperatorConfig::local(job, port_base, data.join(format!("sandbox-peer{i}")));
            // Stale state from an earlier session would be another job's.
            let _ = std::fs::remove_dir_all(&o.data);
            peers.spawn(async move {
                let quiet = |_: &Pubkey, _: OperatorEvent| {};
                let _ = node::operate(&chain, &Keypair::new(), &o, &quiet).await;
            });
        }
        Ok(Self {
            embedded,
            job,
            port_base,
            peers,
        })
    }

    pub fn chain(&self) -> Chain {
        Chain::new(self.embedded.client(), "Sandbox")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.peers.abort_all();
    }
}
