//! DeMo/DisTrO-style compression: momentum with decay, DCT over fixed chunks,
//! k coefficients per chunk sent as 1-bit signs (the member's own top-k with
//! their indices, or the step's shared draw with no indices), error feedback;
//! and the decoder that turns members' sparse signs into one update direction.

use crate::dct::{Dct, Tiling};
use crate::error::EngineError;
use rayon::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressConfig {
    /// Largest chunk side; 64 gives the 64 x 64 chunks of DisTrO.
    pub max_chunk: usize,
    /// Coefficients kept per chunk.
    pub topk: usize,
    /// Momentum decay (beta).
    pub decay: f32,
    /// How the summed votes become an update direction.
    pub decode: Decode,
    /// Which `topk` coefficients per chunk a member sends.
    pub select: Select,
}

/// Which coefficients of a chunk a member sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    /// Its own k largest (DeMo/DisTrO): each sign travels with its index,
    /// and members seldom pick the same coefficient.
    TopK,
    /// The k the step's [`Draw`] names, the same on every member: only the
    /// signs travel (1 bit per coefficient, no indices), and every member
    /// votes on every sent coefficient.
    Shared,
}

/// The seed of a step's shared coefficient draw ([`Select::Shared`]): a
/// hash of the job and the step, so every member draws the same positions
/// and nobody chooses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw(pub u64);

impl Draw {
    pub fn for_step(job: &[u8; 32], step: u32) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"cohort-draw");
        h.update(job);
        h.update(&step.to_le_bytes());
        let b = h.finalize();
        Draw(u64::from_le_bytes(
            b.as_bytes()[..8].try_into().expect("8 bytes"),
        ))
    }

    /// The `k` coefficients of chunk `ch` of parameter `p` (of `size`),
    /// ascending, into `out`: a partial Fisher–Yates shuffle driven by
    /// SplitMix64, written out here because every node must draw the very
    /// same positions whatever crate versions it was built with.
    pub fn positions(self, p: usize, ch: usize, size: usize, k: usize, out: &mut Vec<u16>) {
        out.clear();
        out.extend(0..size as u16);
        let mut state = self.0 ^ ((p as u64) << 40) ^ (ch as u64);
        for i in 0..k.min(size) {
            let j = i + (splitmix_next(&mut state) % (size - i) as u64) as usize;
            out.swap(i, j);
        }
        out.truncate(k.min(size));
        out.sort_unstable();
    }
}

