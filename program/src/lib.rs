//! Cohort's on-chain job board.
//!
//! Node operators register GPU benchmarks, prices and stake; requesters post
//! jobs with a deposit held in the job account itself; the program admits
//! matching nodes, finalizes each epoch once a quorum of seeded witnesses
//! attest the same digest, and pays members pro rata to their attested
//! contributions through Merkle proofs. See `docs/program.md`.
//!
//! Layout follows the SPL programs: [`instruction`], [`state`],
//! [`processor`], [`error`]; [`client`] holds what off-chain code needs
//! (instruction builders, PDAs, decoders), and [`merkle`] / [`schedule`] are
//! shared by the program and every client so there is one implementation.

pub mod client;
pub mod codec;
pub mod error;
pub mod instruction;
pub mod merkle;
pub mod pda;
pub mod processor;
pub mod schedule;
pub mod state;

solana_program::declare_id!("CohortJobBoard111111111111111111111111111111");

#[cfg(all(target_os = "solana", not(feature = "no-entrypoint")))]
solana_program::entrypoint!(processor::process_instruction);
