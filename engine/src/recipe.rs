//! The training recipe a job commits to on chain: built from the job spec by
//! one function every caller uses, versioned and hashed, so a member on a
//! build that would train differently refuses the job up front instead of
//! silently rejecting its peers' payloads.

use crate::compress::{Decode, Select};
use crate::model::ModelConfig;
use crate::trainer::TrainConfig;
use cohort_program::state::JobSpec;
use thiserror::Error;

/// Moves whenever the training rule changes in a way the fields hashed
/// below do not show (the decoder, the optimiser, the data order, the
/// detmath routines): a job created by another version then refuses to run.
/// 2 (2026-12-05): the shared rule became the recipe, and a payload's
/// identity under it (`audit::payload_hash`, which audit coins and evidence
/// ids hash) covers its sign bits only.
/// 3 (2026-12-06): the look-ahead (`TrainConfig::look_ahead` = 1): a
/// contribution computed one step ahead takes its gradient on the weights
/// extrapolated by the last update, and the shared state carries the
/// weights before it.
/// 4 (2026-12-07): no weight decay (`TrainConfig::weight_decay` = 0, was
/// 0.1), and message version 10 (a job cuts one shard per two members).
pub const RECIPE_VERSION: u32 = 4;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecipeError {
    #[error("the job's model `{arch}` cannot be built: {reason}")]
    Model { arch: String, reason: String },
    #[error("the job's model hash does not match its architecture `{0}`")]
    ModelHash(String),
    #[error(
        "the job trains with recipe {job}, this build with recipe {ours} \
         (version {RECIPE_VERSION}): install the Cohort version the job was created with"
    )]
    Mismatch { job: String, ours: String },
}

/// The recipe this build trains `spec` with: the model it names, the
/// default compression and schedule over all its steps, and the per-member
/// batch `global_batch / max_nodes`.
pub fn for_job(spec: &JobSpec) -> Result<TrainConfig, RecipeError> {
    let arch = spec.arch_str();
    let model = ModelConfig::parse(&arch).map_err(|e| RecipeError::Model {
        arch: arch.clone(),
        reason: e.to_string(),
    })?;
    if model.config_hash() != spec.model_hash {
        return Err(RecipeError::ModelHash(arch));
    }
    let mut train = TrainConfig::small(spec.epochs.saturating_mul(spec.steps_per_epoch));
    train.model = model;
    train.batch = (spec.global_batch / u32::from(spec.max_nodes.max(1))).max(1) as usize;
    train.micro_batch = train.batch;
    Ok(train)
}

/// `for_job`, refused unless the spec's recipe hash is this build's.
pub fn check(spec: &JobSpec) -> Result<TrainConfig, RecipeError> {
    let train = for_job(spec)?;
    let ours = hash(&train);
    if ours != spec.recipe_hash {
        return Err(RecipeError::Mismatch {
            job: short(&spec.recipe_hash),
            ours: short(&ours),
        });
    }
    Ok(train)
}

/// Everything that decides the weights but the model (it has its own hash)
/// and the micro-batch (a local memory choice that gives the same update),
/// with the recipe and wire versions.
pub fn hash(t: &TrainConfig) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-recipe");
    h.update(&RECIPE_VERSION.to_le_bytes());
    h.update(&[crate::wire::VERSION, crate::net::msg::VERSION]);
    let c = &t.compress;
    h.update(&(c.max_chunk as u64).to_le_bytes());
    h.update(&(c.topk as u64).to_le_bytes());
    h.update(&c.decay.to_bits().to_le_bytes());
    h.update(&[match c.decode {
        Decode::Sign => 0,
        Decode::Rms => 1,
    }]);
    h.update(&[match c.select {
        Select::TopK => 0,
        Select::Shared => 1,
    }]);
    let l = &t.lr;
    h.update(&l.base.to_bits().to_le_bytes());
    h.update(&l.warmup.to_le_bytes());
    h.update(&l.total.to_le_bytes());
    h.update(&l.min_ratio.to_bits().to_le_bytes());
    h.update(&t.weight_decay.to_bits().to_le_bytes());
    h.update(&t.adaptive_beta2.to_bits().to_le_bytes());
    h.update(&t.look_ahead.to_bits().to_le_bytes());
    h.update(&(t.batch as u64).to_le_bytes());
    *h.finalize().as_bytes()
}

