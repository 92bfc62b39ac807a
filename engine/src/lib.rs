//! Cohort's training engine.
//!
//! Master weights live on the CPU in f32 ([`params`]); gradients are computed
//! on CUDA, wgpu or the CPU ([`backend`]) for a byte-level transformer
//! ([`model`]) on batches anyone can recompute ([`data`]); updates are
//! compressed DeMo-style ([`dct`], [`compress`]) into a versioned wire format
//! ([`wire`]) and applied in a fixed order ([`optim`]) so every honest node
//! holds the same weights. [`trainer`] ties it together; [`runner`] runs N
//! members in one process; [`ledger`] turns contributions into the Merkle
//! roots witnesses attest on chain.

pub mod adversary;
pub mod arena;
pub mod audit;
pub mod backend;
pub mod compress;
pub mod data;
pub mod dct;
pub mod defence;
pub mod detmath;
pub mod error;
pub mod ledger;
pub mod logs;
pub mod merkle;
pub mod model;
pub mod net;
pub mod optim;
pub mod params;
pub mod probe;
pub mod recipe;
pub mod shard;
pub mod wire;

pub use error::EngineError;
pub mod runner;
pub mod trainer;
