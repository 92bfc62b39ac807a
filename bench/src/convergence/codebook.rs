//! A bench-only prototype for issue 20 (`--methods vq<B>x<S>`): more of each
//! chunk's momentum per bit than the shared rule's drawn signs, by sending,
//! per large chunk, the index of the best of 2^B shared random codewords.
//!
//! Why try it: the shared rule's drawn positions capture, per bit, 2/π of
//! one coefficient's energy (the sign of a Gaussian), and the members'
//! gradient spectra were found flat over a chunk's DCT positions (no
//! position holds more energy for long), so no better choice of positions
//! exists. Picking the best of 2^B random directions costs B + 1 bits
//! (index and sign) and captures about the square of the expected maximum
//! of 2^(B+1) Gaussians: about 11.6 coefficients' energy for 12 bits at
//! B = 11, against 7.6 for 12 drawn signs.
//!
//! What it gave: worse training at the same bytes (the "what was tried"
//! table in docs/benchmarks.md), as the top-k rule, which is its S = 1
//! case, was: members no longer vote on the same positions, and what is
//! never the largest stays in the momentum until it decays.
//!
//! At B = 0 (`vq0x<S>`) there is one codeword a group, the same for every
//! member: each bit is the sign of a shared random projection on S
//! positions, so members vote on the same projections and their votes add
//! up as the shared rule's do per position (S = 1 is the shared rule, but
//! for positions drawn with replacement). It asks whether covering more
//! positions per bit helps at the same bytes.
//!
//! A codeword is sparse in the chunk's DCT domain (S positions, each ±1,
//! drawn from the step's [`Draw`], the parameter, chunk, group and index),
//! so its inverse DCT still touches every weight of the chunk, as the
//! shared rule's does. Members choose greedily: group g picks on what the
//! groups before it left, and each pick's projection leaves the member's
//! momentum (error feedback). Chunks smaller than [`LARGE`] (biases and
//! norms, 64 positions of which the shared rule sends 61) keep the shared
//! rule's drawn signs. The decoder sums every member's picks (and drawn
//! signs), inverse-DCTs and takes the sign, as the recipe does.

use cohort_engine::compress::{Decode, Draw, Layout, finish, splitmix_next};
use rayon::prelude::*;

/// Chunks with at least this many positions use codewords.
pub const LARGE: usize = 1024;

/// The settings of one `vq<B>x<S>` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Book {
    /// Index bits per codeword (2^B candidates per group). At 0 each group
    /// is one shared random projection whose sign every member sends, as
    /// the shared rule sends a drawn coefficient's: the members' votes add
    /// up per projection, and a bit covers `spread` positions.
    pub bits: u8,
    /// Nonzero positions per codeword.
    pub spread: u8,
}

/// One member's picks: per parameter, per chunk, per group, (index, negative)
/// for a large chunk, or the shared rule's signs (true = negative) for a
/// small one.
pub struct Picks {
    pub params: Vec<Vec<Vec<(u32, bool)>>>,
}

impl Book {
    /// Groups per large chunk so that a chunk costs at most the shared rule's
    /// `k` bits.
    pub fn groups(self, k: usize) -> usize {
        (k / (self.bits as usize + 1)).max(1)
    }

    /// Bytes of one member's picks, counted as `wire::payload_len` counts the
    /// shared rule's (3 bytes, then 8 a parameter and its bits rounded up).
    pub fn payload_len(self, layout: &Layout) -> usize {
        3 + (0..layout.dcts.len())
            .map(|p| {
                let t = &layout.dcts[p].tiling;
                let per_chunk = if t.chunk_size() >= LARGE {
                    self.groups(layout.topk[p]) * (self.bits as usize + 1)
                } else {
                    layout.topk[p]
                };
                8 + (t.chunks() * per_chunk).div_ceil(8)
            })
            .sum::<usize>()
    }

    /// Codeword `j` of the group whose seed is `base` ([`group_seed`]):
    /// `spread` distinct positions of a chunk of `size` with their signs
    /// (true = negative).
    fn codeword(self, base: u64, j: u32, size: usize, out: &mut Vec<(u16, bool)>) {
        out.clear();
        let mut state = base ^ ((j as u64) << 32);
        while out.len() < self.spread as usize {
            let r = splitmix_next(&mut state);
            let pos = (r % size as u64) as u16;
            if out.iter().all(|(q, _)| *q != pos) {
                out.push((pos, (r >> 63) == 1));
            }
        }
    }

