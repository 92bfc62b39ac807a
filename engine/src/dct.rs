//! Orthonormal DCT-II over fixed chunks, the basis of the compressor.
//!
//! A parameter of shape `[rows, cols]` is cut into `rows_c x cols_c` chunks
//! (the largest divisors of each side that are at most `max_chunk`), and each
//! chunk gets the separable 2-D transform `Y = C_r X C_c^T`. A vector is one
//! row. The basis is orthonormal, so the inverse is the transpose and energy is
//! preserved, which is what lets top-k pick the "fast" components.

/// The largest divisor of `n` that is at most `max`: chunks then tile the
/// tensor exactly, with no padding to agree on.
pub fn chunk_len(n: usize, max: usize) -> usize {
    (1..=max.min(n).max(1))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

/// `C[k][i] = s_k cos(pi (i + 1/2) k / n)`, row-major `n x n`.
pub fn basis(n: usize) -> Vec<f32> {
    let mut c = vec![0f32; n * n];
    let nf = n as f64;
    for k in 0..n {
        let s = if k == 0 {
            (1.0 / nf).sqrt()
        } else {
            (2.0 / nf).sqrt()
        };
        for i in 0..n {
            c[k * n + i] =
                (s * crate::detmath::cos(std::f64::consts::PI * (i as f64 + 0.5) * k as f64 / nf))
                    as f32;
        }
    }
    c
}

/// How one parameter is cut into chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiling {
    pub rows: usize,
    pub cols: usize,
    pub chunk_rows: usize,
    pub chunk_cols: usize,
}

impl Tiling {
    /// Shapes of rank > 2 fold the leading dimensions into rows.
    pub fn new(shape: &[usize], max_chunk: usize) -> Self {
        let (rows, cols) = match shape {
            [] => (1, 1),
            [n] => (1, *n),
            [lead @ .., last] => (lead.iter().product(), *last),
        };
        Self {
            rows,
            cols,
            chunk_rows: chunk_len(rows, max_chunk),
            chunk_cols: chunk_len(cols, max_chunk),
        }
    }

    pub fn chunks(&self) -> usize {
        (self.rows / self.chunk_rows) * (self.cols / self.chunk_cols)
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_rows * self.chunk_cols
    }

    /// Offset in the flat parameter of element `(r, c)` of chunk `ch`.
    #[inline]
    pub fn offset(&self, ch: usize, r: usize, c: usize) -> usize {
        let per_row = self.cols / self.chunk_cols;
        let (cr, cc) = (ch / per_row, ch % per_row);
        (cr * self.chunk_rows + r) * self.cols + cc * self.chunk_cols + c
    }
}

/// Transforms of one tiling, with its bases precomputed.
#[derive(Debug, Clone)]
pub struct Dct {
    pub tiling: Tiling,
    row_basis: Vec<f32>,
    col_basis: Vec<f32>,
}

impl Dct {
    pub fn new(tiling: Tiling) -> Self {
        Self {
            row_basis: basis(tiling.chunk_rows),
            col_basis: basis(tiling.chunk_cols),
            tiling,
        }
    }

    /// DCT of chunk `ch` of `x` into `out` (`chunk_size` long, row-major).
    pub fn forward_chunk(&self, x: &[f32], ch: usize, out: &mut [f32], tmp: &mut Vec<f32>) {
        let (m, n) = (self.tiling.chunk_rows, self.tiling.chunk_cols);
        tmp.clear();
        tmp.resize(m * n, 0.0);
        // tmp = X C_c^T : tmp[r][k] = sum_i X[r][i] C_c[k][i]
        for r in 0..m {
            let row = &x[self.tiling.offset(ch, r, 0)..self.tiling.offset(ch, r, 0) + n];
            for k in 0..n {
                let b = &self.col_basis[k * n..k * n + n];
                tmp[r * n + k] = dot(row, b);
            }
        }
        // out = C_r tmp : out[k][j] = sum_r C_r[k][r] tmp[r][j]
        out[..m * n].fill(0.0);
        for k in 0..m {
            let o = &mut out[k * n..k * n + n];
            for r in 0..m {
                let c = self.row_basis[k * m + r];
                axpy(o, c, &tmp[r * n..r * n + n]);
            }
        }
    }

    /// Inverse DCT of a full chunk of coefficients, written into chunk `ch` of `x`.
    pub fn inverse_chunk(&self, coef: &[f32], ch: usize, x: &mut [f32], tmp: &mut Vec<f32>) {
        let (m, n) = (self.tiling.chunk_rows, self.tiling.chunk_cols);
        tmp.clear();
        tmp.resize(m * n, 0.0);
        // tmp = C_r^T Y : tmp[r][j] = sum_k C_r[k][r] Y[k][j]
        for k in 0..m {
            for r in 0..m {
                let c = self.row_basis[k * m + r];
                let (t, y) = (&mut tmp[r * n..r * n + n], &coef[k * n..k * n + n]);
                axpy(t, c, y);
            }
        }
        // X = tmp C_c : X[r][i] = sum_k tmp[r][k] C_c[k][i]
        for r in 0..m {
            let off = self.tiling.offset(ch, r, 0);
            let dst = &mut x[off..off + n];
            dst.fill(0.0);
            for k in 0..n {
                let t = tmp[r * n + k];
                if t != 0.0 {
                    axpy(dst, t, &self.col_basis[k * n..k * n + n]);
                }
            }
        }
    }

