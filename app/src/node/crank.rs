//! The chain's side of an epoch that any member may crank: starting it
//! when due, sealing its committee, skipping it when it timed out, and a
//! witness's attestation. Every one of these is refused harmlessly when
//! another member was first, and such expected refusals are not news.

use super::local::{Local, parse_hex};
use super::report::{Report, say};
use crate::chain::{self as chainio, Chain};
use anyhow::{Context, Result, anyhow, bail};
use cohort_program::client;
use cohort_program::error::CohortError;
use cohort_program::state::{Epoch, Job, Member, MemberStatus};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Cranks `start_epoch` for epoch `started` of `job`: the member whose turn
/// it is at once, the others once it has not for 8 s (`first_seen` is when
/// this node first saw the epoch due).
pub(super) async fn start_epoch(
    chain: &Chain,
    me: &Keypair,
    job: &Pubkey,
    j: &Job,
    first_seen: Option<Instant>,
    report: Report<'_>,
) -> Result<()> {
    let pk = me.pubkey();
    let started = j.epochs_started;
    let m: Member = chain
        .must(&client::member_address(job, &pk), "membership")
        .await?;
    let mine = started % j.member_count == m.index;
    let waited = first_seen.is_some_and(|t| t.elapsed() > Duration::from_secs(8));
    if !(mine || waited) {
        return Ok(());
    }
    match chain
        .send(
            "start_epoch",
            &[client::start_epoch(&pk, job, started)],
            me,
            &[],
        )
        .await
    {
        Ok(_) => say(report, &pk, format!("started epoch {started}")),
        // Another member was first (expected: not news), or the chain is
        // away: the next read decides.
        Err(e)
            if chainio::refused_with(&e, CohortError::AlreadyInitialized)
                || chainio::refused_with(&e, CohortError::EpochNotFinalized) =>
        {
            tracing::debug!("start_epoch {started}: another member was first");
        }
        Err(e) => say(report, &pk, format!("start_epoch {started}: {e}")),
    }
    Ok(())
}

/// Closes epoch `e`, past its deadline without a quorum, unpaid, so the job
/// goes on.
pub(super) async fn skip_epoch(chain: &Chain, me: &Keypair, job: &Pubkey, e: u32) {
    if let Err(err) = chain
        .send("skip_epoch", &[client::skip_epoch(job, e)], me, &[])
        .await
    {
        tracing::debug!("skip_epoch {e}: {err:#}");
    }
}

/// As a witness seated in `epoch`, attests the model hash and the points
/// table this node ended epoch `e` with, unless its seat has voted; the
/// epoch when this vote was recorded.
pub(super) async fn attest(
    chain: &Chain,
    me: &Keypair,
    job: &Pubkey,
    e: u32,
    epoch: &Epoch,
    local: &Local,
    report: Report<'_>,
) -> Result<Option<u32>> {
    let pk = me.pubkey();
    let Some(seat) = epoch.seat_of(&pk) else {
        return Ok(None);
    };
    if epoch.finalized || epoch.voted_mask & (1 << seat) != 0 {
        return Ok(None);
    }
    let model_hash = parse_hex(
        local
            .model_hash
            .get(&e)
            .context("no model hash for the epoch")?,
    )?;
    let att = local
        .ledger()?
        .attestation(&cohort_program::ID, job, e, model_hash)?;
    let ix = client::attest_epoch(&pk, job, e, model_hash, att.root, att.total_points);
    match chain.send("attest_epoch", &[ix], me, &[]).await {
        Ok(_) => {
            say(
                report,
                &pk,
                format!(
                    "attested epoch {e} as witness seat {seat}: model {}, {} points",
                    &super::local::hex(&model_hash)[..16],
                    att.total_points
                ),
            );
            Ok(Some(e))
        }
        // A quorum may have finalized it meanwhile (the race every late
        // witness loses): nothing to tell the user; the next read of the
        // epoch says so, and nothing is resent then.
        Err(err) if chainio::refused_with(&err, CohortError::EpochFinalized) => {
            tracing::debug!("attest_epoch {e}: finalized before this vote landed");
            Ok(None)
        }
        Err(err) => {
            say(report, &pk, format!("attest_epoch {e}: {err}"));
            Ok(None)
        }
    }
}

/// Sends `seal_epoch` for the open epoch once its seal slot has a hash,
/// naming the member the program will draw at each seat.
pub async fn seal(chain: &Chain, me: &Keypair, job: &Pubkey, j: &Job, epoch: &Epoch) -> Result<()> {
    let hashes = chain
        .data(&solana_sdk::sysvar::slot_hashes::ID)
        .await?
        .context("the chain has no SlotHashes sysvar")?;
    let Some(seats) = client::committee_to_seal(&hashes, job, j, epoch) else {
        bail!("the seal slot has no hash yet");
    };
    let mut by_index = BTreeMap::new();
    for (_, m) in chain.all::<Member>().await? {
        if m.job == *job && m.status == MemberStatus::Active {
            by_index.insert(m.index, m.node);
        }
    }
    let owners = seats
        .iter()
        .map(|i| {
            by_index
                .get(i)
                .copied()
                .with_context(|| format!("no active member at index {i}"))
        })
        .collect::<Result<Vec<_>>>()?;
    chain
        .send(
            "seal_epoch",
            &[client::seal_epoch(job, epoch.index, &owners)],
            me,
            &[],
        )
        .await?;
    Ok(())
}

/// The epoch's members by index (the P2P layer's member order).
pub(super) async fn members_at_start(chain: &Chain, job: &Pubkey, n: u32) -> Result<Vec<Pubkey>> {
    let mut slots = vec![None; n as usize];
    let all = chain.all::<Member>().await?;
    for (_, m) in &all {
        if m.job == *job && m.status == MemberStatus::Active && m.index < n {
            slots[m.index as usize] = Some(m.node);
        }
    }
    // A member slashed in this epoch keeps its index; if it held the last
    // slot nobody moved into it.
    for (_, m) in &all {
        if m.job == *job && m.status == MemberStatus::Slashed && m.index < n {
            slots[m.index as usize].get_or_insert(m.node);
        }
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| anyhow!("member {i} of job {job} is missing")))
        .collect()
}
