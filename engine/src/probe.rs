//! A quick CPU throughput probe for a node's benchmark attestation when no
//! GPU is used: single-precision multiply-adds on all cores' worth of one
//! thread's cache-sized blocks. Compiled optimized even in dev builds (see
//! the workspace profile), so debug and release report the same figure.

use std::time::{Duration, Instant};

/// Measured fp32 GFLOPS of one thread, over about `budget`.
pub fn cpu_fp32_gflops(budget: Duration) -> f64 {
    const N: usize = 128;
    let a: Vec<f32> = (0..N * N).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..N * N).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut c = vec![0f32; N * N];
    let start = Instant::now();
    let mut rounds = 0u64;
    while rounds == 0 || start.elapsed() < budget {
        for i in 0..N {
            for k in 0..N {
                let aik = a[i * N + k];
                let row = &b[k * N..(k + 1) * N];
                let out = &mut c[i * N..(i + 1) * N];
                for (o, x) in out.iter_mut().zip(row) {
                    *o += aik * x;
                }
            }
        }
        rounds += 1;
    }
    std::hint::black_box(&c);
    let flops = 2.0 * (N * N * N) as f64 * rounds as f64;
    flops / start.elapsed().as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_reports_a_positive_rate() {
        let g = super::cpu_fp32_gflops(std::time::Duration::from_millis(20));
        assert!(g.is_finite() && g > 0.0, "{g}");
    }
}
