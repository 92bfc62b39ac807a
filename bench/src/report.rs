//! Where benchmark figures go: `docs/bench/<name>.json` (flat keys: numbers
//! and settings) and the bench's own section of `docs/benchmarks.md`.

use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

/// The checkout the figures belong to: `COHORT_REPO_ROOT` where the binary
/// runs away from the tree it was built in (a carried build on a GPU
/// machine), else the tree it was built from.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("COHORT_REPO_ROOT") {
        Some(root) => PathBuf::from(root),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// A flat JSON object, keys in insertion order.
#[derive(Default)]
pub struct Figures {
    entries: Vec<(String, String)>,
}

impl Figures {
    pub fn num(&mut self, key: &str, v: f64) -> &mut Self {
        let s = if v.is_finite() {
            format!("{v}")
        } else {
            "null".into()
        };
        self.entries.push((key.into(), s));
        self
    }
    pub fn text(&mut self, key: &str, v: &str) -> &mut Self {
        self.entries.push((key.into(), format!("{v:?}")));
        self
    }
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\n");
        for (i, (k, v)) in self.entries.iter().enumerate() {
            let comma = if i + 1 < self.entries.len() { "," } else { "" };
            let _ = writeln!(s, "  {k:?}: {v}{comma}");
        }
        s.push_str("}\n");
        s
    }
}

/// The commit the figures come from, `-dirty` when tracked files other
/// than the published figures differ from it. A copy without git history
/// (a carried build) is stamped from `COHORT_COMMIT`, as its caller knows it.
pub fn commit() -> String {
    if let Ok(c) = std::env::var("COHORT_COMMIT") {
        return c;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(repo_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":!docs",
    ])
    .is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

/// The command line that produced the figures, as a person would type it.
pub fn command() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("cargo run --release -p cohort-bench -- {}", args.join(" "))
}

/// Writes the JSON and replaces this bench's section of docs/benchmarks.md
/// (between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`), appending it
/// the first time.
pub fn publish(name: &str, figures: &Figures, markdown: &str) -> Result<()> {
    let root = repo_root();
    let dir = root.join("docs/bench");
    std::fs::create_dir_all(&dir)?;
    let json = dir.join(format!("{name}.json"));
    let (commit, command) = (commit(), command());
    let mut stamped = Figures {
        entries: figures.entries.clone(),
    };
    stamped.text("commit", &commit).text("command", &command);
    std::fs::write(&json, stamped.to_json())
        .with_context(|| format!("writing {}", json.display()))?;
    let md_path = root.join("docs/benchmarks.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_else(|_| "# Benchmarks\n\nEvery figure here is written by `cargo run --release -p cohort-bench -- <name>`; the raw numbers are in `docs/bench/<name>.json`.\n".into());
    let (open, close) = (
        format!("<!-- bench:{name} -->"),
        format!("<!-- /bench:{name} -->"),
    );
    let section = format!(
        "{open}\n{}\n\n<sub>Written by `{command}` at commit `{}{}`.</sub>\n{close}",
        markdown.trim_end(),
        &commit[..commit.len().min(12)],
        if commit.ends_with("-dirty") {
            "-dirty"
        } else {
            ""
        }
    );
    let updated = match (md.find(&open), md.find(&close)) {
        (Some(a), Some(b)) if b > a => format!("{}{}{}", &md[..a], section, &md[b + close.len()..]),
        _ => format!("{}\n{}\n", md.trim_end(), section),
    };
    std::fs::write(&md_path, updated).with_context(|| format!("writing {}", md_path.display()))?;
    println!("\nwrote {} and docs/benchmarks.md", json.display());
    Ok(())
}

/// Mean, min and max of repeated measurements.
pub fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, min, max)
}

pub fn fmt_bytes(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.2} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}
