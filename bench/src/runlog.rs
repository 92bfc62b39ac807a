//! Append-only JSON-lines logs of finished bench runs: a sweep takes hours
//! on a small machine, so each run is kept the moment it ends and the same
//! command resumes one cut short (on any machine: the logs are committed).

use anyhow::{Context, Result};
use serde_json::Value;
use std::io::Write;
use std::path::Path;

/// Every JSON line of the log (none if it does not exist yet). A line cut
/// short by a crash is skipped with a message.
pub fn load(path: &Path) -> Result<Vec<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(v) => out.push(v),
            Err(_) if line.trim().is_empty() => {}
            Err(_) => eprintln!("{}:{}: not a run record, skipped", path.display(), i + 1),
        }
    }
    Ok(out)
}

/// Appends one line, flushed to disk before the next run starts.
pub fn append(path: &Path, line: &Value) -> Result<()> {
    // A line cut short by a crash must not swallow this one.
    let torn = std::fs::read(path)
        .ok()
        .is_some_and(|b| b.last().is_some_and(|c| *c != b'\n'));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // One write of the whole line: with the file opened for appending, a
    // line from another process sharing the sweep (`--part`) cannot land
    // inside it.
    let text = if torn {
        format!("\n{line}\n")
    } else {
        format!("{line}\n")
    };
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    Ok(())
}
