//! `cohort-bench convergence`: dense AdamW, dense sign-SGD and Cohort's
//! compressed updates on the same model and tokens, each tuned over the same
//! learning-rate × momentum grid, the best point of each repeated over
//! several seeds, on the one-step-stale schedule the node ships; the ratio to
//! the best-tuned AdamW reported at several horizons.

mod codebook;
mod methods;
mod runs;

use crate::args::Args;
use crate::plot;
use crate::report::{self, Figures, fmt_bytes, spread};
use anyhow::{Context, Result, bail};
use cohort_engine::compress::{Decode, Select};
use cohort_engine::data::Corpus;
use cohort_engine::model::ModelConfig;
use cohort_engine::runner::Schedule;
use cohort_engine::wire;
use methods::{Method, Point, Setting, schedule_key};
use runs::Record;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Instant;

fn list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    let v = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|e| anyhow::anyhow!("--{what} {x}: {e}"))
        })
        .collect::<Result<Vec<T>>>()?;
    if v.is_empty() {
        bail!("--{what} is empty");
    }
    Ok(v)
}

struct Plan {
    setting: Setting,
    methods: Vec<Method>,
    lrs: Vec<f32>,
    momenta: Vec<f32>,
    /// Weight decays tried besides the grid's (`Setting::weight_decay`) at
    /// each method's climbed point (`Plan::decay`).
    wds: Vec<f32>,
    grid_seeds: u32,
    seeds: u32,
    schedule: Schedule,
    reference: bool,
    /// Whether a best at the grid's learning-rate edge is climbed past it
    /// (`Plan::climb`); `--climb no` for an exploration that names its
    /// points exactly.
    climb: bool,
    /// The section and JSON it publishes: `convergence` by default, another
    /// name for a sweep in other settings (a shorter horizon, a larger batch).
    name: String,
}

/// A method's tuned point.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tuned {
    lr: f32,
    momentum: f32,
    wd: f32,
}

impl Plan {
    /// The grid `m` is tuned over: the sweep's, except that a look-ahead
    /// of the shared rule is run at the shared rule's best point only (it
    /// is tuned less than AdamW, never more).
    fn grid(&self, m: Method) -> Vec<Point> {
        if m.looks_ahead() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for &lr in &self.lrs {
            for &momentum in &self.momenta {
                for seed in 0..self.grid_seeds {
                    out.push(Point {
                        method: m,
                        lr,
                        momentum,
                        wd: self.setting.weight_decay,
                        seed,
                        schedule: self.schedule,
                    });
                }
            }
        }
        out
    }

    /// One point's runs on the grid seeds, and their mean final loss once
    /// they are all in: what the grid, the climb and the weight-decay step
    /// each compare.
    fn on_grid_seeds(
        &self,
        m: Method,
        schedule: Schedule,
        (lr, momentum, wd): (f32, f32, f32),
        done: &HashMap<String, Record>,
    ) -> (Vec<Point>, Option<f64>) {
        let points: Vec<Point> = (0..self.grid_seeds)
            .map(|seed| Point {
                method: m,
                lr,
                momentum,
                wd,
                seed,
                schedule,
            })
            .collect();
        let sum: Option<f64> = points
            .iter()
            .map(|p| {
                done.get(&runs::key(&self.setting, p))
                    .map(|r| r.final_val_loss)
            })
            .sum();
        (points, sum.map(|s| s / self.grid_seeds as f64))
    }

    /// The grid point with the lowest mean final loss over the grid seeds,
    /// once every run of the grid is in.
    fn best(&self, m: Method, done: &HashMap<String, Record>) -> Option<(f32, f32)> {
        if m.looks_ahead() {
            return self.best(Method::Shared, done);
        }
        let mut best: Option<((f32, f32), f64)> = None;
        for &lr in &self.lrs {
            for &momentum in &self.momenta {
                let at = (lr, momentum, self.setting.weight_decay);
                let mean = self.on_grid_seeds(m, self.schedule, at, done).1?;
                if best.is_none_or(|(_, b)| mean < b) {
                    best = Some(((lr, momentum), mean));
                }
            }
        }
        best.map(|(p, _)| p)
    }

    /// The climb that finishes every method's tuning: the learning rate, at
    /// `start`'s momentum, climbed along the grid's learning rates (extended
    /// past both ends, `ladder`) from `start`'s: up while the loss falls, and
    /// down while it falls when the first step up did not lower it. Inside
    /// the grid it only reads the grid's runs; it runs more only when the
    /// best sits at the grid's edge. Returns the runs it has named so far,
    /// and its best point once it has ended (`None` while a named run is
    /// missing).
    fn climb(
        &self,
        m: Method,
        schedule: Schedule,
        (start_lr, momentum): (f32, f32),
        done: &HashMap<String, Record>,
    ) -> (Vec<Point>, Option<(f32, f32)>) {
        let mut named = Vec::new();
        let lrs = ladder(&self.lrs, self.climb);
        let start = lrs
            .iter()
            .position(|&lr| lr == start_lr)
            .expect("the climb starts on the grid");
        // The mean over the grid seeds at `lrs[i]`, naming its runs.
        let loss = |i: usize, named: &mut Vec<Point>| -> Option<f64> {
            let at = (lrs[i], momentum, self.setting.weight_decay);
            let (points, mean) = self.on_grid_seeds(m, schedule, at, done);
            named.extend(points);
            mean
        };
        let Some(at_start) = loss(start, &mut named) else {
            return (named, None);
        };
        let mut best = (start, at_start);
        let up: Vec<usize> = (start + 1..lrs.len()).collect();
        let down: Vec<usize> = (0..start).rev().collect();
        for (direction, only_if_still_at_start) in [(up, false), (down, true)] {
            if only_if_still_at_start && best.0 != start {
                break;
            }
            for i in direction {
                match loss(i, &mut named) {
                    None => return (named, None),
                    Some(l) if l < best.1 => best = (i, l),
                    Some(_) => break,
                }
            }
        }
        (named, Some((lrs[best.0], momentum)))
    }

    /// The step that ends every method's tuning: at `at` (its climbed
    /// learning rate and momentum), each of the plan's other weight decays
    /// on the grid seeds; the lowest mean loss wins, the grid's own on a
    /// tie. So a weight decay that helps one method is tried on every
    /// method, the baseline included. Returns the runs it names (the
    /// other weight decays'), and the tuned point once they are all in.
    fn decay(
        &self,
        m: Method,
        schedule: Schedule,
        (lr, momentum): (f32, f32),
        done: &HashMap<String, Record>,
    ) -> (Vec<Point>, Option<Tuned>) {
        let mut named = Vec::new();
        let mut best: Option<(f32, f64)> = None;
        let mut complete = true;
        for wd in std::iter::once(self.setting.weight_decay).chain(self.wds.iter().copied()) {
            let (points, mean) = self.on_grid_seeds(m, schedule, (lr, momentum, wd), done);
            // The grid's weight decay is the climb's end, named there.
            if wd != self.setting.weight_decay {
                named.extend(points);
            }
            match mean {
                Some(mean) if best.is_none_or(|(_, b)| mean < b) => best = Some((wd, mean)),
                Some(_) => {}
                None => complete = false,
            }
        }
        let tuned = best
            .filter(|_| complete)
            .map(|(wd, _)| Tuned { lr, momentum, wd });
        (named, tuned)
    }

