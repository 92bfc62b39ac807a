//! Off-chain helpers: instruction builders with the exact account lists the
//! processor expects, and account decoders. The app and the engine use these;
//! nothing else should assemble Cohort instructions by hand.

use crate::instruction::{CohortInstruction, NodeTerms};
use crate::merkle::Hash32;
use crate::pda;
pub use crate::state::{AccountState, Epoch, FraudCase, Job, JobSpec, Member, Node, Requester};
use solana_program::incinerator;
use solana_program::instruction::{AccountMeta, Instruction};
use solana_program::pubkey::Pubkey;
use solana_program::sysvar;
use solana_system_interface::program as system_program;

fn ix(accounts: Vec<AccountMeta>, data: CohortInstruction) -> Instruction {
    Instruction {
        program_id: crate::ID,
        accounts,
        data: data.pack(),
    }
}

fn w(k: Pubkey) -> AccountMeta {
    AccountMeta::new(k, false)
}
fn ws(k: Pubkey) -> AccountMeta {
    AccountMeta::new(k, true)
}
fn r(k: Pubkey) -> AccountMeta {
    AccountMeta::new_readonly(k, false)
}
fn rs(k: Pubkey) -> AccountMeta {
    AccountMeta::new_readonly(k, true)
}

pub fn node_address(owner: &Pubkey) -> Pubkey {
    pda::node(&crate::ID, owner).0
}
pub fn job_address(requester: &Pubkey, job_id: u64) -> Pubkey {
    pda::job(&crate::ID, requester, job_id).0
}
pub fn member_address(job: &Pubkey, node_owner: &Pubkey) -> Pubkey {
    pda::member(&crate::ID, job, node_owner).0
}
pub fn epoch_address(job: &Pubkey, index: u32) -> Pubkey {
    pda::epoch(&crate::ID, job, index).0
}
/// The requester's job-id counter (`Requester`): created by its first job.
pub fn requester_address(requester: &Pubkey) -> Pubkey {
    pda::requester(&crate::ID, requester).0
}
/// The votes against `accused` (a node owner) for `epoch` of `job`.
pub fn fraud_case_address(job: &Pubkey, accused: &Pubkey, epoch: u32) -> Pubkey {
    pda::fraud_case(&crate::ID, job, accused, epoch).0
}

pub fn register_node(owner: &Pubkey, terms: NodeTerms, stake: u64) -> Instruction {
    ix(
        vec![
            ws(*owner),
            w(node_address(owner)),
            r(system_program::ID),
            r(sysvar::rent::ID),
        ],
        CohortInstruction::RegisterNode { terms, stake },
    )
}

pub fn update_node(owner: &Pubkey, terms: NodeTerms, add_stake: u64) -> Instruction {
    ix(
        vec![ws(*owner), w(node_address(owner)), r(system_program::ID)],
        CohortInstruction::UpdateNode { terms, add_stake },
    )
}

pub fn deregister_node(owner: &Pubkey) -> Instruction {
    ix(
        vec![rs(*owner), w(node_address(owner)), r(sysvar::clock::ID)],
        CohortInstruction::DeregisterNode,
    )
}

pub fn close_node(owner: &Pubkey) -> Instruction {
    ix(
        vec![ws(*owner), w(node_address(owner)), r(sysvar::clock::ID)],
        CohortInstruction::CloseNode,
    )
}

