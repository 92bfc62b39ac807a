//! Byzantine robustness in one process (`engine::arena`): one test per
//! adversarial mode, each showing the attack detected (the attackers
//! slashed, nobody honest accused) or neutralized (loss unharmed), and an
//! honest run with witnesses on other hardware that accuses nobody.

use cohort_engine::adversary::Mode;
use cohort_engine::arena::{self, ArenaConfig, ArenaReport};
use cohort_engine::audit::AuditConfig;
use cohort_engine::backend::{self, GradientEngine};
use cohort_engine::compress::Select;
use cohort_engine::data::Corpus;
use cohort_engine::net::msg::Manifest;
use cohort_engine::net::step::{StepMachine, Timing, Verdict};
use cohort_engine::runner::RunConfig;
use cohort_engine::trainer::TrainConfig;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const MEMBERS: usize = 6;
const STEPS: u32 = 30;
const EPOCH: u32 = 10;

fn config(adversaries: &[(usize, Mode)], defend: bool) -> ArenaConfig {
    ArenaConfig {
        run: RunConfig {
            train: TrainConfig::small(STEPS),
            members: MEMBERS,
            steps: STEPS,
            steps_per_epoch: EPOCH,
            job: [5; 32],
            eval_windows: 16,
            eval_every: 0,
        },
        adversaries: adversaries.iter().copied().collect(),
        audit: AuditConfig::default(),
        defend,
        witness_jitter: 0.0,
        witness_micro_batch: 0,
        standby: None,
    }
}

fn run(cfg: &ArenaConfig) -> ArenaReport {
    let engines = (0..cfg.run.members).map(|_| backend::cpu()).collect();
    arena::run(cfg, &Corpus::bundled().unwrap(), engines, backend::cpu()).unwrap()
}

fn honest_loss() -> f32 {
    static LOSS: OnceLock<f32> = OnceLock::new();
    *LOSS.get_or_init(|| run(&config(&[], true)).final_val_loss)
}

/// A third of the members (2 of 6) attack with `mode`.
fn attack(mode: Mode) -> ArenaReport {
    attack_with(mode, None)
}

/// `mode` by members 1 and 4, defended; slashed seats taken by newcomers
/// `standby` epochs after the slash's.
fn attack_with(mode: Mode, standby: Option<u32>) -> ArenaReport {
    attacked(
        mode.name(),
        &ArenaConfig {
            standby,
            ..config(&[(1, mode), (4, mode)], true)
        },
    )
}

/// Runs an attacked `cfg`, prints what the defences did, and checks that
/// no honest member was slashed.
fn attacked(label: &str, cfg: &ArenaConfig) -> ArenaReport {
    let r = run(cfg);
    eprintln!(
        "{label}: loss {:.4} (honest {:.4}), slashed {:?}, audits {} ({} targeted, {} honest flagged), overhead {:.1}%, worst honest {:?}",
        r.final_val_loss,
        honest_loss(),
        r.slashed,
        r.audits,
        r.targeted,
        r.honest_flagged,
        100.0 * r.audit_overhead(),
        r.worst_honest
    );
    assert_eq!(r.false_accusations, 0, "an honest member was slashed");
    r
}

fn assert_slashed_in_first_epoch(r: &ArenaReport) {
    let want: BTreeMap<usize, bool> = [(1, true), (4, true)].into();
    let got: BTreeMap<usize, bool> = r.slashed.iter().map(|(i, s)| (*i, *s < EPOCH)).collect();
    assert_eq!(got, want, "slashed (member → within the first epoch)");
}

/// A necessary condition, weak under the job's shared rule: there a third
/// of the members can at most cancel a 3-1 split (undefended IPM left the
/// loss at 1.000x honest in these 30 steps), so the slashing checks carry
/// these tests; `undefended_top_k_vote_is_hurt_by_ipm` shows the check
/// bite where votes have thin support.
fn assert_loss_unharmed(r: &ArenaReport) {
    let ratio = r.final_val_loss / honest_loss();
    assert!(ratio <= 1.10, "loss {ratio:.3} × honest");
}