    /// `m`'s tuned point: its best on the grid, climbed past the grid's
    /// edge when it sits there (`climb`), then its weight decay (`decay`);
    /// a look-ahead runs at the shared rule's.
    fn tuned(&self, m: Method, done: &HashMap<String, Record>) -> (Vec<Point>, Option<Tuned>) {
        if m.looks_ahead() {
            return (Vec::new(), self.tuned(Method::Shared, done).1);
        }
        let Some(best) = self.best(m, done) else {
            return (Vec::new(), None);
        };
        self.climbed(m, self.schedule, best, done)
    }

    /// The climb from `start` on `schedule`, then the weight-decay step
    /// at its end.
    fn climbed(
        &self,
        m: Method,
        schedule: Schedule,
        start: (f32, f32),
        done: &HashMap<String, Record>,
    ) -> (Vec<Point>, Option<Tuned>) {
        let (mut named, climbed) = self.climb(m, schedule, start, done);
        let Some(at) = climbed else {
            return (named, None);
        };
        let (decays, tuned) = self.decay(m, schedule, at, done);
        named.extend(decays);
        (named, tuned)
    }

    /// The lock-step AdamW reference's tuning: the climb on the lock-step
    /// schedule from AdamW's tuned point on the sweep's, whose β1 it keeps,
    /// then its own weight-decay step. So the baseline is tuned by
    /// learning rate and weight decay as far as every method.
    fn reference(&self, done: &HashMap<String, Record>) -> (Vec<Point>, Option<Tuned>) {
        match self.tuned(Method::AdamW, done).1 {
            Some(t) => self.climbed(Method::AdamW, Schedule::Lockstep, (t.lr, t.momentum), done),
            None => (Vec::new(), None),
        }
    }

    fn seeded(&self, m: Method, t: Tuned, schedule: Schedule) -> Vec<Point> {
        (0..self.seeds)
            .map(|seed| Point {
                method: m,
                lr: t.lr,
                momentum: t.momentum,
                wd: t.wd,
                seed,
                schedule,
            })
            .collect()
    }

