//! The decoder-only transformer: its configuration, parameter list, CPU
//! initialization, and the forward pass on any burn backend.
//!
//! Parameters are plain flat tensors in a fixed order (no module derive): the
//! master copy lives in a [`ParamSet`] on the CPU and is uploaded each step,
//! and gradients come back in the same order.

use crate::error::EngineError;
use crate::params::ParamSet;
use burn::prelude::*;
use burn::tensor::activation::{gelu, log_softmax, softmax};

pub const VOCAB: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelConfig {
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub seq_len: usize,
}

impl ModelConfig {
    pub const fn tiny() -> Self {
        Self {
            layers: 2,
            d_model: 64,
            heads: 4,
            seq_len: 64,
        }
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        let ok = (1..=64).contains(&self.layers)
            && self.heads > 0
            && self.d_model >= self.heads
            && self.d_model.is_multiple_of(self.heads)
            && (8..=8192).contains(&self.d_model)
            && (2..=8192).contains(&self.seq_len);
        if ok {
            Ok(())
        } else {
            Err(EngineError::Config(format!(
                "{} is not a valid model",
                self.arch()
            )))
        }
    }

    /// The human-readable form stored in a job spec: `gpt l2 d64 h4 s64`.
    pub fn arch(&self) -> String {
        format!(
            "gpt l{} d{} h{} s{}",
            self.layers, self.d_model, self.heads, self.seq_len
        )
    }