    /// Folds `grads` into `momentum` (decay `decay`) and picks, per chunk,
    /// the codewords (or drawn signs), removing what they send.
    pub fn compress(
        self,
        layout: &Layout,
        momentum: &mut [Vec<f32>],
        grads: &[Vec<f32>],
        decay: f32,
        draw: Draw,
    ) -> Picks {
        let params = momentum
            .par_iter_mut()
            .zip(grads)
            .enumerate()
            .map(|(p, (m, g))| {
                for (mi, gi) in m.iter_mut().zip(g) {
                    *mi = decay * *mi + gi;
                }
                let dct = &layout.dcts[p];
                let size = dct.tiling.chunk_size();
                let k = layout.topk[p];
                let mut coef = vec![0f32; size];
                let mut tmp = Vec::new();
                let mut word = Vec::new();
                let mut drawn = Vec::new();
                (0..dct.tiling.chunks())
                    .map(|ch| {
                        dct.forward_chunk(m, ch, &mut coef, &mut tmp);
                        if size < LARGE {
                            draw.positions(p, ch, size, k, &mut drawn);
                            return drawn
                                .iter()
                                .map(|&i| {
                                    let v = coef[i as usize];
                                    dct.add_basis(m, ch, i as usize, -v);
                                    (i as u32, v < 0.0)
                                })
                                .collect();
                        }
                        (0..self.groups(k))
                            .map(|grp| {
                                let base = group_seed(draw, p, ch, grp);
                                let mut best = (0u32, 0f32);
                                for j in 0..1u32 << self.bits {
                                    self.codeword(base, j, size, &mut word);
                                    let score: f32 = word
                                        .iter()
                                        .map(|&(i, neg)| {
                                            let v = coef[i as usize];
                                            if neg { -v } else { v }
                                        })
                                        .sum();
                                    if score.abs() > best.1.abs() {
                                        best = (j, score);
                                    }
                                }
                                self.codeword(base, best.0, size, &mut word);
                                // The projection on the codeword (|c|² = S).
                                let along = best.1 / self.spread as f32;
                                for &(i, neg) in &word {
                                    let d = if neg { -along } else { along };
                                    coef[i as usize] -= d;
                                    dct.add_basis(m, ch, i as usize, -d);
                                }
                                (best.0, best.1 < 0.0)
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Picks { params }
    }

    /// Every member's picks summed (each codeword with unit weight per
    /// position, each drawn sign as one vote), inverse-DCT'd and finished by
    /// `decode` (the recipe's is [`Decode::Sign`]).
    pub fn decode(
        self,
        layout: &Layout,
        picks: &[Picks],
        draw: Draw,
        decode: Decode,
    ) -> Vec<Vec<f32>> {
        layout
            .dcts
            .par_iter()
            .enumerate()
            .map(|(p, dct)| {
                let size = dct.tiling.chunk_size();
                let k = layout.topk[p];
                let mut x = vec![0f32; layout.numel(p)];
                let mut acc = vec![0f32; size];
                let mut tmp = Vec::new();
                let mut word = Vec::new();
                let mut drawn = Vec::new();
                for ch in 0..dct.tiling.chunks() {
                    acc.fill(0.0);
                    for member in picks {
                        let sent = &member.params[p][ch];
                        if size < LARGE {
                            draw.positions(p, ch, size, k, &mut drawn);
                            for (&i, &(_, neg)) in drawn.iter().zip(sent) {
                                acc[i as usize] += if neg { -1.0 } else { 1.0 };
                            }
                        } else {
                            for (grp, &(j, neg)) in sent.iter().enumerate() {
                                self.codeword(group_seed(draw, p, ch, grp), j, size, &mut word);
                                for &(i, wneg) in &word {
                                    acc[i as usize] += if neg != wneg { -1.0 } else { 1.0 };
                                }
                            }
                        }
                    }
                    dct.inverse_chunk(&acc, ch, &mut x, &mut tmp);
                }
                finish(&mut x, decode);
                x
            })
            .collect()
    }
}

/// The seed of group `g` of chunk `ch` of parameter `p` under `draw`.
fn group_seed(draw: Draw, p: usize, ch: usize, g: usize) -> u64 {
    draw.0
        ^ (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (ch as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ (g as u64).wrapping_mul(0x1656_67B1_9E37_79F9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_engine::compress::{CompressConfig, Select};

    fn layout() -> Layout {
        Layout::new(
            &[vec![64, 64], vec![64]],
            &CompressConfig {
                topk: 61,
                select: Select::Shared,
                ..CompressConfig::default()
            },
        )
    }

    #[test]
    fn a_chunk_costs_no_more_bits_than_the_shared_rule_s_drawn_signs() {
        let l = layout();
        let book = Book {
            bits: 11,
            spread: 16,
        };
        assert_eq!(book.groups(61), 5);
        assert!(book.payload_len(&l) <= cohort_engine::wire::payload_len(&l));
    }

    /// The cosine between a decoded direction and the momentum it came from.
    fn cosine(d: &[Vec<f32>], m: &[Vec<f32>]) -> f64 {
        let dot = |a: &[Vec<f32>], b: &[Vec<f32>]| -> f64 {
            a.iter()
                .zip(b)
                .flat_map(|(x, y)| x.iter().zip(y))
                .map(|(x, y)| *x as f64 * *y as f64)
                .sum()
        };
        dot(d, m) / (dot(d, d) * dot(m, m)).sqrt()
    }

    #[test]
    fn the_best_codewords_point_closer_to_a_random_momentum_than_as_many_drawn_signs() {
        let l = layout();
        let book = Book {
            bits: 11,
            spread: 16,
        };
        let mut state = 7u64;
        // One large chunk only: the small one is the shared rule in both.
        let g: Vec<Vec<f32>> = vec![
            (0..4096)
                .map(|_| (splitmix_next(&mut state) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                .collect(),
            vec![0.0; 64],
        ];
        let mut m: Vec<Vec<f32>> = g.iter().map(|v| vec![0.0; v.len()]).collect();
        let picks = vec![book.compress(&l, &mut m, &g, 0.0, Draw(1))];
        let vq = cosine(&book.decode(&l, &picks, Draw(1), Decode::Rms), &g);
        // The shared rule with as many signs as the codewords' bits (60).
        let cfg = CompressConfig {
            topk: 60,
            select: Select::Shared,
            decay: 0.0,
            ..CompressConfig::default()
        };
        let l60 = Layout::new(&[vec![64, 64], vec![64]], &cfg);
        let mut c = cohort_engine::compress::Compressor::new(&l60, cfg);
        let sent = c.compress(&l60, &g, Draw(1)).unwrap();
        let signs = cosine(
            &cohort_engine::compress::aggregate(&l60, &[(&sent, 1)], Decode::Rms),
            &g,
        );
        assert!(vq > 1.1 * signs, "{vq} vs {signs}");
    }

    #[test]
    fn with_no_index_bits_every_member_votes_on_the_same_projections() {
        let l = layout();
        let book = Book { bits: 0, spread: 4 };
        assert_eq!(book.groups(61), 61);
        assert_eq!(book.payload_len(&l), cohort_engine::wire::payload_len(&l));
        let g: Vec<Vec<f32>> = vec![
            (0..4096).map(|i| (i as f32 * 0.37).sin()).collect(),
            (0..64).map(|i| (i as f32 * 0.91).cos()).collect(),
        ];
        let minus: Vec<Vec<f32>> = g.iter().map(|v| v.iter().map(|x| -x).collect()).collect();
        let zero =
            |v: &Vec<Vec<f32>>| -> Vec<Vec<f32>> { v.iter().map(|x| vec![0.0; x.len()]).collect() };
        let (mut a, mut b) = (zero(&g), zero(&g));
        let picks = vec![
            book.compress(&l, &mut a, &g, 0.0, Draw(5)),
            book.compress(&l, &mut b, &minus, 0.0, Draw(5)),
        ];
        assert!(
            picks
                .iter()
                .all(|m| m.params[0].iter().flatten().all(|(j, _)| *j == 0))
        );
        // Opposite momenta vote opposite signs on the same projections.
        let d = book.decode(&l, &picks, Draw(5), Decode::Rms);
        assert!(d.iter().flatten().all(|v| *v == 0.0));
        let one = book.decode(&l, &picks[..1], Draw(5), Decode::Rms);
        assert!(one[0].iter().any(|v| *v != 0.0));
    }

    #[test]
    fn decoding_the_picks_is_the_same_on_every_call_and_moves_every_weight() {
        let l = layout();
        let book = Book { bits: 6, spread: 8 };
        let g: Vec<Vec<f32>> = vec![
            (0..4096).map(|i| (i as f32 * 0.37).sin()).collect(),
            vec![0.5; 64],
        ];
        let mut m: Vec<Vec<f32>> = g.iter().map(|v| vec![0.0; v.len()]).collect();
        let picks = vec![book.compress(&l, &mut m, &g, 0.9, Draw(3))];
        let a = book.decode(&l, &picks, Draw(3), Decode::Sign);
        let b = book.decode(&l, &picks, Draw(3), Decode::Sign);
        assert_eq!(a, b);
        assert!(a[0].iter().all(|v| v.abs() == 1.0));
    }
}
