//! Fraud votes on chain. Every witness whose own audit failed sends its
//! own `report_fraud` vote, signed by itself alone; the program adds the
//! votes up in the case's account and slashes once a quorum of the
//! epoch's committee has voted. No witness depends on another one still
//! being online to co-sign, which a slow or finished peer may not be.

use crate::chain::Chain;
use anyhow::{Result, anyhow};
use cohort_program::client;
use cohort_program::state::{Job, Member, MemberStatus};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};

/// A member this node's audit failed, and the audited contribution.
#[derive(Debug, Clone)]
pub struct Case {
    pub accused: u32,
    pub evidence: [u8; 32],
}

/// What this node's vote did on chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Voted {
    /// Recorded; not yet a quorum.
    Recorded,
    /// The accused is slashed (by this vote, or already).
    Slashed,
}

/// The owner of the member in the job's last slot: `report_fraud` moves it
/// into the slashed member's slot.
async fn last_member(chain: &Chain, job: &Pubkey) -> Result<Pubkey> {
    let j: Job = chain.must(job, "job").await?;
    let last = j
        .member_count
        .checked_sub(1)
        .ok_or_else(|| anyhow!("job {job} has no members"))?;
    chain
        .all::<Member>()
        .await?
        .into_iter()
        .find(|(_, m)| m.job == *job && m.status == MemberStatus::Active && m.index == last)
        .map(|(_, m)| m.node)
        .ok_or_else(|| anyhow!("job {job}: no active member in slot {last}"))
}

/// Sends this node's vote against `case.accused` for `epoch`.
pub async fn vote(
    chain: &Chain,
    me: &Keypair,
    job: &Pubkey,
    epoch: u32,
    members: &[Pubkey],
    case: &Case,
) -> Result<Voted> {
    let accused = members
        .get(case.accused as usize)
        .copied()
        .ok_or_else(|| anyhow!("member {} is not in this epoch", case.accused))?;
    let address = client::member_address(job, &accused);
    let slashed = |m: Option<Member>| m.is_some_and(|m| m.status == MemberStatus::Slashed);
    if slashed(chain.state::<Member>(&address).await?) {
        return Ok(Voted::Slashed);
    }
    let last = last_member(chain, job).await?;
    let ix = client::report_fraud(
        job,
        epoch,
        &accused,
        &last,
        &me.pubkey(),
        &[me.pubkey()],
        case.evidence,
    );
    let sent = chain.send("report_fraud", &[ix], me, &[]).await;
    // Another witness's vote may have completed the quorum first.
    if slashed(chain.state::<Member>(&address).await?) {
        return Ok(Voted::Slashed);
    }
    sent.map(|_| Voted::Recorded)
}
