//! Cohort's training engine.
//!
//! For now it holds the contribution ledger, the bridge from training to the
//! chain: what each member contributed, turned into the Merkle root and digest
//! witnesses attest. The model, compressor and P2P layers build on it.

pub mod ledger;