    pub fn parse(arch: &str) -> Result<Self, EngineError> {
        let bad = || {
            EngineError::Config(format!(
                "`{arch}` is not of the form `gpt l<layers> d<width> h<heads> s<seq>`"
            ))
        };
        let mut words = arch.split_whitespace();
        if words.next() != Some("gpt") {
            return Err(bad());
        }
        let mut field = |prefix: char| -> Result<usize, EngineError> {
            words
                .next()
                .and_then(|w| w.strip_prefix(prefix))
                .and_then(|v| v.parse().ok())
                .ok_or_else(bad)
        };
        let cfg = Self {
            layers: field('l')?,
            d_model: field('d')?,
            heads: field('h')?,
            seq_len: field('s')?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The job spec's model hash: blake3 of the architecture string.
    pub fn config_hash(&self) -> [u8; 32] {
        *blake3::hash(self.arch().as_bytes()).as_bytes()
    }

    /// Names and shapes of every parameter, in the order used everywhere.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (d, f) = (self.d_model, 4 * self.d_model);
        let mut out = vec![
            ("tok_emb".to_string(), vec![VOCAB, d]),
            ("pos_emb".to_string(), vec![self.seq_len, d]),
        ];
        for l in 0..self.layers {
            for (n, s) in [
                ("ln1_g", vec![d]),
                ("ln1_b", vec![d]),
                ("w_qkv", vec![d, 3 * d]),
                ("b_qkv", vec![3 * d]),
                ("w_o", vec![d, d]),
                ("b_o", vec![d]),
                ("ln2_g", vec![d]),
                ("ln2_b", vec![d]),
                ("w_fc", vec![d, f]),
                ("b_fc", vec![f]),
                ("w_proj", vec![f, d]),
                ("b_proj", vec![d]),
            ] {
                out.push((format!("h{l}.{n}"), s));
            }
        }
        out.push(("lnf_g".into(), vec![d]));
        out.push(("lnf_b".into(), vec![d]));
        out.push(("w_head".into(), vec![d, VOCAB]));
        out
    }

    pub fn num_params(&self) -> usize {
        self.shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// Forward FLOPs per token (2 per multiply-add), attention included; a
    /// training step costs about three times this.
    pub fn flops_per_token(&self) -> f64 {
        let (d, l, t) = (self.d_model as f64, self.layers as f64, self.seq_len as f64);
        let matmuls = l * (3.0 * d * d + d * d + 8.0 * d * d) + d * VOCAB as f64;
        2.0 * (matmuls + l * t * d)
    }

    /// GPT-2 style initialization, drawn on the CPU from `seed` so every node
    /// starts bit-identical whatever its device.
    pub fn init(&self, seed: &[u8; 32]) -> ParamSet {
        let mut rng = Normal::new(seed);
        let resid_std = 0.02 / (2.0 * self.layers as f32).sqrt();
        let mut set = ParamSet {
            names: vec![],
            shapes: vec![],
            values: vec![],
        };
        for (name, shape) in self.shapes() {
            let n: usize = shape.iter().product();
            let short = name.rsplit('.').next().unwrap_or(&name);
            let values = match short {
                "ln1_g" | "ln2_g" | "lnf_g" => vec![1.0; n],
                s if s.starts_with("b_") || s.ends_with("_b") => vec![0.0; n],
                "w_o" | "w_proj" => (0..n).map(|_| rng.sample() * resid_std).collect(),
                "pos_emb" => (0..n).map(|_| rng.sample() * 0.01).collect(),
                _ => (0..n).map(|_| rng.sample() * 0.02).collect(),
            };
            set.names.push(name);
            set.shapes.push(shape);
            set.values.push(values);
        }
        set
    }
}

/// Standard normal samples from a blake3 stream (Box-Muller in f64).
struct Normal {
    xof: blake3::OutputReader,
    spare: Option<f32>,
}

impl Normal {
    fn new(seed: &[u8; 32]) -> Self {
        let mut h = blake3::Hasher::new_keyed(seed);
        h.update(b"cohort-init-v1");
        Self {
            xof: h.finalize_xof(),
            spare: None,
        }
    }

    fn uniform(&mut self) -> f64 {
        let mut b = [0u8; 8];
        self.xof.fill(&mut b);
        ((u64::from_le_bytes(b) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f32 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        // Initial weights decide the model hash: platform-independent maths.
        let r = (-2.0 * crate::detmath::ln(u1)).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some((r * crate::detmath::sin(th)) as f32);
        (r * crate::detmath::cos(th)) as f32
    }
}

fn layer_norm<B: Backend>(x: Tensor<B, 2>, g: Tensor<B, 1>, b: Tensor<B, 1>) -> Tensor<B, 2> {
    let d = x.dims()[1];
    let mean = x.clone().mean_dim(1);
    let centered = x - mean;
    let var = centered.clone().powf_scalar(2.0).mean_dim(1);
    let normed = centered / (var + 1e-5).sqrt();
    normed * g.reshape([1, d]) + b.reshape([1, d])
}

/// Mean next-byte cross-entropy of `targets` given `inputs`, both `[batch, t]`
/// row-major bytes with `t <= seq_len`. `params` are the flat tensors in
/// [`ModelConfig::shapes`] order.
pub fn loss<B: Backend>(
    cfg: &ModelConfig,
    params: &[Tensor<B, 1>],
    inputs: &[u8],
    targets: &[u8],
    batch: usize,
    device: &B::Device,
) -> Tensor<B, 1> {
    let t = inputs.len() / batch;
    let (d, h) = (cfg.d_model, cfg.heads);
    let hd = d / h;
    let n = batch * t;
    let p = |i: usize| params[i].clone();
    let ids: Vec<i64> = inputs.iter().map(|b| *b as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, t]), device);
    let tok = burn::tensor::module::embedding(p(0).reshape([VOCAB, d]), ids);
    let pos = p(1)
        .reshape([cfg.seq_len, d])
        .narrow(0, 0, t)
        .reshape([1, t, d]);
    let mut x: Tensor<B, 2> = (tok + pos).reshape([n, d]);
    let mask = Tensor::<B, 2, Bool>::tril_mask([t, t], 0, device).reshape([1, 1, t, t]);
    let scale = 1.0 / (hd as f32).sqrt();
    for l in 0..cfg.layers {
        let o = 2 + 12 * l;
        let a = layer_norm(x.clone(), p(o), p(o + 1));
        let qkv = a.matmul(p(o + 2).reshape([d, 3 * d])) + p(o + 3).reshape([1, 3 * d]);
        let heads = |k: usize| {
            qkv.clone()
                .narrow(1, k * d, d)
                .reshape([batch, t, h, hd])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(scale)
            .mask_fill(mask.clone(), -1e9);
        let ctx = softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([n, d]);
        x = x + ctx.matmul(p(o + 4).reshape([d, d])) + p(o + 5).reshape([1, d]);
        let a = layer_norm(x.clone(), p(o + 6), p(o + 7));
        let f = gelu(a.matmul(p(o + 8).reshape([d, 4 * d])) + p(o + 9).reshape([1, 4 * d]));
        x = x + f.matmul(p(o + 10).reshape([4 * d, d])) + p(o + 11).reshape([1, d]);
    }
    let o = 2 + 12 * cfg.layers;
    let x = layer_norm(x, p(o), p(o + 1));
    let logits = x.matmul(p(o + 2).reshape([d, VOCAB]));
    let tg: Vec<i64> = targets.iter().map(|b| *b as i64).collect();
    let tg = Tensor::<B, 2, Int>::from_data(TensorData::new(tg, [n, 1]), device);
    log_softmax(logits, 1).gather(1, tg).mean().neg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_strings_round_trip_and_bad_ones_are_clear() {
        let c = ModelConfig {
            layers: 4,
            d_model: 256,
            heads: 8,
            seq_len: 128,
        };
        assert_eq!(ModelConfig::parse(&c.arch()).unwrap(), c);
        let e = ModelConfig::parse("gpt l4 d250 h8 s128")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a valid model"), "{e}");
        assert!(ModelConfig::parse("llama 7b").is_err());
    }

    #[test]
    fn init_is_deterministic_and_shaped() {
        let c = ModelConfig::tiny();
        let a = c.init(&[1; 32]);
        assert_eq!(a.model_hash(), c.init(&[1; 32]).model_hash());
        assert_ne!(a.model_hash(), c.init(&[2; 32]).model_hash());
        assert_eq!(a.numel(), c.num_params());
        let std = {
            let w = &a.values[0];
            (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt()
        };
        assert!((std - 0.02).abs() < 0.002, "{std}");
    }
}
