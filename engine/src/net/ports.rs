//! Loopback ports for local jobs and tests, picked outside the range the
//! kernel hands out as source ports of outgoing connections. A port from
//! that range can be taken by any outgoing connection while its member is
//! down, and the member then cannot listen on it when it restarts (the e2e
//! restart test failed so: "cannot listen on /ip4/127.0.0.1/tcp/45463").

use std::io;
use std::net::TcpListener;
use std::time::{SystemTime, UNIX_EPOCH};

/// Ports below this are left alone (well-known and registered services).
const LOWEST: u16 = 10_000;

/// The kernel's source-port range for outgoing connections (Linux's
/// default where it cannot be read).
fn ephemeral() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|x| x.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

/// The first ports of the windows of `n` consecutive ports outside the
/// range `(lo, hi)`: below it from [`LOWEST`], then above it.
fn windows(n: u16, (lo, hi): (u16, u16)) -> Vec<std::ops::Range<u32>> {
    let n = u32::from(n.max(1));
    let mut out = Vec::new();
    let below = (u32::from(LOWEST), u32::from(lo).saturating_sub(n - 1));
    if below.0 < below.1 {
        out.push(below.0..below.1);
    }
    let above = (u32::from(hi) + 1, 65_536u32.saturating_sub(n - 1));
    if above.0 < above.1 {
        out.push(above.0..above.1);
    }
    out
}

/// `n` consecutive loopback ports free now, outside the ephemeral range,
/// at a place drawn from the clock and the process id so that tests
/// running at once rarely try the same ones.
pub fn free_base(n: u16) -> io::Result<u16> {
    let windows = windows(n, ephemeral());
    let total: u32 = windows.iter().map(|w| w.end - w.start).sum();
    if total == 0 {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("no room for {n} ports outside the ephemeral range"),
        ));
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(nanos) ^ (u64::from(std::process::id()) << 32) | 1;
    for _ in 0..200 {
        // xorshift: any spread will do.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut k = (x % u64::from(total)) as u32;
        let base = windows
            .iter()
            .find_map(|w| {
                if k < w.end - w.start {
                    Some(w.start + k)
                } else {
                    k -= w.end - w.start;
                    None
                }
            })
            .expect("k is below the total");
        let base = base as u16;
        if (0..n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return Ok(base);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no {n} consecutive free loopback ports outside the ephemeral range"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_picked_outside_the_ephemeral_range_and_are_free() {
        let (lo, hi) = ephemeral();
        for _ in 0..20 {
            let base = free_base(4).unwrap();
            for p in base..base + 4 {
                assert!(p >= LOWEST && !(lo..=hi).contains(&p), "{p} in {lo}..={hi}");
            }
            assert!(TcpListener::bind(("127.0.0.1", base + 3)).is_ok());
        }
    }

    #[test]
    fn the_windows_leave_room_for_the_whole_run_of_ports() {
        assert_eq!(
            windows(4, (32_768, 60_999)),
            vec![10_000..32_765, 61_000..65_533]
        );
        assert_eq!(
            windows(1, (10_000, 65_535)),
            Vec::<std::ops::Range<u32>>::new()
        );
    }
}