fn short(h: &[u8; 32]) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        let model = ModelConfig::tiny();
        let mut s = JobSpec {
            model_hash: model.config_hash(),
            arch: [0; 64],
            recipe_hash: [0; 32],
            dataset_id: [0; 32],
            global_batch: 32,
            seq_len: model.seq_len as u32,
            steps_per_epoch: 10,
            epochs: 3,
            expected_epoch_secs: 60,
            max_epoch_secs: 600,
            join_window_secs: 600,
            min_nodes: 3,
            max_nodes: 4,
            min_fp32_gflops: 1,
            max_price: 1,
            min_stake: 1,
            witness_count: 3,
            quorum: 2,
            audit_rate_bp: 0,
        };
        s.set_arch(&model.arch());
        s
    }

    /// A job of the convergence bench's model.
    fn bench_spec() -> JobSpec {
        let mut s = spec();
        s.set_arch("gpt l2 d128 h4 s64");
        s.model_hash = ModelConfig::parse("gpt l2 d128 h4 s64")
            .unwrap()
            .config_hash();
        s
    }

    #[test]
    fn a_job_of_ten_members_or_more_runs_the_sharded_exchange_with_a_plan_its_recipe_can_cut() {
        use crate::net::exchange::{plan_for, sharded_for};
        // 9 members download 8 payloads a step all-to-all: three plus an
        // aggregate of 5 bits. 10 download 9: over the bound.
        assert!(!sharded_for(3) && !sharded_for(9));
        assert!(sharded_for(10) && sharded_for(48) && sharded_for(1000));
        let t = for_job(&bench_spec()).unwrap();
        assert_eq!(plan_for(9, &t), None);
        let shapes: Vec<Vec<usize>> = t.model.shapes().into_iter().map(|(_, s)| s).collect();
        let layout = crate::compress::Layout::new(&shapes, &t.compress);
        let chunks: usize = layout.dcts.iter().map(|d| d.tiling.chunks()).sum();
        for members in [10, 11, 48, 1000] {
            let plan = plan_for(members, &t).unwrap();
            // Two members a shard, as many seats as members.
            assert_eq!(
                plan.shards,
                members.div_ceil(2).min(chunks),
                "{members} members"
            );
            assert_eq!(plan.redundancy, 2);
            let shards = crate::shard::split(&layout, plan.shards).unwrap();
            assert!(
                shards
                    .iter()
                    .all(|x| x.positions <= crate::net::msg::MAX_SLICE_SIGNS)
            );
        }
        // A top-k rule's members name positions of their own: no shard can
        // sum them.
        let mut topk = t;
        topk.compress.select = Select::TopK;
        assert_eq!(plan_for(48, &topk), None);
    }

    #[test]
    fn a_job_trains_with_the_shared_rule_at_over_a_thousand_times_fewer_bytes_than_fp32() {
        let t = for_job(&bench_spec()).unwrap();
        assert_eq!((t.compress.select, t.compress.topk), (Select::Shared, 61));
        // Computed one step ahead on the weights extrapolated by the whole
        // last update (`cohort-bench convergence`'s `sharedlook100`).
        assert_eq!(t.look_ahead, 1.0);
        let shapes: Vec<Vec<usize>> = t.model.shapes().into_iter().map(|(_, s)| s).collect();
        let layout = crate::compress::Layout::new(&shapes, &t.compress);
        let payload = crate::wire::payload_len(&layout);
        let ratio = (4 * t.model.num_params()) as f64 / payload as f64;
        assert!(
            ratio >= 1000.0,
            "{payload} bytes: {ratio:.0}x fewer than fp32"
        );
    }

    #[test]
    fn a_job_created_by_this_build_passes_the_check() {
        let mut s = spec();
        s.recipe_hash = hash(&for_job(&s).unwrap());
        let t = check(&s).unwrap();
        assert_eq!((t.batch, t.lr.total), (8, 30));
    }

    #[test]
    fn a_job_with_another_recipe_is_refused_with_both_hashes_named() {
        let mut s = spec();
        let mut other = for_job(&s).unwrap();
        other.compress.topk += 1;
        s.recipe_hash = hash(&other);
        let e = check(&s).unwrap_err();
        assert!(matches!(e, RecipeError::Mismatch { .. }));
        assert!(e.to_string().contains("install the Cohort version"), "{e}");
    }

    #[test]
    fn every_weight_deciding_setting_moves_the_hash_and_the_micro_batch_does_not() {
        let base = for_job(&spec()).unwrap();
        let h = hash(&base);
        let mut micro = base;
        micro.micro_batch = 1;
        assert_eq!(hash(&micro), h);
        let changes: [fn(&mut TrainConfig); 11] = [
            |t| t.compress.max_chunk /= 2,
            |t| t.compress.topk += 1,
            |t| t.compress.decay *= 0.5,
            |t| t.compress.decode = Decode::Rms,
            |t| {
                t.compress.select = match t.compress.select {
                    Select::TopK => Select::Shared,
                    Select::Shared => Select::TopK,
                }
            },
            |t| t.lr.base *= 2.0,
            |t| t.lr.warmup += 1,
            |t| t.weight_decay = 0.1,
            |t| t.adaptive_beta2 = 0.99,
            |t| t.look_ahead = 0.5,
            |t| t.batch += 1,
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut t = base;
            change(&mut t);
            assert_ne!(hash(&t), h, "change {i} left the hash alone");
        }
    }

    #[test]
    fn a_model_hash_that_does_not_match_the_architecture_is_refused() {
        let mut s = spec();
        s.model_hash = [1; 32];
        assert!(matches!(for_job(&s), Err(RecipeError::ModelHash(_))));
    }
}