impl Draw {
    /// Shuffles `items` by this draw (Fisher–Yates on SplitMix64, salted
    /// apart from [`Draw::positions`]): the same order on every node.
    pub fn shuffle<T>(self, items: &mut [T]) {
        let mut state = self.0 ^ 0x5348_4152_4453_0000;
        for i in (1..items.len()).rev() {
            let j = (splitmix_next(&mut state) % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// SplitMix64's next value: the generator behind [`Draw`], written out so
/// every node draws the same numbers whatever its crate versions.
pub fn splitmix_next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The decoder's last stage, after the inverse DCT of the summed signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decode {
    /// `sign(x)`: every coordinate moves by the learning rate (DisTrO/DeMo).
    Sign,
    /// `x / rms(x)` per parameter: coordinates move in proportion to how
    /// strongly the members' votes agree there, with the same overall scale.
    Rms,
}

impl CompressConfig {
    /// The rule a job trains with ([`crate::trainer::TrainConfig::small`]):
    /// the signs of 61 drawn positions per 64 x 64 chunk and momentum decay
    /// 0.99. On the bench's model it reached 0.95x the loss of AdamW on the
    /// node's one-step-stale schedule at 2,000 steps (1.07x lock-step AdamW's
    /// at the same point, more against lock-step AdamW tuned by learning
    /// rate), at about 1,100x fewer bytes than fp32, where the top-k rule
    /// stayed at 1.2x (`cohort-bench convergence`, docs/benchmarks.md). 61
    /// signs cost about the bytes of the top-4 rule's 4 indexed signs.
    pub fn shared() -> Self {
        Self {
            topk: 61,
            decay: 0.99,
            select: Select::Shared,
            ..Self::default()
        }
    }
}

/// The top-k rule (DeMo/DisTrO): each member's 4 largest per chunk. The
/// building block's default; a job's recipe uses [`CompressConfig::shared`].
impl Default for CompressConfig {
    fn default() -> Self {
        Self {
            max_chunk: 64,
            topk: 4,
            // Recipe 1's decay, tuned at 300 steps. At 2,000 steps the top-k
            // rule did better at 0.99 (docs/benchmarks.md); Psyche runs 0.995.
            decay: 0.9,
            decode: Decode::Sign,
            select: Select::TopK,
        }
    }
}

/// The chunking of every parameter, shared by encoder, decoder and wire format.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dcts: Vec<Dct>,
    pub topk: Vec<usize>,
    pub select: Select,
}

impl Layout {
    pub fn new(shapes: &[Vec<usize>], cfg: &CompressConfig) -> Self {
        let dcts: Vec<Dct> = shapes
            .iter()
            .map(|s| Dct::new(Tiling::new(s, cfg.max_chunk)))
            .collect();
        let topk = dcts
            .iter()
            .map(|d| cfg.topk.min(d.tiling.chunk_size()))
            .collect();
        Self {
            dcts,
            topk,
            select: cfg.select,
        }
    }

    pub fn numel(&self, p: usize) -> usize {
        self.dcts[p].tiling.rows * self.dcts[p].tiling.cols
    }

    /// Parameter `p`'s positions under `draw`, chunk by chunk, `topk[p]`
    /// ascending per chunk: what every member sends at that step under
    /// [`Select::Shared`].
    pub fn drawn(&self, p: usize, draw: Draw) -> Vec<u16> {
        let (k, t) = (self.topk[p], &self.dcts[p].tiling);
        let mut out = Vec::with_capacity(t.chunks() * k);
        let mut one = Vec::new();
        for ch in 0..t.chunks() {
            draw.positions(p, ch, t.chunk_size(), k, &mut one);
            out.extend_from_slice(&one);
        }
        out
    }

    pub fn total_numel(&self) -> usize {
        (0..self.dcts.len()).map(|p| self.numel(p)).sum()
    }
}

/// One parameter's kept coefficients: `k` per chunk, chunk-major, indices
/// strictly ascending within a chunk (canonical, so nobody can vote twice
/// for one coefficient).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SparseSigns {
    pub idx: Vec<u16>,
    /// true = negative.
    pub neg: Vec<bool>,
}

/// A member's compressed update for one step: one `SparseSigns` per parameter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Payload {
    pub params: Vec<SparseSigns>,
}

