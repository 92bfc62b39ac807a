//! What a node has earned on a job and how it gets paid: the per-epoch
//! shares, a claim against the latest attested root, leaving a job.

use super::local::{Local, ledger_of};
use crate::chain::Chain;
use anyhow::{Context, Result, bail};
use cohort_program::client;
use cohort_program::state::{Job, Member, MemberStatus};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::path::Path;

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
pub(super) async fn send_claim(
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