pub fn create_job(requester: &Pubkey, job_id: u64, spec: JobSpec, deposit: u64) -> Instruction {
    ix(
        vec![
            ws(*requester),
            w(job_address(requester, job_id)),
            w(requester_address(requester)),
            r(system_program::ID),
            r(sysvar::rent::ID),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::CreateJob {
            job_id,
            spec,
            deposit,
        },
    )
}

pub fn join_job(owner: &Pubkey, job: &Pubkey) -> Instruction {
    ix(
        vec![
            ws(*owner),
            w(node_address(owner)),
            w(*job),
            w(member_address(job, owner)),
            r(system_program::ID),
            r(sysvar::rent::ID),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::JoinJob,
    )
}

/// `last_member_owner` is the node whose member holds index `member_count - 1`
/// (the leaver itself if it is last); the program moves it into the gap.
pub fn leave_job(owner: &Pubkey, job: &Pubkey, last_member_owner: &Pubkey) -> Instruction {
    ix(
        vec![
            rs(*owner),
            w(node_address(owner)),
            w(*job),
            w(member_address(job, owner)),
            w(member_address(job, last_member_owner)),
        ],
        CohortInstruction::LeaveJob,
    )
}

pub fn start_epoch(cranker: &Pubkey, job: &Pubkey, index: u32) -> Instruction {
    ix(
        vec![
            ws(*cranker),
            w(*job),
            w(epoch_address(job, index)),
            r(system_program::ID),
            r(sysvar::rent::ID),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::StartEpoch,
    )
}

/// Seals epoch `index` with `seated`: the node owner at each seat's member
/// index, in seat order (see `committee_to_seal`).
pub fn seal_epoch(job: &Pubkey, index: u32, seated: &[Pubkey]) -> Instruction {
    let mut accounts = vec![
        r(*job),
        w(epoch_address(job, index)),
        r(sysvar::clock::ID),
        r(sysvar::slot_hashes::ID),
    ];
    accounts.extend(seated.iter().map(|o| r(member_address(job, o))));
    ix(accounts, CohortInstruction::SealEpoch)
}

/// The member indices a `seal_epoch` sent now must name, in seat order,
/// from the raw `SlotHashes` data: `None` while the seal slot has no hash
/// yet (or if it slid out of the sysvar, in which case the seal re-targets
/// and needs no members).
pub fn committee_to_seal(
    slot_hashes: &[u8],
    job_key: &Pubkey,
    job: &Job,
    epoch: &Epoch,
) -> Option<Vec<u32>> {
    match crate::schedule::seal_hash(slot_hashes, epoch.seal_slot)? {
        crate::schedule::SealHash::Ready(h) => {
            let n = epoch.members_at_start.min(job.member_count);
            let (_, c) = crate::schedule::seal_committee(
                &h,
                job_key,
                epoch.index,
                n,
                job.spec.witness_count,
            );
            Some(c.members().collect())
        }
        crate::schedule::SealHash::Expired => Some(Vec::new()),
        crate::schedule::SealHash::TooEarly => None,
    }
}

pub fn skip_epoch(job: &Pubkey, index: u32) -> Instruction {
    ix(
        vec![w(*job), w(epoch_address(job, index)), r(sysvar::clock::ID)],
        CohortInstruction::SkipEpoch,
    )
}

pub fn attest_epoch(
    witness: &Pubkey,
    job: &Pubkey,
    epoch: u32,
    model_hash: Hash32,
    root: Hash32,
    total_points: u64,
) -> Instruction {
    ix(
        vec![
            rs(*witness),
            w(node_address(witness)),
            w(member_address(job, witness)),
            w(*job),
            w(epoch_address(job, epoch)),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::AttestEpoch {
            epoch,
            model_hash,
            root,
            total_points,
        },
    )
}

pub fn claim(owner: &Pubkey, job: &Pubkey, points: u64, proof: Vec<Hash32>) -> Instruction {
    ix(
        vec![ws(*owner), w(*job), w(member_address(job, owner))],
        CohortInstruction::Claim { points, proof },
    )
}

/// Every witness in `witnesses` (one or more) must sign the transaction;
/// their votes add to the case against `accused`, and the vote that brings
/// it to the job's quorum slashes. `payer` (a signer) pays the case's rent
/// if this report opens it.
pub fn report_fraud(
    job: &Pubkey,
    epoch: u32,
    accused: &Pubkey,
    last_member_owner: &Pubkey,
    payer: &Pubkey,
    witnesses: &[Pubkey],
    evidence: Hash32,
) -> Instruction {
    let mut accounts = vec![
        w(*job),
        r(epoch_address(job, epoch)),
        w(member_address(job, accused)),
        w(node_address(accused)),
        w(member_address(job, last_member_owner)),
        w(incinerator::ID),
        r(sysvar::clock::ID),
        w(fraud_case_address(job, accused, epoch)),
        ws(*payer),
        r(system_program::ID),
        r(sysvar::rent::ID),
    ];
    for wit in witnesses {
        accounts.push(rs(*wit));
        accounts.push(r(member_address(job, wit)));
    }
    ix(accounts, CohortInstruction::ReportFraud { epoch, evidence })
}

pub fn cancel_job(requester: &Pubkey, job: &Pubkey) -> Instruction {
    ix(
        vec![ws(*requester), w(*job), r(sysvar::clock::ID)],
        CohortInstruction::CancelJob,
    )
}

pub fn expire_job(job: &Pubkey) -> Instruction {
    ix(
        vec![w(*job), r(sysvar::clock::ID)],
        CohortInstruction::ExpireJob,
    )
}

/// Inside the claim window, `points` and `proof` (as for `claim`) settle
/// what the member is still owed before its account closes; after the
/// window, for a slashed member, or once the job is gone, they are ignored
/// (pass `0, vec![]`).
pub fn close_member(owner: &Pubkey, job: &Pubkey, points: u64, proof: Vec<Hash32>) -> Instruction {
    ix(
        vec![
            ws(*owner),
            w(node_address(owner)),
            w(*job),
            w(member_address(job, owner)),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::CloseMember { points, proof },
    )
}

pub fn close_epoch(rent_payer: &Pubkey, job: &Pubkey, index: u32) -> Instruction {
    ix(
        vec![
            w(*rent_payer),
            r(*job),
            w(epoch_address(job, index)),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::CloseEpoch,
    )
}

pub fn close_job(requester: &Pubkey, job: &Pubkey) -> Instruction {
    ix(
        vec![
            ws(*requester),
            w(*job),
            w(incinerator::ID),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::CloseJob,
    )
}

/// Pays the requester what a finished job no longer owes or reserves.
pub fn withdraw(requester: &Pubkey, job: &Pubkey) -> Instruction {
    ix(vec![ws(*requester), w(*job)], CohortInstruction::Withdraw)
}

pub fn close_fraud_case(
    rent_payer: &Pubkey,
    job: &Pubkey,
    accused: &Pubkey,
    epoch: u32,
) -> Instruction {
    ix(
        vec![
            w(*rent_payer),
            r(*job),
            w(fraud_case_address(job, accused, epoch)),
            r(sysvar::clock::ID),
        ],
        CohortInstruction::CloseFraudCase,
    )
}