    /// Every run the sweep needs that can be named now: the whole grid, the
    /// climbs past its edges and the weight-decay steps, then the seeds of
    /// each method's tuned point once those are in; `false`
    /// while some grid is still incomplete (more runs will be named later).
    fn runs(&self, done: &HashMap<String, Record>) -> (Vec<Point>, bool) {
        let mut out = Vec::new();
        let mut complete = true;
        for &m in &self.methods {
            out.extend(self.grid(m));
            let (climb, tuned) = self.tuned(m, done);
            out.extend(climb);
            match tuned {
                Some(best) => {
                    out.extend(self.seeded(m, best, self.schedule));
                    if self.reference && m == Method::AdamW && self.schedule != Schedule::Lockstep {
                        let (climb, tuned) = self.reference(done);
                        out.extend(climb);
                        match tuned {
                            Some(tuned) => out.extend(self.seeded(m, tuned, Schedule::Lockstep)),
                            None => complete = false,
                        }
                    }
                }
                None => complete = false,
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|p| seen.insert(runs::key(&self.setting, p)));
        (out, complete)
    }
}

pub fn run(raw: &[String]) -> Result<()> {
    let args = Args::parse(
        raw,
        &[
            "steps",
            "members",
            "arch",
            "batch",
            "topk",
            "shared-k",
            "decode",
            "adaptive",
            "eval-windows",
            "min-lr",
            "wd",
            "wds",
            "lrs",
            "momenta",
            "grid-seeds",
            "seeds",
            "methods",
            "schedule",
            "reference",
            "max-runs",
            "part",
            "plan",
            "climb",
            "name",
        ],
    )?;
    let steps: u32 = args.get("steps", 2000)?;
    for flag in ["topk", "shared-k"] {
        let k: usize = args.get(flag, 1)?;
        if !(1..=4096).contains(&k) {
            bail!("--{flag} {k}: expected 1 to 4096 coefficients per chunk");
        }
    }
    if steps < 8 {
        bail!("--steps {steps}: at least 8");
    }
    let setting = Setting {
        model: ModelConfig::parse(&args.get("arch", "gpt l2 d128 h4 s64".to_string())?)?,
        members: args.get("members", 4)?,
        batch: args.get("batch", 8)?,
        steps,
        topk: args.get("topk", 4)?,
        shared_k: args.get("shared-k", 61)?,
        decode: match args.get("decode", "sign".to_string())?.as_str() {
            "rms" => Decode::Rms,
            "sign" => Decode::Sign,
            other => bail!("--decode {other}: expected rms or sign"),
        },
        adaptive_beta2: args.get("adaptive", 0.0)?,
        weight_decay: {
            let wd: f32 = args.get("wd", runs::WEIGHT_DECAY)?;
            if !(0.0..1.0).contains(&wd) {
                bail!("--wd {wd}: expected a decoupled weight decay, 0 to below 1");
            }
            wd
        },
        min_lr: {
            let m: f32 = args.get("min-lr", runs::MIN_LR)?;
            if !(0.0..=1.0).contains(&m) {
                bail!("--min-lr {m}: expected a share of the peak learning rate, 0 to 1");
            }
            m
        },
        eval_windows: args.get("eval-windows", 64)?,
        eval_every: steps / 8,
    };
    let plan = Plan {
        methods: list::<String>(
            &args.get("methods", {
                // The job recipe's rule joins the four when it is not the
                // shared rule itself.
                let mut m = "adamw,sign,cohort,shared".to_string();
                if Method::recipe() != Method::Shared {
                    m = format!("{m},{}", Method::recipe().key());
                }
                m
            })?,
            "methods",
        )?
        .iter()
        .map(|m| Method::parse(m))
        .collect::<Result<_>>()?,
        lrs: list(&args.get("lrs", "0.0003,0.001,0.003".to_string())?, "lrs")?,
        momenta: list(
            &args.get("momenta", "0.9,0.95,0.99".to_string())?,
            "momenta",
        )?,
        wds: {
            let raw: String = args.get("wds", "0".to_string())?;
            let wds: Vec<f32> = if raw == "none" {
                Vec::new()
            } else {
                list(&raw, "wds")?
            };
            if let Some(wd) = wds.iter().find(|w| !(0.0..1.0).contains(*w)) {
                bail!("--wds {raw}: {wd} is no decoupled weight decay, 0 to below 1");
            }
            wds.into_iter()
                .filter(|&w| w != setting.weight_decay)
                .collect()
        },
        grid_seeds: args.get("grid-seeds", 1)?,
        seeds: args.get("seeds", 3)?,
        schedule: match args.get("schedule", "stale".to_string())?.as_str() {
            "stale" => Schedule::OneStepStale,
            "lockstep" => Schedule::Lockstep,
            other => bail!("--schedule {other}: expected stale or lockstep"),
        },
        reference: args.get::<String>("reference", "yes".into())? == "yes",
        climb: args.get::<String>("climb", "yes".into())? == "yes",
        name: {
            let name: String = args.get("name", "convergence".to_string())?;
            // A file name and a section marker: only `convergence` or
            // `convergence-<letters, digits, dashes>`, so no other bench's
            // JSON or section is overwritten.
            let ok = name == "convergence"
                || name.strip_prefix("convergence-").is_some_and(|t| {
                    !t.is_empty()
                        && t.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                });
            if !ok {
                bail!("--name {name}: expected `convergence` or `convergence-<a-z 0-9 ->`");
            }
            name
        },
        setting,
    };
    if plan.methods.iter().any(|m| m.looks_ahead()) && !plan.methods.contains(&Method::Shared) {
        bail!(
            "--methods: a look-ahead (sharedlook<P>) runs at the shared rule's best point; list `shared` too"
        );
    }
    if plan.grid_seeds == 0 || plan.seeds < plan.grid_seeds {
        bail!("--grid-seeds must be at least 1 and --seeds at least --grid-seeds");
    }
    let max_runs: usize = args.get("max-runs", usize::MAX)?;
    // `--part i/n`: this process takes only the runs at positions i, i + n,
    // ... of the sweep's list, so n processes (one a core) share a sweep
    // without running the same run twice.
    let part: (usize, usize) = {
        let raw: String = args.get("part", "0/1".to_string())?;
        let parsed = raw
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
        match parsed {
            Some((i, n)) if n >= 1 && i < n => (i, n),
            _ => bail!("--part {raw}: expected i/n with 0 <= i < n"),
        }
    };
    let only_plan = args.get::<String>("plan", "no".into())? == "yes";
    let s = &plan.setting;
    println!(
        "convergence: {} ({} params), {} members x batch {} x seq {}, {} steps, schedule {}, grid lr {:?} x momentum {:?} over {} seed(s), best point over {} seeds",
        s.model.arch(),
        s.model.num_params(),
        s.members,
        s.batch,
        s.model.seq_len,
        s.steps,
        schedule_key(plan.schedule),
        plan.lrs,
        plan.momenta,
        plan.grid_seeds,
        plan.seeds
    );

    let path = runs::path();
    let mut done: HashMap<String, Record> = runs::load(&path)?
        .into_iter()
        .map(|r| (r.key.clone(), r))
        .collect();
    let corpus = Corpus::bundled()?;
    let commit = report::commit();
    let mut ran = 0;
    loop {
        if part.1 > 1 {
            // The other parts' runs, recorded since.
            for r in runs::load(&path)? {
                done.entry(r.key.clone()).or_insert(r);
            }
        }
        let (all, complete) = plan.runs(&done);
        let mine: Vec<Point> = all
            .into_iter()
            .enumerate()
            .filter(|(j, _)| j % part.1 == part.0)
            .map(|(_, p)| p)
            .collect();
        let named = mine.len();
        let mut missing: Vec<Point> = mine
            .into_iter()
            .filter(|p| !done.contains_key(&runs::key(s, p)))
            .collect();
        // Every method at one point before the next point: a sweep cut
        // short still compares the methods somewhere.
        missing.sort_by(|a, b| {
            (a.seed, a.lr, a.momentum)
                .partial_cmp(&(b.seed, b.lr, b.momentum))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let secs_per_token = |m: Method| {
            let rates: Vec<f64> = done
                .values()
                .filter(|r| r.key.contains(&format!(" method={} ", m.key())))
                .map(|r| r.tokens_per_sec)
                .collect();
            if rates.is_empty() {
                1.0 / 9000.0
            } else {
                rates.len() as f64 / rates.iter().sum::<f64>()
            }
        };
        let eta: f64 = missing
            .iter()
            .map(|p| s.tokens() * secs_per_token(p.method) * 1.1)
            .sum();
        println!(
            "{} run(s) of this sweep recorded, {} still to run{} (about {:.0} min at the rates measured so far)",
            named - missing.len(),
            missing.len(),
            if complete {
                ""
            } else {
                ", more once the grids are in"
            },
            eta / 60.0
        );
        if only_plan {
            for p in &missing {
                println!("  {}", runs::key(s, p));
            }
            return Ok(());
        }
        let Some(p) = missing.first().copied() else {
            let all_done = plan
                .runs(&done)
                .0
                .iter()
                .all(|p| done.contains_key(&runs::key(s, p)));
            if complete && all_done {
                break;
            }
            if part.1 > 1 {
                println!(
                    "part {}/{} has no run left now; the other parts' runs decide the rest (rerun without --part to publish once all are in)",
                    part.0, part.1
                );
                return Ok(());
            }
            bail!("no run left to do but the grid is incomplete: a bug");
        };
        if ran >= max_runs {
            println!("stopping after {ran} run(s) (--max-runs); rerun the same command to go on");
            return Ok(());
        }
        let key = runs::key(s, &p);
        println!("running {key}");
        let t0 = Instant::now();
        let outcome = s.run(&p, &corpus)?;
        let rec = runs::append(&path, &key, &outcome, &commit)?;
        println!(
            "  final val loss {:.4} in {:.0} s ({:.0} tokens/s)",
            rec.final_val_loss,
            t0.elapsed().as_secs_f64(),
            rec.tokens_per_sec
        );
        done.insert(key, rec);
        ran += 1;
    }
    publish(&plan, &done)
}

struct Best {
    method: Method,
    schedule: Schedule,
    lr: f32,
    momentum: f32,
    wd: f32,
    records: Vec<Record>,
}

impl Best {
    fn finals(&self) -> Vec<f64> {
        self.records.iter().map(|r| r.final_val_loss).collect()
    }
    fn mean_at(&self, step: u32) -> f64 {
        let v: Vec<f64> = self.records.iter().filter_map(|r| r.at(step)).collect();
        spread(&v).0
    }
    /// (step, mean, min, max) over the seeds, at every step all of them
    /// evaluated.
    fn curve(&self) -> Vec<(f64, f64, f64, f64)> {
        self.records[0]
            .curve
            .iter()
            .filter_map(|(step, _)| {
                let v: Vec<f64> = self.records.iter().filter_map(|r| r.at(*step)).collect();
                (v.len() == self.records.len()).then(|| {
                    let (mean, min, max) = spread(&v);
                    (*step as f64, mean, min, max)
                })
            })
            .collect()
    }
    fn rgb(&self) -> [u8; 3] {
        match (self.method, self.schedule) {
            (Method::AdamW, Schedule::OneStepStale) => [31, 119, 180],
            (Method::AdamW, Schedule::Lockstep) => [120, 120, 120],
            (Method::SignSgd, _) => [230, 120, 20],
            (Method::Cohort, _) => [44, 160, 44],
            (Method::Shared, _) => [148, 103, 189],
            (Method::TopAgg(_), _) => [140, 86, 75],
            (Method::SharedAgg { sign: false }, _) => [23, 190, 207],
            (Method::SharedAgg { sign: true }, _) => [214, 39, 40],
            (Method::SharedLook(_), _) => [188, 189, 34],
            (Method::Local(_), _) => [127, 127, 127],
            (Method::Outer(_), _) => [227, 119, 194],
            (Method::Vq { .. }, _) => [255, 127, 14],
        }
    }
    fn label(&self) -> String {
        match self.schedule {
            Schedule::Lockstep => format!("{} (lock-step reference)", self.method.label()),
            Schedule::OneStepStale => self.method.label().to_string(),
        }
    }
}

/// The learning rates a climb may take: the grid's, plus two more past each
/// end at the grid's ratio there (three when the grid has one learning rate),
/// to two significant digits. A method whose best sits at the grid's edge is
/// thereby tuned past it. Without `extend`, the grid's alone, ascending.
fn ladder(grid: &[f32], extend: bool) -> Vec<f32> {
    let mut lrs = grid.to_vec();
    lrs.sort_by(|a, b| a.total_cmp(b));
    lrs.dedup();
    if !extend {
        return lrs;
    }
    let round = |x: f32| -> f32 { format!("{x:.1e}").parse().expect("a float") };
    let (lo, hi) = (lrs[0], lrs[lrs.len() - 1]);
    let (down, up) = match lrs.len() {
        1 => (3.0, 3.0),
        n => (lrs[1] / lo, hi / lrs[n - 2]),
    };
    let below = [round(lo / down / down), round(lo / down)];
    let above = [round(hi * up), round(hi * up * up)];
    below.into_iter().chain(lrs).chain(above).collect()
}

fn publish(plan: &Plan, done: &HashMap<String, Record>) -> Result<()> {
    let s = &plan.setting;
    let get = |p: &Point| done.get(&runs::key(s, p)).cloned();
    let mut bests = Vec::new();
    for &m in &plan.methods {
        let point = plan.tuned(m, done).1.expect("the sweep is complete");
        let mut schedules = vec![plan.schedule];
        if plan.reference && m == Method::AdamW && plan.schedule != Schedule::Lockstep {
            schedules.push(Schedule::Lockstep);
        }
        for sch in schedules {
            let point = if sch == plan.schedule {
                point
            } else {
                plan.reference(done).1.expect("the sweep is complete")
            };
            bests.push(Best {
                method: m,
                schedule: sch,
                lr: point.lr,
                momentum: point.momentum,
                wd: point.wd,
                records: plan
                    .seeded(m, point, sch)
                    .iter()
                    .map(|p| get(p).expect("the sweep is complete"))
                    .collect(),
            });
        }
    }
    let Some(adamw) = bests
        .iter()
        .find(|b| b.method == Method::AdamW && b.schedule == plan.schedule)
    else {
        bail!("the report compares against AdamW: include it in --methods");
    };
    let base = spread(&adamw.finals()).0;
    // The lock-step AdamW reference (a cluster's all-reduce): the stronger
    // baseline on the same tokens, when the sweep ran it.
    let lockstep = bests
        .iter()
        .find(|b| b.method == Method::AdamW && b.schedule == Schedule::Lockstep);
    let lock_base = lockstep.map(|l| spread(&l.finals()).0);
    let horizons: Vec<u32> = [s.steps / 4, s.steps / 2, 3 * s.steps / 4, s.steps]
        .into_iter()
        .filter(|h| h % s.eval_every == 0 || *h == s.steps)
        .collect();
    let dense_bytes = 4.0 * s.model.num_params() as f64;

    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Convergence{}\n\n`cargo run --release -p cohort-bench -- convergence{}` — {} ({} parameters), {} members, batch {} x {} bytes per member per step, {} steps ({} tokens), bundled KJV corpus (validation: {} fixed held-out windows). Every method is tuned over the same grid, learning rate {:?} × momentum {:?} (AdamW's β1; the momentum decay of sign-SGD and of Cohort's members), on {} seed(s){}; its tuned point is then run on {} seeds (each seed draws other initial weights and other batches).{} Schedule: {} (each gradient is computed on the weights before the previous step's update, as the P2P node pipelines). Peak learning rate with warm-up, then cosine to {}% of it; decoupled weight decay {} on the grid and its climbs, and each method's climbed point (the lock-step reference's too) run again at {} on the grid seeds, the lower loss kept (rows \"past the grid\"; a look-ahead, *sharedlookP*, runs at the shared rule's tuned point, its weight decay included); Cohort: 64x64 DCT chunks, top-{} per chunk, decoder `{:?}`, adaptive β2 {}.\n",
        if plan.name == "convergence" {
            String::new()
        } else {
            format!(" (`--name {}`)", plan.name)
        },
        if plan.name == "convergence" {
            String::new()
        } else {
            format!(" --name {} --steps {}", plan.name, s.steps)
        },
        s.model.arch(),
        s.model.num_params(),
        s.members,
        s.batch,
        s.model.seq_len,
        s.steps,
        s.tokens(),
        s.eval_windows,
        plan.lrs,
        plan.momenta,
        plan.grid_seeds,
        if plan.climb {
            "; a best point at the grid's learning-rate edge is climbed past it at its momentum, up to two more steps of the grid's ratio, while the loss falls (rows \"past the grid\"), so no method is held at an edge"
        } else {
            " (`--climb no`: not past the grid's edges)"
        },
        plan.seeds,
        if lock_base.is_some() {
            " The lock-step AdamW reference is tuned by learning rate at AdamW's β1: climbed along the grid's learning rates (and past its edges, as above) from AdamW's tuned learning rate, up while the loss falls, and down while it falls when the first step up did not lower it, then given the weight-decay step every method gets (its runs are in the grid table)."
        } else {
            ""
        },
        if plan.schedule == Schedule::OneStepStale {
            "one step stale"
        } else {
            "lock-step"
        },
        (s.min_lr as f64 * 1e5).round() / 1e3,
        s.weight_decay,
        match plan.wds.as_slice() {
            [] => "no other (`--wds none`)".to_string(),
            wds => wds
                .iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        },
        s.topk,
        s.decode,
        s.adaptive_beta2,
    );
    let _ = write!(
        md,
        "| method | best lr | best momentum | weight decay | final val loss, mean (min–max) | ÷ AdamW on this schedule |{}{} bytes sent / member / step | compression vs fp32 | tokens/s |\n|---|---|---|---|---|---|{}---|---|---|\n",
        if lock_base.is_some() {
            " ÷ lock-step AdamW |"
        } else {
            ""
        },
        horizons
            .iter()
            .map(|h| format!(" ratio at step {h} |"))
            .collect::<String>(),
        "---|".repeat(horizons.len() + lock_base.is_some() as usize)
    );
    let mut f = Figures::default();
    f.text("arch", &s.model.arch())
        .num("params", s.model.num_params() as f64)
        .num("members", s.members as f64)
        .num("batch", s.batch as f64)
        .num("seq_len", s.model.seq_len as f64)
        .num("steps", s.steps as f64)
        .num("topk", s.topk as f64)
        .text("decode", &format!("{:?}", s.decode).to_lowercase())
        .num("adaptive_beta2", s.adaptive_beta2 as f64)
        .text("schedule", schedule_key(plan.schedule))
        .num("grid_seeds", plan.grid_seeds as f64)
        .num("seeds", plan.seeds as f64)
        .text("lrs", &format!("{:?}", plan.lrs))
        .text("momenta", &format!("{:?}", plan.momenta))
        .num("grid_weight_decay", s.weight_decay as f64)
        .text("wds", &format!("{:?}", plan.wds));
    for b in &bests {
        let (mean, min, max) = spread(&b.finals());
        let bytes = match b.method.select() {
            Some(select) => methods::wire_bytes(&s.model, select, s.k(b.method)),
            None => b.records[0].bytes_per_member_step,
        };
        let tps = spread(
            &b.records
                .iter()
                .map(|r| r.tokens_per_sec)
                .collect::<Vec<_>>(),
        )
        .0;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {mean:.4} ({min:.4}–{max:.4}) | {:.3} |{}{} {} | {:.0}x | {tps:.0} |",
            b.label(),
            b.lr,
            b.momentum,
            b.wd,
            mean / base,
            lock_base.map_or(String::new(), |l| format!(" {:.3} |", mean / l)),
            horizons
                .iter()
                .map(|h| format!(" {:.3} |", b.mean_at(*h) / adamw.mean_at(*h)))
                .collect::<String>(),
            fmt_bytes(bytes),
            dense_bytes / bytes
        );
        let k = match b.schedule {
            Schedule::Lockstep => format!("{}_lockstep", b.method.key()),
            Schedule::OneStepStale => b.method.key().to_string(),
        };
        f.num(&format!("{k}_lr"), b.lr as f64)
            .num(&format!("{k}_momentum"), b.momentum as f64)
            .num(&format!("{k}_weight_decay"), b.wd as f64)
            .num(&format!("{k}_val_loss_mean"), mean)
            .num(&format!("{k}_val_loss_min"), min)
            .num(&format!("{k}_val_loss_max"), max)
            .num(&format!("{k}_loss_ratio"), mean / base)
            .num(&format!("{k}_bytes_per_member_step"), bytes)
            .num(&format!("{k}_compression"), dense_bytes / bytes)
            .num(&format!("{k}_tokens_per_sec"), tps);
        for h in &horizons {
            f.num(
                &format!("{k}_loss_ratio_at_{h}"),
                b.mean_at(*h) / adamw.mean_at(*h),
            );
        }
        if let (Some(l), Some(lb)) = (lockstep, lock_base) {
            f.num(&format!("{k}_loss_ratio_to_lockstep_adamw"), mean / lb);
            for h in &horizons {
                f.num(
                    &format!("{k}_loss_ratio_to_lockstep_adamw_at_{h}"),
                    b.mean_at(*h) / l.mean_at(*h),
                );
            }
        }
    }
    // The goal is judged on the job recipe's rule, against the best AdamW
    // on the same tokens: the lock-step one where the sweep ran it (it
    // beats the stale one), so the goal cannot be met by weakening the
    // baseline.
    if let Some(c) = bests.iter().find(|b| b.method == Method::recipe()) {
        let mean = spread(&c.finals()).0;
        let best_adamw = lock_base.map_or(base, |l| l.min(base));
        let ratio = mean / best_adamw;
        let compression = dense_bytes / methods::wire_bytes(&s.model, Select::Shared, s.shared_k);
        // The row is judged at the weight decay its tuning chose; the job
        // recipe trains at its own (`TrainConfig::small`), said beside it.
        let recipe_wd = cohort_engine::trainer::TrainConfig::small(s.steps).weight_decay;
        f.num("goal_loss_ratio", ratio)
            .num("goal_compression", compression)
            .num("goal_weight_decay", c.wd as f64)
            .num("recipe_weight_decay", recipe_wd as f64);
        let _ = writeln!(
            md,
            "\nGoals (the issue \"Compressed training that keeps pace with AdamW\"), judged on the job recipe's rule ({}): compression ≥ 1000x — {compression:.0}x, header included ({}); mean final loss ≤ 1.05 × the best-tuned AdamW's on the same tokens{} — {ratio:.3} ({}). The row ran at weight decay {}; the job recipe trains at {recipe_wd}{}.",
            c.label(),
            if compression >= 1000.0 {
                "met"
            } else {
                "not met"
            },
            if lock_base.is_some() {
                " (the better of AdamW on this schedule and lock-step AdamW)"
            } else {
                " on this schedule"
            },
            if ratio <= 1.05 { "met" } else { "not met" },
            c.wd,
            if c.wd == recipe_wd {
                ""
            } else {
                " (not the same: the goal is not judged on the recipe as shipped)"
            },
        );
    }
    let _ = write!(
        md,
        "\nThe grid (final validation loss, mean over {} seed(s)), every method on the same points:\n\n| method | lr | momentum | weight decay | final val loss |\n|---|---|---|---|---|\n",
        plan.grid_seeds
    );
    // A climb's and weight-decay step's runs off the grid (all of them for
    // the lock-step reference), a row per learning rate and weight decay.
    let tuning_rows = |md: &mut String,
                       label: &str,
                       (named, tuned): (Vec<Point>, Option<Tuned>),
                       off_grid_only: bool| {
        let tuned = tuned.expect("complete");
        let mut points: Vec<(f32, f32)> = named
            .iter()
            .map(|p| (p.lr, p.wd))
            .filter(|&(lr, wd)| !(off_grid_only && plan.lrs.contains(&lr) && wd == s.weight_decay))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        points.dedup();
        for (lr, wd) in points {
            let v: Vec<f64> = named
                .iter()
                .filter(|p| (p.lr, p.wd) == (lr, wd))
                .map(|p| get(p).expect("complete").final_val_loss)
                .collect();
            let mean = spread(&v).0;
            let mark = if (lr, wd) == (tuned.lr, tuned.wd) {
                "**"
            } else {
                ""
            };
            let _ = writeln!(
                md,
                "| {label} | {lr} | {} | {wd} | {mark}{mean:.4}{mark} |",
                tuned.momentum
            );
        }
    };
    for &m in plan.methods.iter().filter(|m| !m.looks_ahead()) {
        let best = plan.tuned(m, done).1.expect("complete");
        for &lr in &plan.lrs {
            for &momentum in &plan.momenta {
                let v: Vec<f64> = (0..plan.grid_seeds)
                    .map(|seed| {
                        get(&Point {
                            method: m,
                            lr,
                            momentum,
                            wd: s.weight_decay,
                            seed,
                            schedule: plan.schedule,
                        })
                        .expect("complete")
                        .final_val_loss
                    })
                    .collect();
                let mean = spread(&v).0;
                let mark = if (lr, momentum, s.weight_decay) == (best.lr, best.momentum, best.wd) {
                    "**"
                } else {
                    ""
                };
                let _ = writeln!(
                    md,
                    "| {} | {lr} | {momentum} | {} | {mark}{mean:.4}{mark} |",
                    m.label(),
                    s.weight_decay
                );
            }
        }
        tuning_rows(
            &mut md,
            &format!("{} (past the grid)", m.label()),
            plan.tuned(m, done),
            true,
        );
    }
    if lock_base.is_some() {
        let label = format!("{} (lock-step reference)", Method::AdamW.label());
        tuning_rows(&mut md, &label, plan.reference(done), false);
    }
    tried(&mut md, s, plan.schedule, base, done, true);
    // The rules run on the lock-step schedule too (how much of a gap is the
    // staleness's), against the lock-step reference.
    if let Some(lock) = lock_base
        && plan.schedule != Schedule::Lockstep
    {
        tried(&mut md, s, Schedule::Lockstep, lock, done, false);
    }
    // The ratio panel divides by the best AdamW, the goal's baseline: the
    // lock-step one where the sweep ran it.
    let png = figure(&bests, &lockstep.unwrap_or(adamw).curve(), s.steps)?;
    let name = &plan.name;
    let png_path = report::repo_root().join(format!("docs/bench/{name}.png"));
    std::fs::write(&png_path, png).with_context(|| format!("writing {}", png_path.display()))?;
    let _ = writeln!(
        md,
        "\n![Validation loss of each method's best point (mean over seeds, shaded from the lowest to the highest seed) and its ratio to the best-tuned AdamW, against steps](bench/{name}.png)"
    );
    let _ = writeln!(
        md,
        "\nEvery run is kept in `docs/bench/convergence-runs.jsonl` as it ends (its validation curve, tokens/s and commit), so the same command resumes a sweep cut short."
    );
    println!("\n{md}");
    report::publish(&plan.name, &f, &md)
}

/// The fields of a run's key (`runs::key`), by name; `arch` holds spaces,
/// so it is read up to the next field.
fn key_fields(key: &str) -> HashMap<&str, &str> {
    let mut out = HashMap::new();
    let mut rest = key;
    while let Some(eq) = rest.find('=') {
        let name = &rest[..eq];
        let after = &rest[eq + 1..];
        // The value runs to the last space before the next `name=`.
        let end = after
            .find('=')
            .and_then(|next| after[..next].rfind(' '))
            .unwrap_or(after.len());
        out.insert(name.trim(), after[..end].trim());
        rest = &after[end..];
    }
    out
}

/// Every run logged at this sweep's model, members, batch, steps,
/// evaluation and schedule, whatever its method, decoder, coefficients or
/// grid point: what was tried, mean over its seeds, as a ratio to this
/// table's best AdamW. Generated from `convergence-runs.jsonl`.
fn tried(
    md: &mut String,
    s: &Setting,
    schedule: Schedule,
    adamw: f64,
    done: &HashMap<String, Record>,
    explain: bool,
) {
    let same = [
        ("recipe", runs::RECIPE.to_string()),
        ("arch", s.model.arch()),
        ("members", s.members.to_string()),
        ("batch", s.batch.to_string()),
        ("steps", s.steps.to_string()),
        ("eval", format!("{}x{}", s.eval_windows, s.eval_every)),
        ("schedule", schedule_key(schedule).to_string()),
    ];
    // group → seed → final loss: a dense method's run is logged again under
    // each Cohort setting it was compared in, with the same result.
    let mut groups: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut bytes: BTreeMap<String, f64> = BTreeMap::new();
    for r in done.values() {
        let k = key_fields(&r.key);
        if same.iter().any(|(n, v)| k.get(n) != Some(&v.as_str())) {
            continue;
        }
        let field = |n: &str| k.get(n).copied().unwrap_or("?");
        let method = field("method");
        let what = if method == "cohort" {
            format!(
                "{} (top-{}, decoder {}, adaptive β2 {})",
                method,
                field("topk"),
                field("decode"),
                field("adaptive")
            )
        } else if ["sharedk", "shared", "sharedagg", "signagg"].contains(&method)
            || method.starts_with("sharedlook")
            || method.starts_with("outer")
        {
            // The decoder in the group too: runs of one grid point under
            // another decoder must not stand in for one another's seeds.
            let decoder = match (field("decode"), field("adaptive")) {
                ("Sign", "0") => String::new(),
                (d, a) => format!(", decoder {d}, adaptive β2 {a}"),
            };
            format!(
                "{method} ({} drawn coefficients per chunk{decoder})",
                field("topk")
            )
        } else if method.starts_with("local") {
            format!(
                "{method} ({} drawn coefficients per chunk an exchange)",
                field("topk")
            )
        } else if let Some(cut) = method.strip_prefix("topagg") {
            format!(
                "topagg (top-{} payloads, votes cut to {cut} per chunk)",
                field("topk")
            )
        } else {
            method.to_string()
        };
        // A run whose learning rate ends elsewhere than the default is
        // another point of the schedule, never a seed of this one.
        let what = match k.get("minlr") {
            Some(m) => format!("{what}, cosine to {m} of the peak"),
            None => what,
        };
        let what = match field("wd") {
            wd if wd == s.weight_decay.to_string() => what,
            wd => format!("{what}, weight decay {wd}"),
        };
        let group = format!("{what} | {} | {}", field("lr"), field("momentum"));
        let engine_rule = Method::parse(method).ok().and_then(Method::select);
        let k = field("topk").parse::<usize>().ok();
        let b = match (engine_rule, k) {
            (Some(select), Some(k)) => methods::wire_bytes(&s.model, select, k),
            _ => r.bytes_per_member_step,
        };
        bytes.insert(group.clone(), b);
        groups
            .entry(group)
            .or_default()
            .insert(field("seed").to_string(), r.final_val_loss);
    }
    let mut rows: Vec<(f64, String, usize)> = groups
        .into_iter()
        .map(|(g, v)| {
            let v: Vec<f64> = v.into_values().collect();
            (spread(&v).0, g, v.len())
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let _ = write!(
        md,
        "\nWhat was tried at this horizon on the {} schedule ({} points and seeds logged at these settings, any method, decoder, coefficients or grid point; mean over its seeds, best first):\n\n| method | lr | momentum | seeds | final val loss | ÷ {} | bytes / member / step |\n|---|---|---|---|---|---|---|\n",
        match schedule {
            Schedule::Lockstep => "lock-step",
            Schedule::OneStepStale => "one-step-stale",
        },
        rows.iter().map(|r| r.2).sum::<usize>(),
        match schedule {
            Schedule::Lockstep => "the lock-step reference",
            Schedule::OneStepStale => "best AdamW above",
        }
    );
    let candidates = rows.iter().any(|r| {
        ["shared", "topagg", "signagg"]
            .iter()
            .any(|m| r.1.starts_with(m))
    });
    for (mean, g, n) in rows {
        let b = bytes.get(&g).copied().unwrap_or(f64::NAN);
        let _ = writeln!(
            md,
            "| {g} | {n} | {mean:.4} | {:.3} | {b:.0} |",
            mean / adamw
        );
    }
    if candidates && explain {
        let _ = write!(
            md,
            "\nRules beside Cohort's top-k: *shared* — the engine's shared rule (`Select::Shared`): \
             every member sends the signs of the same DCT coefficients per chunk, drawn from the \
             job and step, so a coefficient costs one bit and no index, and all members vote on \
             each (error feedback as Cohort); *sharedk* — its bench-only prototype, which gave a \
             coefficient of exactly zero no vote where the engine votes it positive; *topagg* — Cohort's payloads with the summed votes cut to the largest per chunk \
             before decoding, as a sharded exchange's aggregators would publish them (`topagg0` keeps \
             every vote and reproduces Cohort bit for bit); *signagg* — the shared rule with each \
             coefficient's summed votes cut to their sign before decoding, as a sharded exchange's \
             aggregators would publish 2-bit sign sums (*sharedagg*, the same loop keeping every \
             vote, is the shared rule bit for bit); *sharedlookP* — the shared rule through the \
             same loop with each gradient computed on the weights extrapolated by P% of the last \
             applied update (`w + P/100 · (w − w_prev)`), a guess at the weights the one-step-stale \
             gradient will be applied to, run at the shared rule's best point; the engine's \
             `TrainConfig::look_ahead` at P/100, bit for bit (a test holds it to that), and at \
             P = 100 the job recipe since recipe 3; *localH* (lock-step only) — a DiLoCo-style \
             prototype: each member takes H local AdamW steps (β1 0.9, no weight decay) from the \
             shared weights, then sends the shared rule's signs of its pseudo-gradient on H times \
             as many drawn coefficients, so the bytes a step are the shared rule's, and every node \
             takes one sign step of H × lr ÷ 3 (lr is the inner AdamW's; the momentum is the error \
             feedback's decay, per exchange); *outerB* — a prototype: the shared rule's decoded \
             signs smoothed by an outer momentum of decay B/100 that every node keeps, each step \
             moving by its sign (the momentum is the members' error-feedback decay); *vqBxS* — a \
             prototype: per chunk of at least 1,024 positions each member sends, in as many groups \
             as fit the shared rule's bits, the index and sign of the best of 2^B shared random \
             codewords of S signed DCT positions (drawn from the job and step), removing each \
             pick's projection from its momentum; the decoder sums every member's picks, \
             inverse-DCTs and takes the sign (smaller chunks keep the drawn signs); at B = 0 there \
             is one codeword a group, the same for every member, so each bit is the sign of a shared \
             random projection on S positions and the members' votes add up per projection. The bytes of \
             *sharedk*, *topagg*, *sharedagg*, *signagg*, *outerB* and *vqBxS* count \
             the payload alone, as each run logged it; Cohort's, *shared*'s and *sharedlookP*'s count one encoded \
             contribution in today's wire format (version {}), its {}-byte header included and \
             its {}-byte signature not, and the dense methods' their fp32 gradient.\n",
            wire::VERSION,
            wire::HEADER_LEN,
            wire::SIGNATURE_LEN,
        );
    }
}

/// Two panels: every best point's validation loss against steps, and its
/// ratio to the best-tuned AdamW at the same steps (the goal line at 1.05).
fn figure(bests: &[Best], adamw: &[(f64, f64, f64, f64)], steps: u32) -> Result<Vec<u8>> {
    let loss = bests
        .iter()
        .map(|b| {
            let c = b.curve();
            plot::Series {
                label: b.label(),
                rgb: b.rgb(),
                dashed: b.schedule == Schedule::Lockstep,
                points: c.iter().map(|q| (q.0, q.1)).collect(),
                band: c.iter().map(|q| (q.0, q.2, q.3)).collect(),
            }
        })
        .collect();
    let ratio = bests
        .iter()
        .map(|b| plot::Series {
            label: b.label(),
            rgb: b.rgb(),
            dashed: b.schedule == Schedule::Lockstep,
            points: b
                .curve()
                .iter()
                .filter_map(|q| {
                    let a = adamw.iter().find(|a| a.0 == q.0)?;
                    Some((q.0, q.1 / a.1))
                })
                .collect(),
            band: Vec::new(),
        })
        .collect();
    plot::render(
        &[
            plot::Panel {
                title: format!("Validation loss, best point of each method ({steps} steps)"),
                x_label: "step".into(),
                y_label: "validation loss".into(),
                series: loss,
                guides: Vec::new(),
            },
            plot::Panel {
                title: "Ratio to the best-tuned AdamW".into(),
                x_label: "step".into(),
                y_label: "loss ÷ AdamW's loss".into(),
                series: ratio,
                guides: vec![(1.05, "goal 1.05".into())],
            },
        ],
        640,
        420,
    )
}

#[cfg(test)]
mod tests {
    use super::{HashMap, Method, Plan, Point, Record, Schedule, Setting, key_fields, runs};
    use cohort_engine::compress::Decode;
    use cohort_engine::model::ModelConfig;

    fn plan() -> Plan {
        Plan {
            setting: Setting {
                model: ModelConfig::parse("gpt l2 d128 h4 s64").unwrap(),
                members: 4,
                batch: 8,
                steps: 2000,
                topk: 4,
                shared_k: 61,
                decode: Decode::Sign,
                adaptive_beta2: 0.0,
                weight_decay: 0.1,
                min_lr: 0.1,
                eval_windows: 64,
                eval_every: 250,
            },
            methods: vec![Method::AdamW],
            lrs: vec![0.003, 0.0003, 0.01, 0.001],
            momenta: vec![0.9, 0.99],
            wds: Vec::new(),
            grid_seeds: 1,
            seeds: 3,
            schedule: Schedule::OneStepStale,
            reference: true,
            climb: true,
            name: "convergence".into(),
        }
    }

    fn record(
        plan: &Plan,
        done: &mut HashMap<String, Record>,
        lr: f32,
        m: f32,
        s: Schedule,
        loss: f64,
    ) {
        record_at(plan, done, (lr, m, plan.setting.weight_decay), s, loss);
    }

    fn record_at(
        plan: &Plan,
        done: &mut HashMap<String, Record>,
        (lr, momentum, wd): (f32, f32, f32),
        s: Schedule,
        loss: f64,
    ) {
        let key = runs::key(
            &plan.setting,
            &Point {
                method: Method::AdamW,
                lr,
                momentum,
                wd,
                seed: 0,
                schedule: s,
            },
        );
        done.insert(
            key.clone(),
            Record {
                key,
                final_val_loss: loss,
                curve: Vec::new(),
                bytes_per_member_step: 0.0,
                tokens_per_sec: 0.0,
            },
        );
    }

    /// The stale grid, with its best point at lr 0.001 and β1 0.9.
    fn stale_grid(plan: &Plan) -> HashMap<String, Record> {
        let mut done = HashMap::new();
        for (lr, loss) in [(0.0003, 2.0), (0.001, 1.5), (0.003, 1.6), (0.01, 1.8)] {
            record(plan, &mut done, lr, 0.9, Schedule::OneStepStale, loss);
            record(
                plan,
                &mut done,
                lr,
                0.99,
                Schedule::OneStepStale,
                loss + 0.5,
            );
        }
        done
    }

    fn lrs(named: &[Point]) -> Vec<f32> {
        assert!(
            named
                .iter()
                .all(|p| p.schedule == Schedule::Lockstep && p.momentum == 0.9)
        );
        named.iter().map(|p| p.lr).collect()
    }

    #[test]
    fn the_lock_step_reference_climbs_up_the_learning_rates_while_the_loss_falls() {
        let plan = plan();
        let mut done = stale_grid(&plan);
        let lock = Schedule::Lockstep;
        assert_eq!(lrs(&plan.reference(&done).0), [0.001]);
        assert_eq!(plan.reference(&done).1, None);
        assert!(!plan.runs(&done).1, "the sweep waits for the climb");
        record(&plan, &mut done, 0.001, 0.9, lock, 1.40);
        assert_eq!(lrs(&plan.reference(&done).0), [0.001, 0.003]);
        record(&plan, &mut done, 0.003, 0.9, lock, 1.35);
        assert_eq!(plan.reference(&done).1, None);
        record(&plan, &mut done, 0.01, 0.9, lock, 1.30);
        // Past the grid's top, at its ratio there.
        assert_eq!(lrs(&plan.reference(&done).0), [0.001, 0.003, 0.01, 0.033]);
        record(&plan, &mut done, 0.033, 0.9, lock, 1.50);
        let (named, tuned) = plan.reference(&done);
        // A step up lowered the loss, so the climb never goes down.
        assert_eq!(lrs(&named), [0.001, 0.003, 0.01, 0.033]);
        assert_eq!(
            tuned.map(|t| (t.lr, t.momentum, t.wd)),
            Some((0.01, 0.9, 0.1))
        );
        let (runs, complete) = plan.runs(&done);
        assert!(complete);
        let seeds: Vec<u32> = runs
            .iter()
            .filter(|p| p.schedule == lock && p.lr == 0.01)
            .map(|p| p.seed)
            .collect();
        assert_eq!(
            seeds,
            [0, 1, 2],
            "the tuned point's seeds, the climb's run among them"
        );
        assert!(!runs.iter().any(|p| p.schedule == lock && p.lr == 0.0003));
    }

    #[test]
    fn a_method_whose_best_sits_at_the_grid_s_edge_is_climbed_past_it_before_its_seeds_run() {
        let plan = plan();
        let mut done = HashMap::new();
        let stale = Schedule::OneStepStale;
        for (lr, loss) in [(0.0003, 2.0), (0.001, 1.8), (0.003, 1.6), (0.01, 1.5)] {
            record(&plan, &mut done, lr, 0.9, stale, loss);
            record(&plan, &mut done, lr, 0.99, stale, loss + 0.5);
        }
        let (named, tuned) = plan.tuned(Method::AdamW, &done);
        assert_eq!(tuned, None);
        assert_eq!(
            named.last().map(|p| (p.lr, p.momentum, p.schedule)),
            Some((0.033, 0.9, stale))
        );
        let (runs, complete) = plan.runs(&done);
        assert!(!complete);
        assert!(
            !runs.iter().any(|p| p.seed > 0),
            "no seeds before the climb ends"
        );
        record(&plan, &mut done, 0.033, 0.9, stale, 1.45);
        record(&plan, &mut done, 0.11, 0.9, stale, 1.7);
        assert_eq!(
            plan.tuned(Method::AdamW, &done)
                .1
                .map(|t| (t.lr, t.momentum)),
            Some((0.033, 0.9))
        );
        let fixed = Plan {
            climb: false,
            ..super::tests::plan()
        };
        assert_eq!(
            fixed
                .tuned(Method::AdamW, &done)
                .1
                .map(|t| (t.lr, t.momentum)),
            Some((0.01, 0.9)),
            "--climb no stays on the grid"
        );
        // The lock-step reference starts from the tuned point, off the grid.
        assert_eq!(
            plan.reference(&done)
                .0
                .iter()
                .map(|p| (p.lr, p.schedule))
                .collect::<Vec<_>>(),
            [(0.033, Schedule::Lockstep)]
        );
    }

    #[test]
    fn every_method_s_climbed_point_tries_the_other_weight_decays_and_its_seeds_run_at_the_lowest()
    {
        let plan = Plan {
            wds: vec![0.0],
            ..super::tests::plan()
        };
        let mut done = stale_grid(&plan);
        let (stale, lock) = (Schedule::OneStepStale, Schedule::Lockstep);
        // The grid's best, 0.001, is inside it: the climb reads the grid
        // (0.003 is worse), then names the point at weight decay 0.
        let (named, tuned) = plan.tuned(Method::AdamW, &done);
        assert_eq!(tuned, None);
        assert_eq!(
            named.last().map(|p| (p.lr, p.momentum, p.wd, p.schedule)),
            Some((0.001, 0.9, 0.0, stale))
        );
        let (runs, complete) = plan.runs(&done);
        assert!(!complete && !runs.iter().any(|p| p.seed > 0));
        record_at(&plan, &mut done, (0.001, 0.9, 0.0), stale, 1.45);
        let t = plan.tuned(Method::AdamW, &done).1.unwrap();
        assert_eq!((t.lr, t.momentum, t.wd), (0.001, 0.9, 0.0));
        // Its seeds run at the weight decay that won.
        let (runs, _) = plan.runs(&done);
        let seeds: Vec<(u32, f32)> = runs
            .iter()
            .filter(|p| p.schedule == stale && p.lr == 0.001 && p.momentum == 0.9)
            .map(|p| (p.seed, p.wd))
            .collect();
        assert_eq!(seeds, [(0, 0.1), (0, 0.0), (1, 0.0), (2, 0.0)]);
        // The lock-step reference climbs at the grid's weight decay from
        // the tuned learning rate, then takes its own weight-decay step:
        // here the grid's wins, a tie going to it.
        record(&plan, &mut done, 0.001, 0.9, lock, 1.40);
        record(&plan, &mut done, 0.003, 0.9, lock, 1.41);
        record(&plan, &mut done, 0.0003, 0.9, lock, 1.42);
        let (named, tuned) = plan.reference(&done);
        assert_eq!(tuned, None);
        assert_eq!(
            named.last().map(|p| (p.lr, p.wd, p.schedule)),
            Some((0.001, 0.0, lock))
        );
        record_at(&plan, &mut done, (0.001, 0.9, 0.0), lock, 1.40);
        let t = plan.reference(&done).1.unwrap();
        assert_eq!((t.lr, t.wd), (0.001, 0.1));
    }

    #[test]
    fn the_reference_s_ladder_extends_the_grid_by_two_steps_of_its_ratio_past_each_end() {
        assert_eq!(
            super::ladder(&[0.003, 0.0003, 0.001], true),
            [0.000027, 0.00009, 0.0003, 0.001, 0.003, 0.009, 0.027]
        );
        assert_eq!(
            super::ladder(&[0.001], true),
            [0.00011, 0.00033, 0.001, 0.003, 0.009]
        );
    }

    #[test]
    fn the_lock_step_reference_climbs_down_when_the_first_step_up_does_not_lower_the_loss() {
        let plan = plan();
        let mut done = stale_grid(&plan);
        let lock = Schedule::Lockstep;
        record(&plan, &mut done, 0.001, 0.9, lock, 1.40);
        record(&plan, &mut done, 0.003, 0.9, lock, 1.40);
        assert_eq!(lrs(&plan.reference(&done).0), [0.001, 0.003, 0.0003]);
        record(&plan, &mut done, 0.0003, 0.9, lock, 1.39);
        // Past the grid's bottom, at its ratio there.
        assert_eq!(
            lrs(&plan.reference(&done).0),
            [0.001, 0.003, 0.0003, 0.00009]
        );
        assert_eq!(plan.reference(&done).1, None);
        record(&plan, &mut done, 0.00009, 0.9, lock, 1.39);
        assert_eq!(
            plan.reference(&done).1.map(|t| (t.lr, t.momentum)),
            Some((0.0003, 0.9)),
            "a tie ends the climb"
        );
    }

    #[test]
    fn a_run_key_splits_into_its_fields_with_the_spaced_arch_whole() {
        let k = key_fields(
            "recipe=1 arch=gpt l2 d128 h4 s64 members=4 batch=8 steps=1000 topk=4 decode=Sign adaptive=0 wd=0.1 eval=64x125 method=cohort lr=0.001 momentum=0.99 seed=0 schedule=stale",
        );
        assert_eq!(k["arch"], "gpt l2 d128 h4 s64");
        assert_eq!(k["recipe"], "1");
        assert_eq!(k["momentum"], "0.99");
        assert_eq!(k["eval"], "64x125");
        assert_eq!(k["schedule"], "stale");
        assert_eq!(k.len(), 15);
    }
}