/// With a node on standby, as `cohort node` waits for an open job, each
/// slashed seat is taken at the next epoch by an honest newcomer, who is
/// never accused for what the seat's last holder did.
#[test]
fn sign_flippers_are_slashed_and_their_seats_taken_by_honest_newcomers() {
    let r = attack_with(Mode::SignFlip, Some(1));
    assert_slashed_in_first_epoch(&r);
    let seats: BTreeMap<usize, u32> = [(1, EPOCH), (4, EPOCH)].into();
    assert_eq!(r.refilled, seats, "seat → step a newcomer took it");
    assert_loss_unharmed(&r);
}

/// The top-k rule (each member's own largest coefficients, with indices;
/// the job recipe before the shared rule): the screen still tells the
/// flippers' agreement from the honest members', audits recompute the
/// chosen coefficients, and no honest member loses its vote to the screen.
#[test]
fn under_the_top_k_rule_sign_flippers_are_slashed_and_no_honest_member_is_flagged() {
    let mut cfg = config(&[(1, Mode::SignFlip), (4, Mode::SignFlip)], true);
    cfg.run.train = TrainConfig::top_k(STEPS);
    assert_eq!(cfg.run.train.compress.select, Select::TopK);
    let r = attacked("top-k sign-flip", &cfg);
    assert_eq!(r.honest_flagged, 0, "an honest member was flagged");
    assert_slashed_in_first_epoch(&r);
}

