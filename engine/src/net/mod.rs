//! Peer-to-peer training over libp2p.
//!
//! [`msg`] defines every message once; [`step`] is the step-agreement state
//! machine (pure, also driven by the simulator in [`sim`]); [`swarm`] is the
//! libp2p stack; [`shaper`] emulates home links inside the transport;
//! [`node`] runs one member: its network task, with the training thread
//! in `train` and a witness's audits in `guard`, configured and reporting
//! through [`events`]; [`peer`] is
//! the command line that runs a member as its own OS process; [`ports`]
//! picks loopback ports for local jobs and tests; [`liveness`] sets how
//! often members beat and what the job's gossip costs a link.

pub mod diverge;
pub mod events;
pub mod exchange;
mod guard;
pub mod liveness;
pub mod msg;
pub mod node;
pub mod peer;
pub mod ports;
pub mod shaper;
pub mod sim;
pub mod sim_sharded;
pub mod step;
pub mod swarm;
mod train;
