//! About how much a job pays this machine per hour and per day: before
//! joining, from the job's pay, its steps and the machine's measured speed;
//! while training, from what it has actually earned. Pure, so the job board,
//! the training screen and the tray all say the same thing.

use cohort_engine::recipe;
use cohort_program::state::JobSpec;

/// The share of its measured fp32 rate a device reaches training a model
/// (attention, optimizer and data movement besides the matrix products).
/// An assumption, stated on screen; the rate earned while training replaces
/// it with what the machine really does.
pub const TRAINING_SHARE: f64 = 0.3;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Seconds an epoch should take with this machine in it.
    pub epoch_secs: f64,
    /// Whether this machine's compute, not the job's pace, sets that time.
    pub machine_bound: bool,
    pub per_hour: u64,
    /// A day's pay, or what is left of the job if it ends sooner.
    pub per_day: u64,
}

/// Pay per hour and per day for a machine that trains at `gflops` (its
/// attested fp32 rate), on a job with `epochs_left` epochs to go.
pub fn before_joining(spec: &JobSpec, epochs_left: u32, gflops: f64) -> Option<Estimate> {
    let train = recipe::for_job(spec).ok()?;
    if gflops <= 0.0 || spec.steps_per_epoch == 0 {
        return None;
    }
    let tokens = (train.batch * train.model.seq_len) as f64;
    // A training step: forward and backward, three forward passes' worth.
    let flops = 3.0 * train.model.flops_per_token() * tokens;
    let step_secs = flops / (gflops * 1e9 * TRAINING_SHARE);
    let compute = step_secs * f64::from(spec.steps_per_epoch);
    let paced = f64::from(spec.expected_epoch_secs.max(1));
    let epoch_secs = compute.max(paced);
    let per_sec = spec.max_price as f64 / epoch_secs;
    let left = spec.max_price.saturating_mul(u64::from(epochs_left));
    Some(Estimate {
        epoch_secs,
        machine_bound: compute > paced,
        per_hour: (per_sec * 3600.0) as u64,
        per_day: ((per_sec * 86_400.0) as u64).min(left),
    })
}

/// Lamports per hour earned since `since` (seconds, on the same clock as
/// the series), from a series of (seconds, lamports earned so far); `None`
/// until a first payment and a minute of history.
pub fn earned_per_hour(series: &[(f64, u64)], since: f64, now: f64) -> Option<u64> {
    let span = now - since;
    let earned = earned_between(series, since, now);
    (span >= 60.0 && earned > 0).then(|| (earned as f64 * 3600.0 / span) as u64)
}

/// Lamports earned between `from` and `to`: the growth of the running
/// total over that span (the total before `from` is its last value then).
pub fn earned_between(series: &[(f64, u64)], from: f64, to: f64) -> u64 {
    let at = |t: f64| {
        series
            .iter()
            .take_while(|(s, _)| *s <= t)
            .last()
            .map_or(0, |(_, v)| *v)
    };
    at(to).saturating_sub(at(from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_engine::model::ModelConfig;

    fn spec(expected_epoch_secs: u32) -> JobSpec {
        let model = ModelConfig::tiny();
        let mut arch = [0u8; 64];
        arch[..model.arch().len()].copy_from_slice(model.arch().as_bytes());
        JobSpec {
            model_hash: model.config_hash(),
            arch,
            recipe_hash: [0; 32],
            dataset_id: [0; 32],
            global_batch: 32,
            seq_len: model.seq_len as u32,
            steps_per_epoch: 10,
            epochs: 4,
            expected_epoch_secs,
            max_epoch_secs: 600,
            join_window_secs: 600,
            min_nodes: 2,
            max_nodes: 4,
            min_fp32_gflops: 1,
            max_price: 3_000_000,
            min_stake: 0,
            witness_count: 3,
            quorum: 2,
            audit_rate_bp: 200,
        }
    }

    #[test]
    fn a_fast_machine_earns_at_the_jobs_pace_and_no_more_than_is_left() {
        // 60 s epochs at 0.003 SOL: 0.18 SOL an hour; a day would be 4.32
        // SOL but only 2 epochs (0.006 SOL) are left.
        let e = before_joining(&spec(60), 2, 10_000.0).unwrap();
        assert!(!e.machine_bound);
        assert_eq!(e.epoch_secs, 60.0);
        assert_eq!(e.per_hour, 180_000_000);
        assert_eq!(e.per_day, 6_000_000);
    }

    #[test]
    fn a_slow_machine_sets_the_epoch_time_and_earns_less_per_hour() {
        let fast = before_joining(&spec(1), 100, 10_000.0).unwrap();
        let slow = before_joining(&spec(1), 100, 0.001).unwrap();
        assert!(slow.machine_bound);
        assert!(slow.epoch_secs > fast.epoch_secs);
        assert!(slow.per_hour < fast.per_hour);
        assert!(before_joining(&spec(60), 2, 0.0).is_none());
    }

    #[test]
    fn the_rate_earned_counts_only_payments_inside_the_span() {
        let series = [(10.0, 1_000), (100.0, 4_000), (200.0, 7_000)];
        assert_eq!(earned_between(&series, 50.0, 250.0), 6_000);
        assert_eq!(earned_between(&series, 0.0, 5.0), 0);
        // 6,000 lamports over 200 s: 108,000 an hour.
        assert_eq!(earned_per_hour(&series, 50.0, 250.0), Some(108_000));
        assert_eq!(earned_per_hour(&series, 50.0, 80.0), None);
    }
}