#[test]
fn noise_is_slashed() {
    let r = attack(Mode::Noise);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

/// Signs cannot carry a magnitude: a scaled gradient only changes which
/// coefficients the attacker votes for, with one vote each.
#[test]
fn scale_is_neutralized() {
    let r = attack(Mode::Scale);
    assert_loss_unharmed(&r);
}

#[test]
fn alie_is_slashed() {
    let r = attack(Mode::Alie);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

#[test]
fn ipm_is_slashed() {
    let r = attack(Mode::Ipm);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

/// Attackers that act as one (`adversary::Mode::Collude`) send payloads
/// their data does not give: audits convict every one of them.
#[test]
fn colluders_are_slashed() {
    let r = attack(Mode::Collude);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

#[test]
fn free_riders_are_slashed_in_the_first_epoch() {
    let r = attack(Mode::FreeRider);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

#[test]
fn copycats_are_slashed_in_the_first_epoch() {
    let r = attack(Mode::Copycat);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

#[test]
fn stale_payloads_are_slashed() {
    let r = attack(Mode::Stale);
    assert_slashed_in_first_epoch(&r);
    assert_loss_unharmed(&r);
}

/// Without the defences the same attack does real damage where a vote has
/// little support: under the top-k rule most coefficients are picked by one
/// honest member, and two attackers outvote it. (Under the shared rule every
/// member votes on every position, so a third of the members can at most
/// cancel a 3-1 split: in this file's 30 steps undefended IPM left the loss
/// at 1.000x honest, measured 2026-12-05. What the screen and audits do
/// there is shown by the tests above: the attackers slashed.)
#[test]
fn undefended_top_k_vote_is_hurt_by_ipm() {
    let top_k = |adversaries: &[(usize, Mode)], defend: bool| {
        let mut cfg = config(adversaries, defend);
        cfg.run.train = TrainConfig::top_k(STEPS);
        cfg
    };
    let honest = run(&top_k(&[], true)).final_val_loss;
    let r = run(&top_k(&[(1, Mode::Ipm), (4, Mode::Ipm)], false));
    let ratio = r.final_val_loss / honest;
    eprintln!("top-k ipm undefended: loss {ratio:.3} × honest");
    assert!(ratio > 1.02, "ipm did no harm undefended ({ratio:.3})");
}

/// An equivocating leader signs two manifests for one step and sends each
/// to some of the nodes. Every node records the evidence and keeps the same
/// one (the lower id), so the attack splits nobody; the evidence is what
/// witnesses submit with `report_fraud`.
#[test]
fn an_equivocating_leader_is_caught_and_splits_nobody() {
    let n = 4;
    let mut ms: Vec<StepMachine> = (0..n)
        .map(|i| StepMachine::new([1; 32], 0, [2; 32], n, i, Timing::default(), Some(0)))
        .collect();
    let leader = ms[0].leader(0, 0);
    let one = Manifest {
        job: [1; 32],
        epoch: 0,
        step: 0,
        attempt: 0,
        leader,
        state_hash: [0; 32],
        parent: [0; 32],
        entries: vec![(0, [1; 32])],
    };
    let mut two = one.clone();
    two.entries = vec![(1, [2; 32])];
    let mut kept = Vec::new();
    for (i, m) in ms.iter_mut().enumerate() {
        if i as u32 == leader {
            continue;
        }
        // Half the nodes get one first, half the other.
        let (a, b) = if i % 2 == 0 {
            (&one, &two)
        } else {
            (&two, &one)
        };
        assert_eq!(
            m.on_manifest(std::time::Duration::ZERO, a.clone()),
            Verdict::Accepted
        );
        m.on_manifest(std::time::Duration::ZERO, b.clone());
        assert_eq!(m.evidence.len(), 1, "node {i} has no evidence");
        kept.push(m.manifest(0).cloned().unwrap());
    }
    assert!(
        kept.iter().all(|m| *m == kept[0]),
        "nodes kept different manifests"
    );
}

/// Honest members audited at every step by a witness that computes with
/// another backend (wgpu where an adapter exists) or another micro-batch,
/// and again with 1% noise on every recomputed gradient (far more than
/// rounding differs between GPUs): nobody is accused.
#[test]
fn honest_members_audited_by_a_witness_that_computes_differently_are_never_accused() {
    let (engine, micro, label) = match backend::hardware_wgpu() {
        Some(s) => (s.engine, 8, "wgpu"),
        None => (
            backend::cpu() as Box<dyn GradientEngine>,
            1,
            "cpu, micro-batch 1",
        ),
    };
    let mut cfg = config(&[], true);
    cfg.run.steps = 24;
    cfg.audit.rate = 1.0;
    cfg.audit.chain_rate = 1.0;
    cfg.witness_micro_batch = micro;
    let engines = (0..MEMBERS).map(|_| backend::cpu()).collect();
    let r = arena::run(&cfg, &Corpus::bundled().unwrap(), engines, engine).unwrap();
    eprintln!(
        "witness on {label}: {} audits, worst {:?}, worst chain error {:?}",
        r.audits, r.worst_honest, r.worst_honest_chain
    );
    assert_eq!(r.audits, MEMBERS * 24);
    // Every audit after the first step checked the momentum chain too.
    assert_eq!(r.chain_checks, MEMBERS * 23);
    assert_eq!(r.false_accusations, 0);
    assert_eq!(r.failed_audits, 0);
    cfg.witness_jitter = 0.01;
    cfg.witness_micro_batch = 0;
    let r = run(&cfg);
    eprintln!(
        "witness with 1% gradient noise: worst {:?}, worst chain error {:?}",
        r.worst_honest, r.worst_honest_chain
    );
    assert_eq!(r.chain_checks, MEMBERS * 23);
    assert_eq!(r.failed_audits, 0);
}

/// A sign-flipper that reveals a momentum forged so its flipped payload
/// recomputes exactly passes every one-step audit. Its momenta do not chain:
/// with the chain check it is slashed in the first epoch, without it never.
#[test]
fn a_forged_momentum_breaks_the_chain_and_is_slashed() {
    let r = attack(Mode::ForgedMomentum);
    eprintln!(
        "chain checks {}, failed {}, least forged chain error {:?}",
        r.chain_checks, r.chain_failed, r.least_attacker_chain
    );
    assert_slashed_in_first_epoch(&r);
    assert!(
        r.chain_failed >= 2,
        "{} chain checks failed",
        r.chain_failed
    );
    assert_loss_unharmed(&r);
    let mut blind = config(
        &[(1, Mode::ForgedMomentum), (4, Mode::ForgedMomentum)],
        true,
    );
    blind.run.steps = EPOCH;
    blind.audit.max_chain_error = f32::INFINITY;
    let r = run(&blind);
    assert!(
        r.slashed.is_empty(),
        "slashed without the chain: {:?}",
        r.slashed
    );
    assert!(r.audits > 0 && r.failed_audits == 0);
}
