//! Member processes on loopback, for the benches that spawn them: the ports
//! they listen on, the members each one dials, and reading their JSON lines.

use anyhow::{Context, Result};
use cohort_engine::net::peer::local_member;
use cohort_engine::net::swarm::peer_id;
use std::process::Command;

/// `n` loopback ports free at the time of asking.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let n = u16::try_from(n).context("too many members for one host")?;
    let base = cohort_engine::net::ports::free_base(n).context("picking loopback ports")?;
    Ok((base..base + n).collect())
}

/// Has member `me` dial every other member at its port.
pub fn dial_others(c: &mut Command, ports: &[u16], me: usize) -> Result<()> {
    for (j, p) in ports.iter().enumerate() {
        if j != me {
            let id = peer_id(&local_member(j).1).context("member key")?;
            c.args(["--peer", &format!("/ip4/127.0.0.1/tcp/{p}/p2p/{id}")]);
        }
    }
    Ok(())
}

/// The value of `key` in one of a member's JSON lines, quotes stripped.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = line[start..].trim_start_matches('"');
    let end = rest.find(['"', ',', '}']).unwrap_or(rest.len());
    Some(&rest[..end])
}