impl Payload {
    /// Checks the payload fits `layout`: counts, index range, canonical order.
    pub fn validate(&self, layout: &Layout) -> Result<(), EngineError> {
        if self.params.len() != layout.dcts.len() {
            return Err(EngineError::Shape(format!(
                "payload has {} parameters, model has {}",
                self.params.len(),
                layout.dcts.len()
            )));
        }
        for (p, s) in self.params.iter().enumerate() {
            let (k, t) = (layout.topk[p], &layout.dcts[p].tiling);
            let want = t.chunks() * k;
            if s.idx.len() != want || s.neg.len() != want {
                return Err(EngineError::Shape(format!(
                    "parameter {p}: {} entries, expected {want}",
                    s.idx.len()
                )));
            }
            for chunk in s.idx.chunks(k) {
                if chunk.iter().any(|&i| i as usize >= t.chunk_size())
                    || chunk.windows(2).any(|w| w[0] >= w[1])
                {
                    return Err(EngineError::Shape(format!(
                        "parameter {p}: indices out of range or not ascending"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Payload {
    /// Under [`Select::Shared`], checks every parameter sends exactly the
    /// positions `draw` names (a payload built elsewhere than the wire
    /// decoder, which fills them in itself, could name others).
    pub fn check_drawn(&self, layout: &Layout, draw: Draw) -> Result<(), EngineError> {
        if layout.select != Select::Shared {
            return Ok(());
        }
        for (p, s) in self.params.iter().enumerate() {
            if s.idx != layout.drawn(p, draw) {
                return Err(EngineError::Shape(format!(
                    "parameter {p}: not the step's drawn coefficients"
                )));
            }
        }
        Ok(())
    }

    /// The payload a receiver decodes from the one a forger meant: under
    /// [`Select::Shared`] only signs travel, one per drawn position, so each
    /// drawn position gets the sign the forger gave it, or, where it named
    /// another position, the sign in the same slot. An in-process run (the
    /// arena) passes forged payloads through this, as the wire would.
    pub fn as_sent(mut self, layout: &Layout, draw: Draw) -> Payload {
        if layout.select != Select::Shared || self.validate(layout).is_err() {
            return self;
        }
        for (p, s) in self.params.iter_mut().enumerate() {
            let (k, drawn) = (layout.topk[p], layout.drawn(p, draw));
            let neg = drawn
                .chunks(k)
                .zip(s.idx.chunks(k).zip(s.neg.chunks(k)))
                .flat_map(|(want, (named, signs))| {
                    want.iter()
                        .enumerate()
                        .map(|(slot, i)| signs[named.binary_search(i).unwrap_or(slot)])
                })
                .collect();
            *s = SparseSigns { idx: drawn, neg };
        }
        self
    }
}

/// A member's compressor state: its momentum, which keeps what was not sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Compressor {
    pub cfg: CompressConfig,
    pub momentum: Vec<Vec<f32>>,
}

impl Compressor {
    pub fn new(layout: &Layout, cfg: CompressConfig) -> Self {
        Self {
            cfg,
            momentum: (0..layout.dcts.len())
                .map(|p| vec![0.0; layout.numel(p)])
                .collect(),
        }
    }

    /// Folds `grads` into the momentum and extracts k DCT components per
    /// chunk (its top-k, or the ones `draw` names under [`Select::Shared`]),
    /// removing them from the momentum (error feedback). Non-finite gradients
    /// are refused before anything changes.
    pub fn compress(
        &mut self,
        layout: &Layout,
        grads: &[Vec<f32>],
        draw: Draw,
    ) -> Result<Payload, EngineError> {
        if grads.len() != self.momentum.len() {
            return Err(EngineError::Shape(format!(
                "{} gradients for {} parameters",
                grads.len(),
                self.momentum.len()
            )));
        }
        for (p, g) in grads.iter().enumerate() {
            if g.len() != self.momentum[p].len() {
                return Err(EngineError::Shape(format!(
                    "gradient {p} has {} values, expected {}",
                    g.len(),
                    self.momentum[p].len()
                )));
            }
            if g.iter().any(|v| !v.is_finite()) {
                return Err(EngineError::NonFinite(format!("gradient of parameter {p}")));
            }
        }
        let decay = self.cfg.decay;
        // Parameters are independent: compress them in parallel. Each one's
        // arithmetic is sequential, so the result does not depend on threads.
        let params = grads
            .par_iter()
            .zip(self.momentum.par_iter_mut())
            .enumerate()
            .map(|(p, (g, m))| {
                let drawn = match layout.select {
                    Select::TopK => None,
                    Select::Shared => Some(layout.drawn(p, draw)),
                };
                compress_param(
                    &layout.dcts[p],
                    layout.topk[p],
                    decay,
                    m,
                    g,
                    drawn.as_deref(),
                )
            })
            .collect();
        Ok(Payload { params })
    }
}

impl Compressor {
    /// The momentum a member holds after a step in which it folded `grads`
    /// in and sent `sent`: the coefficients `sent` names are removed, not
    /// the top-k of this fold. The witness side of a momentum chain check.
    ///
    /// Why not re-run the top-k: a coefficient near the k-th largest can
    /// rank on either side of it under another machine's rounding, and
    /// each such flip leaves a whole coefficient in one momentum and not
    /// in the other. The member's payload is public and was audited; it
    /// says which coefficients left its momentum.
    pub fn fold_and_remove(
        &mut self,
        layout: &Layout,
        grads: &[Vec<f32>],
        sent: &Payload,
    ) -> Result<(), EngineError> {
        sent.validate(layout)?;
        if grads.len() != self.momentum.len()
            || grads
                .iter()
                .zip(&self.momentum)
                .any(|(g, m)| g.len() != m.len())
        {
            return Err(EngineError::Shape(
                "gradients do not match the momentum".into(),
            ));
        }
        let decay = self.cfg.decay;
        grads
            .par_iter()
            .zip(self.momentum.par_iter_mut())
            .zip(&sent.params)
            .enumerate()
            .for_each(|(p, ((g, m), s))| {
                remove_param(&layout.dcts[p], layout.topk[p], decay, m, g, &s.idx)
            });
        Ok(())
    }
}

/// [`compress_param`]'s fold and error feedback, removing the given
/// coefficients (`k` per chunk) instead of the largest.
fn remove_param(dct: &Dct, k: usize, decay: f32, m: &mut [f32], g: &[f32], idx: &[u16]) {
    for (mi, gi) in m.iter_mut().zip(g) {
        *mi = decay * *mi + gi;
    }
    let size = dct.tiling.chunk_size();
    let mut coef = vec![0f32; size];
    let mut tmp = Vec::new();
    for (ch, kept) in idx.chunks(k).enumerate() {
        dct.forward_chunk(m, ch, &mut coef, &mut tmp);
        for &i in kept {
            dct.add_basis(m, ch, i as usize, -coef[i as usize]);
        }
    }
}

/// Momentum update, coefficient extraction (the `k` largest per chunk, or
/// the `drawn` ones) and error feedback for one parameter.
fn compress_param(
    dct: &Dct,
    k: usize,
    decay: f32,
    m: &mut [f32],
    g: &[f32],
    drawn: Option<&[u16]>,
) -> SparseSigns {
    for (mi, gi) in m.iter_mut().zip(g) {
        *mi = decay * *mi + gi;
    }
    let size = dct.tiling.chunk_size();
    let mut coef = vec![0f32; size];
    let mut tmp = Vec::new();
    let mut order: Vec<u16> = Vec::with_capacity(size);
    let mut out = SparseSigns::default();
    for ch in 0..dct.tiling.chunks() {
        dct.forward_chunk(m, ch, &mut coef, &mut tmp);
        let kept: &[u16] = match drawn {
            None => {
                order.clear();
                order.extend(0..size as u16);
                // Largest magnitude first; ties broken by index so every
                // implementation keeps the same coefficients.
                order.select_nth_unstable_by(k - 1, |&a, &b| {
                    coef[b as usize]
                        .abs()
                        .total_cmp(&coef[a as usize].abs())
                        .then(a.cmp(&b))
                });
                let kept = &mut order[..k];
                kept.sort_unstable();
                kept
            }
            Some(drawn) => &drawn[ch * k..(ch + 1) * k],
        };
        for &i in kept {
            let v = coef[i as usize];
            out.idx.push(i);
            out.neg.push(v < 0.0);
            dct.add_basis(m, ch, i as usize, -v);
        }
    }
    out
}

/// Sums members' signs per coefficient (integer votes, weighted), inverse-DCTs
/// the sparse sums and takes the sign: the update direction every node applies.
/// Integer sums make the result independent of the members' order; the basis
/// functions are added in ascending coefficient order, so it is bit-identical
/// on every node.
pub fn aggregate(
    layout: &Layout,
    contributions: &[(&Payload, i32)],
    decode: Decode,
) -> Vec<Vec<f32>> {
    // Parameters are independent, so they decode in parallel; within one,
    // the order of operations is fixed.
    layout
        .dcts
        .par_iter()
        .enumerate()
        .map(|(p, dct)| {
            let k = layout.topk[p];
            let mut x = vec![0f32; layout.numel(p)];
            let mut votes = vec![0i32; dct.tiling.chunk_size()];
            let mut touched: Vec<u16> = Vec::new();
            for ch in 0..dct.tiling.chunks() {
                touched.clear();
                for (payload, weight) in contributions {
                    let s = &payload.params[p];
                    let range = ch * k..(ch + 1) * k;
                    for (i, neg) in s.idx[range.clone()].iter().zip(&s.neg[range]) {
                        if votes[*i as usize] == 0 {
                            touched.push(*i);
                        }
                        votes[*i as usize] += if *neg { -weight } else { *weight };
                    }
                }
                touched.sort_unstable();
                touched.dedup();
                for &i in &touched {
                    let v = votes[i as usize];
                    if v != 0 {
                        dct.add_basis(&mut x, ch, i as usize, v as f32);
                    }
                    votes[i as usize] = 0;
                }
            }
            finish(&mut x, decode);
            x
        })
        .collect()
}

/// The decoder's last stage on one parameter's inverse-DCT'd votes (see
/// [`Decode`]); shared by every path that decodes votes.
pub fn finish(x: &mut [f32], decode: Decode) {
    match decode {
        Decode::Sign => {
            for v in x.iter_mut() {
                *v = if *v > 0.0 {
                    1.0
                } else if *v < 0.0 {
                    -1.0
                } else {
                    0.0
                };
            }
        }
        Decode::Rms => {
            // f64 accumulation in index order: the same bits on every node.
            let ms =
                x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / x.len().max(1) as f64;
            if ms > 0.0 {
                let inv = (1.0 / ms.sqrt()) as f32;
                x.iter_mut().for_each(|v| *v *= inv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: dense DCT of the whole chunk, sort every coefficient,
    /// keep the k largest, subtract them by a dense inverse.
    fn naive(m: &mut [f32], dct: &Dct, k: usize) -> SparseSigns {
        let size = dct.tiling.chunk_size();
        let mut out = SparseSigns::default();
        let mut coef = vec![0f32; size];
        let mut tmp = Vec::new();
        for ch in 0..dct.tiling.chunks() {
            dct.forward_chunk(m, ch, &mut coef, &mut tmp);
            let mut all: Vec<(f32, usize)> =
                coef.iter().enumerate().map(|(i, v)| (v.abs(), i)).collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut kept: Vec<usize> = all[..k].iter().map(|x| x.1).collect();
            kept.sort();
            let mut rest = coef.clone();
            for &i in &kept {
                out.idx.push(i as u16);
                out.neg.push(coef[i] < 0.0);
                rest[i] = 0.0;
            }
            dct.inverse_chunk(&rest, ch, m, &mut tmp);
        }
        out
    }

    /// Chunks of 32 coefficients, 5 kept, β = 0.9.
    fn small_chunks() -> CompressConfig {
        CompressConfig {
            max_chunk: 32,
            topk: 5,
            decay: 0.9,
            decode: Decode::Sign,
            select: Select::TopK,
        }
    }

    #[test]
    fn compressor_matches_the_naive_reference() {
        let shapes = vec![vec![128, 64], vec![64], vec![96, 40]];
        let cfg = small_chunks();
        let layout = Layout::new(&shapes, &cfg);
        let mut c = Compressor::new(&layout, cfg);
        let mut reference: Vec<Vec<f32>> = c.momentum.clone();
        for step in 0..3 {
            let grads: Vec<Vec<f32>> = (0..3)
                .map(|p| crate::dct::test_values(layout.numel(p), 10 * step + p as u64))
                .collect();
            let payload = c.compress(&layout, &grads, Draw(0)).unwrap();
            payload.validate(&layout).unwrap();
            for p in 0..3 {
                for (m, g) in reference[p].iter_mut().zip(&grads[p]) {
                    *m = 0.9 * *m + g;
                }
                let want = naive(&mut reference[p], &layout.dcts[p], layout.topk[p]);
                assert_eq!(payload.params[p], want, "step {step} param {p}");
                let err = reference[p]
                    .iter()
                    .zip(&c.momentum[p])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(err < 1e-4, "momentum drift {err}");
            }
        }
    }

    /// The chain check's replay: removing the coefficients a member sent
    /// gives its momentum bit for bit, and under another machine's rounding
    /// (here 1% noise on every gradient, far more) stays within the noise,
    /// where re-running the top-k flips coefficients near the k-th largest
    /// and leaves whole ones behind.
    #[test]
    fn removing_the_sent_coefficients_gives_the_members_momentum_and_no_rank_flips() {
        // Thousands of chunks, so some k-th and (k+1)-th coefficients lie
        // closer than the noise moves them.
        let shapes = vec![vec![512, 256], vec![96, 40]];
        let cfg = small_chunks();
        let layout = Layout::new(&shapes, &cfg);
        let grads = |seed: u64| -> Vec<Vec<f32>> {
            (0..2)
                .map(|p| crate::dct::test_values(layout.numel(p), seed + p as u64))
                .collect()
        };
        // A momentum grown over many steps: much larger than one gradient.
        let mut member = Compressor::new(&layout, cfg);
        for (p, m) in member.momentum.iter_mut().enumerate() {
            *m = crate::dct::test_values(m.len(), 100 + p as u64)
                .iter()
                .map(|v| 20.0 * v)
                .collect();
        }
        let before = member.momentum.clone();
        let g = grads(7);
        let sent = member.compress(&layout, &g, Draw(0)).unwrap();
        let mut replay = Compressor {
            cfg,
            momentum: before.clone(),
        };
        replay.fold_and_remove(&layout, &g, &sent).unwrap();
        assert_eq!(replay.momentum, member.momentum, "not bit for bit");

        let noisy: Vec<Vec<f32>> = g
            .iter()
            .enumerate()
            .map(|(p, v)| {
                let u = crate::dct::test_values(v.len(), 300 + p as u64);
                let scale = u.iter().fold(0f32, |a, x| a.max(x.abs()));
                v.iter()
                    .zip(&u)
                    .map(|(x, e)| x * (1.0 + 0.01 * e / scale))
                    .collect()
            })
            .collect();
        let mut followed = Compressor {
            cfg,
            momentum: before.clone(),
        };
        followed.fold_and_remove(&layout, &noisy, &sent).unwrap();
        let mut reranked = Compressor {
            cfg,
            momentum: before,
        };
        reranked.compress(&layout, &noisy, Draw(0)).unwrap();
        let err = |m: &[Vec<f32>]| crate::audit::chain_error(&member.momentum, m, &g);
        let (follow, rerank) = (err(&followed.momentum), err(&reranked.momentum));
        eprintln!("chain error under 1% noise: following {follow:.5}, re-ranking {rerank:.5}");
        assert!(follow < 0.02, "{follow}");
        assert!(
            rerank > 10.0 * follow,
            "re-ranking {rerank}, following {follow}"
        );
        // A payload for another model is refused.
        let mut wrong = sent.clone();
        wrong.params.pop();
        assert!(followed.fold_and_remove(&layout, &g, &wrong).is_err());
    }

    /// The shared rule's payload for `seed`'s random gradients at `step`.
    fn shared_payload(seed: u64, step: u32) -> (Layout, Payload, Compressor) {
        let cfg = CompressConfig {
            topk: 9,
            select: Select::Shared,
            ..small_chunks()
        };
        let shapes = vec![vec![128, 64], vec![7]];
        let layout = Layout::new(&shapes, &cfg);
        let mut c = Compressor::new(&layout, cfg);
        let g: Vec<Vec<f32>> = (0..2)
            .map(|p| crate::dct::test_values(layout.numel(p), seed + p as u64))
            .collect();
        let draw = Draw::for_step(&[7; 32], step);
        let payload = c.compress(&layout, &g, draw).unwrap();
        (layout, payload, c)
    }

    #[test]
    fn shared_selection_sends_the_same_drawn_positions_from_every_member_and_moves_each_step() {
        let (layout, a, _) = shared_payload(1, 5);
        let (_, b, _) = shared_payload(2, 5);
        let (_, later, _) = shared_payload(1, 6);
        a.validate(&layout).unwrap();
        for (pa, pb) in a.params.iter().zip(&b.params) {
            assert_eq!(pa.idx, pb.idx, "members draw the same positions");
        }
        assert_ne!(a.params[0].neg, b.params[0].neg, "but send their own signs");
        assert_ne!(
            a.params[0].idx, later.params[0].idx,
            "the draw moves with the step"
        );
        // A chunk smaller than k sends all of it.
        assert_eq!(a.params[1].idx, (0..7).collect::<Vec<u16>>());
        let draw = Draw::for_step(&[7; 32], 5);
        a.check_drawn(&layout, draw).unwrap();
        assert!(later.check_drawn(&layout, draw).is_err());
        let mut moved = a.clone();
        let last = moved.params[0].idx.len() - 1;
        moved.params[0].idx[last] = if moved.params[0].idx[last] == 4095 {
            4094
        } else {
            4095
        };
        assert!(
            moved.check_drawn(&layout, draw).is_err(),
            "another position is refused"
        );
    }

    #[test]
    fn shared_selection_removes_exactly_the_coefficients_it_sent() {
        let (layout, sent, c) = shared_payload(3, 9);
        // The chain check's replay from the same gradients lands on the
        // same momentum, bit for bit.
        let mut replay = Compressor::new(&layout, c.cfg);
        let g: Vec<Vec<f32>> = (0..2)
            .map(|p| crate::dct::test_values(layout.numel(p), 3 + p as u64))
            .collect();
        replay.fold_and_remove(&layout, &g, &sent).unwrap();
        assert_eq!(replay.momentum, c.momentum);
        // What was sent is gone from the momentum; the rest is kept.
        let dct = &layout.dcts[0];
        let (mut coef, mut tmp) = (vec![0f32; dct.tiling.chunk_size()], Vec::new());
        dct.forward_chunk(&c.momentum[0], 0, &mut coef, &mut tmp);
        let k = layout.topk[0];
        for &i in &sent.params[0].idx[..k] {
            assert!(coef[i as usize].abs() < 1e-4, "{}", coef[i as usize]);
        }
        assert!(coef.iter().filter(|v| v.abs() > 1e-3).count() > k);
    }

    #[test]
    fn error_feedback_keeps_what_was_not_sent() {
        let shapes = vec![vec![64, 64]];
        let cfg = CompressConfig {
            max_chunk: 64,
            topk: 4,
            decay: 1.0,
            decode: Decode::Sign,
            select: Select::TopK,
        };
        let layout = Layout::new(&shapes, &cfg);
        let mut c = Compressor::new(&layout, cfg);
        let g = vec![crate::dct::test_values(4096, 1)];
        let energy = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>();
        c.compress(&layout, &g, Draw(0)).unwrap();
        // Only 4 of 4096 coefficients left: most of the energy stays in momentum.
        let kept = energy(&c.momentum[0]) / energy(&g[0]);
        assert!(kept > 0.9 && kept < 1.0, "{kept}");
    }

    #[test]
    fn aggregate_is_order_independent_and_majority_wins() {
        let shapes = vec![vec![64, 64]];
        let cfg = CompressConfig::default();
        let layout = Layout::new(&shapes, &cfg);
        let p1 = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![false, false, true, false],
            }],
        };
        let p2 = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![false, true, true, false],
            }],
        };
        let p3 = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 5, 6, 7],
                neg: vec![true, true, true, true],
            }],
        };
        let a = aggregate(&layout, &[(&p1, 1), (&p2, 1), (&p3, 1)], Decode::Sign);
        let b = aggregate(&layout, &[(&p3, 1), (&p1, 1), (&p2, 1)], Decode::Sign);
        assert_eq!(a, b);
        assert!(a[0].iter().all(|v| [-1.0, 0.0, 1.0].contains(v)));
        // A single coefficient voted by everyone gives a pure (signed) basis function.
        let only = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![true; 4],
            }],
        };
        let d = aggregate(&layout, &[(&only, 3)], Decode::Sign);
        assert!(d[0][0] < 0.0);
        // The majority's sign wins each coefficient, by weight as by count;
        // a tie cancels.
        let up = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![false; 4],
            }],
        };
        let alone = aggregate(&layout, &[(&up, 1)], Decode::Sign);
        let flipped: Vec<f32> = alone[0].iter().map(|v| -v).collect();
        assert!(alone[0].iter().any(|v| *v != 0.0));
        let two_to_one = aggregate(&layout, &[(&up, 1), (&only, 1), (&up, 1)], Decode::Sign);
        assert_eq!(two_to_one, alone);
        let outweighed = aggregate(&layout, &[(&up, 1), (&only, 2)], Decode::Sign);
        assert_eq!(outweighed[0], flipped);
        let tie = aggregate(&layout, &[(&up, 1), (&only, 1)], Decode::Sign);
        assert!(tie[0].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn rms_decode_has_unit_scale_and_keeps_the_vote_shape() {
        let layout = Layout::new(&[vec![64, 64]], &CompressConfig::default());
        let p1 = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![false; 4],
            }],
        };
        let p2 = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 5, 6, 7],
                neg: vec![false; 4],
            }],
        };
        let d = aggregate(&layout, &[(&p1, 1), (&p2, 1)], Decode::Rms);
        let ms: f32 = d[0].iter().map(|v| v * v).sum::<f32>() / 4096.0;
        assert!((ms - 1.0).abs() < 1e-4, "{ms}");
        // Same input, same bits.
        assert_eq!(d, aggregate(&layout, &[(&p2, 1), (&p1, 1)], Decode::Rms));
        let empty = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![false, true, false, true],
            }],
        };
        let flipped = Payload {
            params: vec![SparseSigns {
                idx: vec![0, 1, 2, 3],
                neg: vec![true, false, true, false],
            }],
        };
        let zero = aggregate(&layout, &[(&empty, 1), (&flipped, 1)], Decode::Rms);
        assert!(
            zero[0].iter().all(|v| *v == 0.0),
            "cancelling votes move nothing"
        );
    }

    #[test]
    fn non_finite_gradients_change_nothing() {
        let shapes = vec![vec![8, 8]];
        let cfg = CompressConfig::default();
        let layout = Layout::new(&shapes, &cfg);
        let mut c = Compressor::new(&layout, cfg);
        let before = c.clone();
        let mut g = vec![vec![0.5f32; 64]];
        g[0][7] = f32::NAN;
        assert!(matches!(
            c.compress(&layout, &g, Draw(0)),
            Err(EngineError::NonFinite(_))
        ));
        g[0][7] = f32::INFINITY;
        assert!(matches!(
            c.compress(&layout, &g, Draw(0)),
            Err(EngineError::NonFinite(_))
        ));
        assert_eq!(c, before);
    }

    #[test]
    fn invalid_payloads_are_refused() {
        let layout = Layout::new(&[vec![64, 64]], &CompressConfig::default());
        let good = SparseSigns {
            idx: vec![1, 2, 3, 4],
            neg: vec![false; 4],
        };
        assert!(
            Payload {
                params: vec![good.clone()]
            }
            .validate(&layout)
            .is_ok()
        );
        assert!(Payload { params: vec![] }.validate(&layout).is_err());
        let dup = SparseSigns {
            idx: vec![1, 1, 3, 4],
            neg: vec![false; 4],
        };
        assert!(Payload { params: vec![dup] }.validate(&layout).is_err());
        let out = SparseSigns {
            idx: vec![1, 2, 3, 4096],
            neg: vec![false; 4],
        };
        assert!(Payload { params: vec![out] }.validate(&layout).is_err());
    }
}
