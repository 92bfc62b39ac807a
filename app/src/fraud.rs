//! Fraud reports on chain. `report_fraud` needs the signatures of a quorum
//! of the epoch's witnesses in one transaction, so the witness that leads
//! the accusation builds it and asks its fellow accusers to co-sign over
//! the P2P layer; each co-signs only a report against a member it accused
//! itself (see [`cosigner`]).

use crate::chain::Chain;
use anyhow::{Context, Result, anyhow, bail};
use cohort_engine::net::node::{Control, Cosigner};
use cohort_program::client;
use cohort_program::instruction::CohortInstruction;
use cohort_program::state::{Job, Member, MemberStatus};
use solana_sdk::message::Message;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signature, Signer};
use solana_sdk::transaction::Transaction;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// A report the node should lead: the accused and its accusers.
#[derive(Debug, Clone)]
pub struct Case {
    pub accused: u32,
    /// Accusers, lowest member index first; the first is the reporter.
    pub witnesses: Vec<u32>,
    pub evidence: [u8; 32],
}

/// What this node agrees to co-sign: a message with exactly one
/// instruction, a Cohort `report_fraud` on `job` against a member this node
/// accused. Nothing else can ride along (a transfer out of the witness's
/// account, say), so signing it costs the witness nothing.
pub fn cosigner(job: Pubkey) -> Cosigner {
    Cosigner(Arc::new(move |bytes: &[u8], accused: &[[u8; 32]]| {
        let Ok(m) = bincode::deserialize::<Message>(bytes) else {
            return false;
        };
        let [ix] = m.instructions.as_slice() else {
            return false;
        };
        let key = |i: u8| m.account_keys.get(i as usize).copied();
        let is_report = matches!(
            CohortInstruction::unpack(&ix.data),
            Ok(CohortInstruction::ReportFraud { .. })
        );
        let against = ix.accounts.get(2).and_then(|i| key(*i));
        is_report
            && key(ix.program_id_index) == Some(cohort_program::id())
            && ix.accounts.first().and_then(|i| key(*i)) == Some(job)
            && accused
                .iter()
                .any(|a| Some(client::member_address(&job, &Pubkey::new_from_array(*a))) == against)
    }))
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

/// Builds the report for `case`, gathers the co-signatures of the first
/// `quorum` accusers through `control`, and sends it.
#[allow(clippy::too_many_arguments)]
pub async fn report(
    chain: &Chain,
    me: &Keypair,
    job: &Pubkey,
    epoch: u32,
    members: &[Pubkey],
    quorum: usize,
    case: &Case,
    control: &mpsc::UnboundedSender<Control>,
) -> Result<Signature> {
    let member = |i: u32| {
        members
            .get(i as usize)
            .copied()
            .ok_or_else(|| anyhow!("member {i} is not in this epoch"))
    };
    let accused = member(case.accused)?;
    if case.witnesses.len() < quorum {
        bail!(
            "{} accusers, the job's quorum is {quorum}",
            case.witnesses.len()
        );
    }
    let signers: Vec<u32> = case.witnesses[..quorum].to_vec();
    let keys = signers
        .iter()
        .map(|w| member(*w))
        .collect::<Result<Vec<_>>>()?;
    let last = last_member(chain, job).await?;
    // The reporter pays the case's rent; a quorum in one transaction
    // slashes at once (the program also adds up votes sent separately).
    let ix = client::report_fraud(
        job,
        epoch,
        &accused,
        &last,
        &me.pubkey(),
        &keys,
        case.evidence,
    );
    let blockhash = chain
        .rpc
        .get_latest_blockhash()
        .await
        .context("report_fraud: blockhash")?;
    let message = Message::new_with_blockhash(&[ix], Some(&me.pubkey()), &blockhash);
    let (reply, answer) = oneshot::channel();
    let others: Vec<u32> = signers
        .iter()
        .copied()
        .filter(|w| members.get(*w as usize) != Some(&me.pubkey()))
        .collect();
    control
        .send(Control::Cosign {
            message: message.serialize(),
            from: others,
            reply,
        })
        .map_err(|_| anyhow!("report_fraud: the node has stopped"))?;
    let sigs = answer
        .await
        .map_err(|_| anyhow!("report_fraud: the node has stopped"))?;
    let mut tx = Transaction::new_unsigned(message);
    tx.try_partial_sign(&[me], blockhash)
        .context("report_fraud: signing")?;
    let required = tx.message.header.num_required_signatures as usize;
    for (w, sig) in sigs {
        let Some(pos) = tx.message.account_keys[..required]
            .iter()
            .position(|k| Some(k) == members.get(w as usize))
        else {
            continue;
        };
        let sig = Signature::from(sig);
        if sig.verify(tx.message.account_keys[pos].as_ref(), &tx.message_data()) {
            tx.signatures[pos] = sig;
        }
    }
    if !tx.is_signed() {
        let have = tx
            .signatures
            .iter()
            .filter(|s| **s != Signature::default())
            .count();
        bail!("report_fraud: {have} of {required} witnesses signed");
    }
    chain.send_signed("report_fraud", tx).await
}
