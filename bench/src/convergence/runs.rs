//! The sweep's finished runs, one JSON line each in
//! `docs/bench/convergence-runs.jsonl` (see [`crate::runlog`]): a rerun of
//! the same command does only the runs still missing.

use super::methods::{Outcome, Point, Setting, schedule_key};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Bump when the training math of any method changes: runs recorded under
/// another recipe are not reused. One exception, recorded: runs before
/// 2026-12-05 (commit e4a4d3c) computed gradients with burn-ndarray's SIMD
/// reciprocal (about 12 bits, chosen by buffer alignment), later ones
/// exactly: a last-bits difference in a few rows of one backward op, of
/// the kind that made those runs unrepeatable anyway, so they are kept.
pub const RECIPE: u32 = 1;

pub fn path() -> PathBuf {
    crate::report::repo_root().join("docs/bench/convergence-runs.jsonl")
}

/// Where the learning rate's cosine ends by default (a share of its
/// peak): a run at another share names it in its key (`minlr=`), so the
/// runs logged before the setting existed keep their keys.
pub const MIN_LR: f32 = 0.1;
/// The decoupled weight decay of the grid by default (in every key as
/// `wd=`, the run's own).
pub const WEIGHT_DECAY: f32 = 0.1;

/// Everything a run's result depends on, as one string.
pub fn key(s: &Setting, p: &Point) -> String {
    let mut k = format!(
        "recipe={RECIPE} arch={} members={} batch={} steps={} topk={} decode={:?} adaptive={} wd={} eval={}x{} method={} lr={} momentum={} seed={} schedule={}",
        s.model.arch(),
        s.members,
        s.batch,
        s.steps,
        s.k(p.method),
        s.decode,
        s.adaptive_beta2,
        p.wd,
        s.eval_windows,
        s.eval_every,
        p.method.key(),
        p.lr,
        p.momentum,
        p.seed,
        schedule_key(p.schedule)
    );
    if s.min_lr != MIN_LR {
        k.push_str(&format!(" minlr={}", s.min_lr));
    }
    k
}

#[derive(Debug, Clone)]
pub struct Record {
    pub key: String,
    pub final_val_loss: f64,
    pub curve: Vec<(u32, f64)>,
    pub bytes_per_member_step: f64,
    pub tokens_per_sec: f64,
}

impl Record {
    fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            key: v.get("key")?.as_str()?.to_string(),
            final_val_loss: v.get("final_val_loss")?.as_f64()?,
            curve: v
                .get("curve")?
                .as_array()?
                .iter()
                .map(|p| Some((p.get(0)?.as_u64()? as u32, p.get(1)?.as_f64()?)))
                .collect::<Option<Vec<_>>>()?,
            bytes_per_member_step: v.get("bytes_per_member_step")?.as_f64()?,
            tokens_per_sec: v.get("tokens_per_sec")?.as_f64()?,
        })
    }

    /// The validation loss measured at `step`, if the run evaluated there.
    pub fn at(&self, step: u32) -> Option<f64> {
        self.curve.iter().find(|(s, _)| *s == step).map(|(_, l)| *l)
    }
}

/// Every record in the file; a line cut short by a crash is skipped.
pub fn load(path: &Path) -> Result<Vec<Record>> {
    Ok(crate::runlog::load(path)?
        .iter()
        .filter_map(|v| {
            let r = Record::from_json(v);
            if r.is_none() {
                eprintln!(
                    "{}: a line that is not a run record, skipped",
                    path.display()
                );
            }
            r
        })
        .collect())
}

/// Appends one finished run, flushed to disk before the next one starts.
pub fn append(path: &Path, key: &str, o: &Outcome, commit: &str) -> Result<Record> {
    let line = json!({
        "key": key,
        "final_val_loss": o.final_val_loss,
        "curve": o.curve,
        "bytes_per_member_step": o.bytes_per_member_step,
        "tokens_per_sec": o.tokens_per_sec,
        "commit": commit,
    });
    crate::runlog::append(path, &line)?;
    Record::from_json(&line).context("a record that does not read back")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_run_names_its_schedule_s_end_only_when_it_is_not_the_default() {
        let mut s = crate::convergence::methods::tests::setting();
        let p = Point {
            method: crate::convergence::methods::Method::AdamW,
            lr: 0.003,
            momentum: 0.9,
            wd: 0.1,
            seed: 0,
            schedule: cohort_engine::runner::Schedule::Lockstep,
        };
        let default = key(&s, &p);
        assert!(!default.contains("minlr"), "{default}");
        assert!(default.ends_with("schedule=lockstep"), "{default}");
        s.min_lr = 0.0;
        let other = key(&s, &p);
        assert_eq!(other, format!("{default} minlr=0"));
    }

    #[test]
    fn a_record_reads_back_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("runs.jsonl");
        let o = Outcome {
            final_val_loss: 2.5,
            curve: vec![(10, 3.0), (20, 2.5)],
            bytes_per_member_step: 1258.0,
            tokens_per_sec: 9000.0,
        };
        append(&p, "k1", &o, "abc").unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"{\"key\": \"k2\", \"final_")
            .unwrap();
        append(&p, "k3", &o, "abc").unwrap();
        let got = load(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].key, "k3");
        assert_eq!(got[0].key, "k1");
        assert_eq!(got[0].at(20), Some(2.5));
        assert_eq!(got[0].at(15), None);
    }
}
