//! The `cohort` app's library: the chain layer and the headless commands,
//! shared by the binary, the benches and the tests.

pub mod benchmark;
pub mod chain;
pub mod cli;
pub mod demo;
pub mod estimate;
pub mod fraud;
pub mod gui;
pub mod job;
pub mod localnet_cmd;
pub mod node;
pub mod wallet;
pub mod when;
