//! Program errors. Codes are part of the public interface: clients map
//! `Custom(code)` back to these, so variants are only ever appended.

use solana_program::program_error::ProgramError;
use thiserror::Error;

#[derive(Error, Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CohortError {
    #[error("instruction data is malformed")]
    InvalidInstruction = 0,
    #[error("a required signature is missing")]
    MissingSigner = 1,
    #[error("account is not owned by the Cohort program")]
    WrongOwner = 2,
    #[error("account holds a different type")]
    WrongAccountType = 3,
    #[error("account layout version is not supported")]
    UnsupportedVersion = 4,
    #[error("account address is not the canonical program address")]
    InvalidPda = 5,
    #[error("account belongs to another job, node or epoch")]
    AccountMismatch = 6,
    #[error("account is already initialized")]
    AlreadyInitialized = 7,
    #[error("arithmetic overflow")]
    Overflow = 8,
    #[error("job spec is invalid")]
    InvalidSpec = 9,
    #[error("deposit does not cover max price x max nodes x epochs")]
    InsufficientDeposit = 10,
    #[error("job is not in a state that allows this")]
    InvalidJobState = 11,
    #[error("job has no free slot")]
    JobFull = 12,
    #[error("node benchmark is below the job minimum")]
    Underpowered = 13,
    #[error("node price is above the job maximum")]
    Overpriced = 14,
    #[error("node stake is below the job minimum")]
    InsufficientStake = 15,
    #[error("node is not available now")]
    NodeUnavailable = 16,
    #[error("node is already in a job or deregistering")]
    NodeBusy = 17,
    #[error("node is already an active member of this job")]
    AlreadyMember = 18,
    #[error("member is not active")]
    NotActiveMember = 19,
    #[error("only the job's requester may do this")]
    NotRequester = 20,
    #[error("the deadline has not passed yet")]
    DeadlineNotReached = 21,
    #[error("the current epoch is not finalized yet")]
    EpochNotFinalized = 22,
    #[error("fewer members than the job minimum")]
    NotEnoughMembers = 23,
    #[error("signer is not a witness of this epoch")]
    NotWitness = 24,
    #[error("witness already voted in this epoch")]
    AlreadyVoted = 25,
    #[error("epoch is not the job's current epoch")]
    WrongEpoch = 26,
    #[error("epoch is already finalized")]
    EpochFinalized = 27,
    #[error("nothing to claim")]
    NothingToClaim = 28,
    #[error("merkle proof does not match the latest finalized root")]
    InvalidProof = 29,
    #[error("no epoch has been finalized yet")]
    NoFinalizedRoot = 30,
    #[error("payout would exceed the deposit")]
    PayoutExceedsDeposit = 31,
    #[error("fewer distinct witness signatures than the quorum")]
    QuorumNotReached = 32,
    #[error("the same account is passed twice")]
    DuplicateAccount = 33,
    #[error("stake cooldown has not ended")]
    CooldownActive = 34,
    #[error("node is not deregistering")]
    NotDeregistering = 35,
    #[error("wrong sysvar account")]
    WrongSysvar = 36,
    #[error("account is not the job's last member")]
    NotLastMember = 37,
    #[error("claim window is still open")]
    ClaimWindowOpen = 38,
    #[error("epoch is still open")]
    EpochOpen = 39,
    #[error("wrong system program account")]
    WrongSystemProgram = 40,
    #[error("attested points exceed what the epoch's members could earn")]
    PointsExceedBudget = 41,
    #[error("account must be writable")]
    NotWritable = 42,
    #[error("payer cannot cover the transfer")]
    InsufficientFunds = 43,
    #[error("the epoch's deadline has passed")]
    DeadlinePassed = 44,
    #[error("job id is below the requester's next job id: job addresses are never reused")]
    JobIdUsed = 45,
    #[error("points exceed steps per epoch x epochs the member took part in")]
    PointsExceedPresence = 46,
    #[error("member account stays until its job ends and its pay is settled")]
    MemberLocked = 47,
    #[error("epoch may still be the target of a fraud report")]
    EpochReportable = 48,
    #[error("nothing to withdraw")]
    NothingToWithdraw = 49,
    #[error("accused member did not take part in that epoch")]
    NotPresent = 50,
    #[error("the epoch's committee is not sealed yet")]
    EpochNotSealed = 51,
    #[error("the epoch is already sealed")]
    EpochSealed = 52,
    #[error("the epoch's seal slot has no hash yet")]
    SealTooEarly = 53,
}

impl From<CohortError> for ProgramError {
    fn from(e: CohortError) -> Self {
        ProgramError::Custom(e as u32)
    }
}

impl From<crate::codec::CodecError> for CohortError {
    fn from(_: crate::codec::CodecError) -> Self {
        CohortError::InvalidInstruction
    }
}

impl CohortError {
    /// Maps a `Custom` program error code back to a variant, for clients.
    pub fn from_code(code: u32) -> Option<Self> {
        use CohortError::*;
        const ALL: [CohortError; 54] = [
            InvalidInstruction,
            MissingSigner,
            WrongOwner,
            WrongAccountType,
            UnsupportedVersion,
            InvalidPda,
            AccountMismatch,
            AlreadyInitialized,
            Overflow,
            InvalidSpec,
            InsufficientDeposit,
            InvalidJobState,
            JobFull,
            Underpowered,
            Overpriced,
            InsufficientStake,
            NodeUnavailable,
            NodeBusy,
            AlreadyMember,
            NotActiveMember,
            NotRequester,
            DeadlineNotReached,
            EpochNotFinalized,
            NotEnoughMembers,
            NotWitness,
            AlreadyVoted,
            WrongEpoch,
            EpochFinalized,
            NothingToClaim,
            InvalidProof,
            NoFinalizedRoot,
            PayoutExceedsDeposit,
            QuorumNotReached,
            DuplicateAccount,
            CooldownActive,
            NotDeregistering,
            WrongSysvar,
            NotLastMember,
            ClaimWindowOpen,
            EpochOpen,
            WrongSystemProgram,
            PointsExceedBudget,
            NotWritable,
            InsufficientFunds,
            DeadlinePassed,
            JobIdUsed,
            PointsExceedPresence,
            MemberLocked,
            EpochReportable,
            NothingToWithdraw,
            NotPresent,
            EpochNotSealed,
            EpochSealed,
            SealTooEarly,
        ];
        ALL.get(code as usize).copied()
    }
}