    /// Adds `scale` times basis function `idx` (row-major index in the chunk)
    /// to chunk `ch` of `x`: the inverse DCT of a single coefficient. Cheap
    /// for the few coefficients top-k keeps.
    pub fn add_basis(&self, x: &mut [f32], ch: usize, idx: usize, scale: f32) {
        let (m, n) = (self.tiling.chunk_rows, self.tiling.chunk_cols);
        let (a, b) = (idx / n, idx % n);
        let col = &self.col_basis[b * n..b * n + n];
        for r in 0..m {
            let w = scale * self.row_basis[a * m + r];
            let off = self.tiling.offset(ch, r, 0);
            axpy(&mut x[off..off + n], w, col);
        }
    }
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Four accumulators let the compiler vectorize without reassociating a single sum.
    let mut acc = [0f32; 4];
    let chunks = a.len() / 4;
    for i in 0..chunks {
        for j in 0..4 {
            acc[j] += a[4 * i + j] * b[4 * i + j];
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for i in chunks * 4..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// Deterministic values in [-1, 1) for tests across the engine.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_exact_within_1e_5() {
        for shape in [
            vec![64usize, 64],
            vec![128, 192],
            vec![256],
            vec![48, 100],
            vec![7],
        ] {
            let d = Dct::new(Tiling::new(&shape, 64));
            let n: usize = shape.iter().product();
            let x = test_values(n, 3);
            let mut y = vec![0f32; n];
            let mut coef = vec![0f32; d.tiling.chunk_size()];
            let mut tmp = Vec::new();
            for ch in 0..d.tiling.chunks() {
                d.forward_chunk(&x, ch, &mut coef, &mut tmp);
                d.inverse_chunk(&coef, ch, &mut y, &mut tmp);
            }
            let err = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-5, "{shape:?}: max error {err}");
        }
    }

    #[test]
    fn matches_the_textbook_formula_and_preserves_energy() {
        // Naive 2-D DCT-II with orthonormal scaling, straight from the definition.
        let (m, n) = (8usize, 4usize);
        let x = test_values(m * n, 9);
        let d = Dct::new(Tiling::new(&[m, n], 64));
        let mut coef = vec![0f32; m * n];
        d.forward_chunk(&x, 0, &mut coef, &mut Vec::new());
        let pi = std::f64::consts::PI;
        for k in 0..m {
            for l in 0..n {
                let sk = if k == 0 {
                    (1.0 / m as f64).sqrt()
                } else {
                    (2.0 / m as f64).sqrt()
                };
                let sl = if l == 0 {
                    (1.0 / n as f64).sqrt()
                } else {
                    (2.0 / n as f64).sqrt()
                };
                let mut s = 0f64;
                for i in 0..m {
                    for j in 0..n {
                        s += x[i * n + j] as f64
                            * (pi * (i as f64 + 0.5) * k as f64 / m as f64).cos()
                            * (pi * (j as f64 + 0.5) * l as f64 / n as f64).cos();
                    }
                }
                assert!((coef[k * n + l] as f64 - sk * sl * s).abs() < 1e-5);
            }
        }
        let e0: f32 = x.iter().map(|v| v * v).sum();
        let e1: f32 = coef.iter().map(|v| v * v).sum();
        assert!((e0 - e1).abs() < 1e-4);
    }

    #[test]
    fn add_basis_is_the_inverse_of_one_coefficient() {
        let d = Dct::new(Tiling::new(&[16, 32], 8));
        let ch = 5;
        let mut coef = vec![0f32; d.tiling.chunk_size()];
        coef[13] = 0.7;
        let mut dense = vec![0f32; 16 * 32];
        d.inverse_chunk(&coef, ch, &mut dense, &mut Vec::new());
        let mut sparse = vec![0f32; 16 * 32];
        d.add_basis(&mut sparse, ch, 13, 0.7);
        let err = dense
            .iter()
            .zip(&sparse)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-6);
    }

    #[test]
    fn chunks_tile_exactly() {
        assert_eq!(chunk_len(192, 64), 64);
        assert_eq!(chunk_len(100, 64), 50);
        assert_eq!(chunk_len(7, 64), 7);
        let t = Tiling::new(&[4, 96, 64], 64);
        assert_eq!(
            (t.rows, t.cols, t.chunk_rows, t.chunk_cols),
            (384, 64, 64, 64)
        );
        let mut seen = vec![false; 384 * 64];
        for ch in 0..t.chunks() {
            for r in 0..t.chunk_rows {
                for c in 0..t.chunk_cols {
                    let o = t.offset(ch, r, c);
                    assert!(!seen[o]);
                    seen[o] = true;
                }
            }
        }
        assert!(seen.iter().all(|s| *s));
    }
}
