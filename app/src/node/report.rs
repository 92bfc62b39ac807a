//! What an operator's node reports as it goes, and where it goes: lines
//! for people, step ticks for bars, links and audits for the app.

use cohort_engine::net::node as p2p;
use solana_sdk::pubkey::Pubkey;

/// One applied step, as a node reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepProgress {
    pub epoch: u32,
    /// Steps of the epoch applied so far, of `of`.
    pub done: u32,
    pub of: u32,
    pub loss: f32,
    pub contributors: usize,
    /// Seconds of this step spent computing and on the network.
    pub compute: f64,
    pub comm: f64,
}

/// What a node reports as it goes: lines for people, step ticks for bars.
#[derive(Debug, Clone, Copy)]
pub enum OperatorEvent<'a> {
    Line(&'a str),
    Step(StepProgress),
    /// The other members' links (every 2 s while training).
    Links(&'a [p2p::PeerLink]),
    /// This node, as a witness, audited another member's contribution.
    Audit(&'a p2p::AuditReport),
    /// A quorum of witnesses convicted this node: it is dropped from the
    /// job and its stake is slashed.
    Convicted {
        witnesses: usize,
    },
}

/// Where progress goes: stdout for `cohort node`, bars for the demo.
pub type Report<'a> = &'a (dyn Fn(&Pubkey, OperatorEvent) + Send + Sync);

/// Prints lines, and a quarter of an epoch's steps.
pub fn print_report(me: &Pubkey, p: OperatorEvent) {
    let who = &me.to_string()[..6];
    match p {
        OperatorEvent::Line(l) => println!("[node {who}] {l}"),
        OperatorEvent::Step(StepProgress {
            epoch,
            done,
            of,
            loss,
            contributors,
            ..
        }) => {
            if done % of.div_ceil(4).max(1) == 0 || done == of {
                println!(
                    "[node {who}] epoch {epoch} step {done}/{of}: loss {loss:.3}, {contributors} contributors"
                );
            }
        }
        OperatorEvent::Links(_) | OperatorEvent::Audit(_) | OperatorEvent::Convicted { .. } => {}
    }
}

pub(super) fn say(report: Report, me: &Pubkey, line: impl AsRef<str>) {
    report(me, OperatorEvent::Line(line.as_ref()));
}
