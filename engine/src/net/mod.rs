//! Peer-to-peer training over libp2p.
//!
//! [`msg`] defines every message once; [`step`] is the step-agreement state
//! machine (pure, also driven by the simulator in [`sim`]); [`swarm`] is the
//! libp2p stack; [`shaper`] emulates home links inside the transport;
//! [`node`] runs one member (training thread + network task); [`peer`] is
//! the command line that runs a member as its own OS process.

pub mod diverge;
pub mod msg;
pub mod node;
pub mod peer;
pub mod shaper;
pub mod sim;
pub mod step;
pub mod swarm;
