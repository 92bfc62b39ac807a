//! Program-derived addresses. The program derives every address itself from
//! these seeds and stores the canonical bump, so an account at any other
//! address (another bump included) is refused with `InvalidPda`.

use solana_program::pubkey::Pubkey;

pub const NODE_SEED: &[u8] = b"node";
pub const JOB_SEED: &[u8] = b"job";
pub const MEMBER_SEED: &[u8] = b"member";
pub const EPOCH_SEED: &[u8] = b"epoch";
pub const REQUESTER_SEED: &[u8] = b"requester";
pub const FRAUD_SEED: &[u8] = b"fraud";

pub fn node(program_id: &Pubkey, owner: &Pubkey) -> (Pubkey, u8) {
    Pubkey::find_program_address(&[NODE_SEED, owner.as_ref()], program_id)
}

pub fn job(program_id: &Pubkey, requester: &Pubkey, job_id: u64) -> (Pubkey, u8) {
    Pubkey::find_program_address(
        &[JOB_SEED, requester.as_ref(), &job_id.to_le_bytes()],
        program_id,
    )
}

pub fn member(program_id: &Pubkey, job: &Pubkey, node_owner: &Pubkey) -> (Pubkey, u8) {
    Pubkey::find_program_address(
        &[MEMBER_SEED, job.as_ref(), node_owner.as_ref()],
        program_id,
    )
}

pub fn epoch(program_id: &Pubkey, job: &Pubkey, index: u32) -> (Pubkey, u8) {
    Pubkey::find_program_address(
        &[EPOCH_SEED, job.as_ref(), &index.to_le_bytes()],
        program_id,
    )
}

pub fn requester(program_id: &Pubkey, requester: &Pubkey) -> (Pubkey, u8) {
    Pubkey::find_program_address(&[REQUESTER_SEED, requester.as_ref()], program_id)
}

pub fn fraud_case(program_id: &Pubkey, job: &Pubkey, accused: &Pubkey, epoch: u32) -> (Pubkey, u8) {
    Pubkey::find_program_address(
        &[
            FRAUD_SEED,
            job.as_ref(),
            accused.as_ref(),
            &epoch.to_le_bytes(),
        ],
        program_id,
    )
}
