//! Update rules applied on the CPU master weights, and the baselines the
//! convergence benchmark compares against.

use crate::detmath;

/// Linear warmup then cosine decay to `min_ratio * base`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub base: f32,
    pub warmup: u32,
    pub total: u32,
    pub min_ratio: f32,
}

impl LrSchedule {
    pub fn at(&self, step: u32) -> f32 {
        if step < self.warmup {
            return self.base * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let t = ((step - self.warmup) as f32 / span as f32).min(1.0);
        let cos = (0.5 * (1.0 + detmath::cos(std::f64::consts::PI * t as f64))) as f32;
        self.base * (self.min_ratio + (1.0 - self.min_ratio) * cos)
    }
}

/// `w <- w (1 - lr wd) - lr d`, the sign-SGD step with decoupled weight decay.
pub fn sign_sgd_step(values: &mut [Vec<f32>], directions: &[Vec<f32>], lr: f32, weight_decay: f32) {
    let keep = 1.0 - lr * weight_decay;
    for (w, d) in values.iter_mut().zip(directions) {
        for (wi, di) in w.iter_mut().zip(d) {
            *wi = *wi * keep - lr * di;
        }
    }
}

/// Adam's second-moment normalization applied to an already aggregated
/// direction: `v <- b2 v + (1 - b2) d^2`, `d <- d / (sqrt(v / (1 - b2^t)) + eps)`.
pub fn adaptive_scale(dirs: &mut [Vec<f32>], v: &mut [Vec<f32>], beta2: f32, t: u32) {
    let correction = 1.0 - detmath::powi_f32(beta2, t);
    for (d, v) in dirs.iter_mut().zip(v.iter_mut()) {
        for (di, vi) in d.iter_mut().zip(v.iter_mut()) {
            *vi = beta2 * *vi + (1.0 - beta2) * *di * *di;
            *di /= (*vi / correction).sqrt() + 1e-8;
        }
    }
}

/// Dense AdamW (decoupled weight decay), the baseline optimizer.
#[derive(Debug, Clone)]
pub struct AdamW {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    t: i32,
}

impl AdamW {
    pub fn new(sizes: &[usize], weight_decay: f32) -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay,
            m: sizes.iter().map(|n| vec![0.0; *n]).collect(),
            v: sizes.iter().map(|n| vec![0.0; *n]).collect(),
            t: 0,
        }
    }

    pub fn step(&mut self, values: &mut [Vec<f32>], grads: &[Vec<f32>], lr: f32) {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t);
        let c2 = 1.0 - b2.powi(self.t);
        for p in 0..values.len() {
            let (w, g, m, v) = (&mut values[p], &grads[p], &mut self.m[p], &mut self.v[p]);
            for i in 0..w.len() {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let update = (m[i] / c1) / ((v[i] / c2).sqrt() + self.eps);
                w[i] = w[i] * (1.0 - lr * self.weight_decay) - lr * update;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays() {
        let s = LrSchedule {
            base: 1.0,
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert!((s.at(0) - 0.1).abs() < 1e-6);
        assert!((s.at(9) - 1.0).abs() < 1e-6);
        assert!((s.at(10) - 1.0).abs() < 1e-6);
        assert!((s.at(60) - 0.55).abs() < 1e-4);
        assert!((s.at(500) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn adaptive_scale_normalizes_each_coordinate() {
        let mut v = vec![vec![0.0f32; 2]];
        // A coordinate that is always 10x larger ends up with the same step size.
        for t in 1..=50 {
            let mut d = vec![vec![10.0f32, 1.0]];
            adaptive_scale(&mut d, &mut v, 0.9, t);
            assert!(
                (d[0][0] - 1.0).abs() < 1e-3 && (d[0][1] - 1.0).abs() < 1e-3,
                "{d:?}"
            );
        }
    }

    #[test]
    fn adamw_minimizes_a_quadratic() {
        let mut w = vec![vec![3.0f32, -2.0]];
        let mut opt = AdamW::new(&[2], 0.0);
        for _ in 0..500 {
            let g = vec![w[0].iter().map(|x| 2.0 * x).collect::<Vec<_>>()];
            opt.step(&mut w, &g, 0.05);
        }
        assert!(w[0].iter().all(|x| x.abs() < 0.05), "{w:?}");
    }
}
