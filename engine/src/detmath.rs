//! Maths that decides weights, computed the same on every platform.
//!
//! `f64::cos`, `ln` and friends call the platform's maths library, and
//! Linux, Windows and macOS round their last bits differently; a one-ulp
//! difference in the DCT basis, the learning rate or the initial weights is
//! a different model hash, which the protocol reads as divergence. These
//! use only `+ - * /`, `sqrt` and exact bit operations, which IEEE 754
//! rounds identically everywhere (Rust never contracts them into fused
//! multiply-adds on its own). Accuracy is within a few ulps of libm; what
//! matters is that it is the same few ulps on every machine.

/// π/2 split in three (the fdlibm split): `k × PIO2_1` is exact for the
/// `|k| < 2^20` this code reduces by, so the reduced argument keeps its bits.
#[allow(clippy::excessive_precision)] // the published split, digit for digit
const PIO2_1: f64 = 1.570_796_326_734_125_614_17e0;
#[allow(clippy::excessive_precision)] // the published split, digit for digit
const PIO2_2: f64 = 6.077_100_506_303_965_976_6e-11;
#[allow(clippy::excessive_precision)] // the published split, digit for digit
const PIO2_3: f64 = 2.022_266_248_795_950_631_54e-21;
const FRAC_2_PI: f64 = std::f64::consts::FRAC_2_PI;

/// `sin r` for `|r| ≤ π/4`: Taylor series to r^15 (next term < 5e-17).
fn sin_kernel(r: f64) -> f64 {
    let z = r * r;
    let p = -1.0 / 1_307_674_368_000.0;
    let p = p * z + 1.0 / 6_227_020_800.0;
    let p = p * z - 1.0 / 39_916_800.0;
    let p = p * z + 1.0 / 362_880.0;
    let p = p * z - 1.0 / 5_040.0;
    let p = p * z + 1.0 / 120.0;
    let p = p * z - 1.0 / 6.0;
    r + r * z * p
}

/// `cos r` for `|r| ≤ π/4`: Taylor series to r^16 (next term < 3e-18).
fn cos_kernel(r: f64) -> f64 {
    let z = r * r;
    let p = 1.0 / 20_922_789_888_000.0;
    let p = p * z - 1.0 / 87_178_291_200.0;
    let p = p * z + 1.0 / 479_001_600.0;
    let p = p * z - 1.0 / 3_628_800.0;
    let p = p * z + 1.0 / 40_320.0;
    let p = p * z - 1.0 / 720.0;
    let p = p * z + 1.0 / 24.0;
    let p = p * z - 0.5;
    1.0 + z * p
}

/// `x = k π/2 + r` with `|r| ≲ π/4`; `k` modulo 4 picks the quadrant.
fn reduce(x: f64) -> (i64, f64) {
    assert!(
        x.is_finite() && x.abs() < 1e6,
        "detmath: argument {x} out of range"
    );
    let k = (x * FRAC_2_PI).round();
    let r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    (k as i64, r)
}

/// Cosine, identical to the last bit on every platform (`|x| < 10^6`).
pub fn cos(x: f64) -> f64 {
    let (k, r) = reduce(x);
    match k.rem_euclid(4) {
        0 => cos_kernel(r),
        1 => -sin_kernel(r),
        2 => -cos_kernel(r),
        _ => sin_kernel(r),
    }
}

/// Sine, identical to the last bit on every platform (`|x| < 10^6`).
pub fn sin(x: f64) -> f64 {
    let (k, r) = reduce(x);
    match k.rem_euclid(4) {
        0 => sin_kernel(r),
        1 => cos_kernel(r),
        2 => -sin_kernel(r),
        _ => -cos_kernel(r),
    }
}

/// Natural logarithm of a positive finite `x`, identical on every platform.
pub fn ln(x: f64) -> f64 {
    assert!(
        x > 0.0 && x.is_finite(),
        "detmath: ln of {x} is not defined here"
    );
    // Subnormals: scale into the normal range first (exact).
    let (x, bias) = if x < f64::MIN_POSITIVE {
        (x * (1u64 << 54) as f64, -54i64)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023 + bias;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln m = 2 atanh(s), s = (m-1)/(m+1), |s| ≤ 0.172: the odd series to
    // s^23 leaves less than 1e-18.
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let mut p = 1.0 / 23.0;
    for k in (0..11).rev() {
        p = p * z + 1.0 / (2 * k + 1) as f64;
    }
    let ln_m = 2.0 * s * p;
    // ln 2 split so `e × LN2_HI` is exact for every exponent.
    #[allow(clippy::excessive_precision)]
    const LN2_HI: f64 = 6.931_471_803_691_238_164_9e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    let e = e as f64;
    e * LN2_HI + (ln_m + e * LN2_LO)
}

/// `b^n` by square-and-multiply in f32, the same sequence of roundings on
/// every platform (`f32::powi` leaves the algorithm to the compiler).
pub fn powi_f32(b: f32, n: u32) -> f32 {
    let (mut base, mut n, mut acc) = (b, n, 1.0f32);
    while n > 0 {
        if n & 1 == 1 {
            acc *= base;
        }
        base *= base;
        n >>= 1;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cos_and_sin_match_the_platform_library_to_a_few_ulps() {
        let mut worst = 0f64;
        for i in 0..200_000 {
            let x = i as f64 * 0.001 - 3.0;
            worst = worst
                .max((cos(x) - x.cos()).abs())
                .max((sin(x) - x.sin()).abs());
        }
        assert!(worst < 4e-16, "worst error {worst}");
        assert_eq!(cos(0.0), 1.0);
        assert_eq!(sin(0.0), 0.0);
    }

    #[test]
    fn ln_matches_the_platform_library_to_a_few_ulps() {
        let mut worst = 0f64;
        for i in 1..100_000 {
            let x = i as f64 / 100_000.0;
            worst = worst.max(((ln(x) - x.ln()) / x.ln().abs().max(1.0)).abs());
        }
        for x in [1e-300, 5e-324, 1e300, 2.0, 0.5, std::f64::consts::E] {
            worst = worst.max(((ln(x) - x.ln()) / x.ln().abs().max(1.0)).abs());
        }
        assert!(worst < 4e-16, "worst error {worst}");
        assert_eq!(ln(1.0), 0.0);
    }

    #[test]
    fn powi_multiplies_out() {
        assert_eq!(powi_f32(2.0, 10), 1024.0);
        assert_eq!(powi_f32(0.5, 0), 1.0);
        assert!((powi_f32(0.999, 1000) - 0.999f32.powi(1000)).abs() < 1e-5);
    }

    fn digest(values: impl IntoIterator<Item = u64>) -> String {
        let mut h = blake3::Hasher::new();
        for v in values {
            h.update(&v.to_le_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    /// Everything here that decides weights, pinned bit for bit: a change
    /// of platform, compiler or code that moves one bit fails this test
    /// before it splits a job.
    #[test]
    fn weight_deciding_maths_is_pinned_to_fixed_hashes() {
        let grid = || (0..4096).map(|i| i as f64 * 0.0491 - 7.3);
        let trig = digest(grid().flat_map(|x| [cos(x).to_bits(), sin(x).to_bits()]));
        let logs = digest((1..4096).map(|i| ln(i as f64 / 4096.0).to_bits()));
        let lr = crate::optim::LrSchedule {
            base: 3e-3,
            warmup: 20,
            total: 2000,
            min_ratio: 0.1,
        };
        let schedule = digest((0..2100).map(|s| lr.at(s).to_bits() as u64));
        let basis = digest(
            [1, 2, 3, 4, 8, 16, 32, 48, 64]
                .into_iter()
                .flat_map(crate::dct::basis)
                .map(|v| v.to_bits() as u64),
        );
        let init = crate::model::ModelConfig::tiny()
            .init(&[7; 32])
            .model_hash();
        let init: String = init.iter().map(|b| format!("{b:02x}")).collect();
        let got = [trig, logs, schedule, basis, init];
        let want = [
            "800f72b3cce822dcf15c569a315c8a8fe23c5bb286f2ed6c074312e5c1ae765e",
            "9ad6e80fddad6f99d1242afbc3da6c6c8a2f0327e13ddd8ad4136079256542a2",
            "1cfad2e5bcc195e2e45f7cda99ab911fc0a423debf4a1c77b68a6595fc79361a",
            "b089e40f4bd49eba6e80acf03a8271249288d8ffb493c131e3bed282e078f80d",
            "a125d2a855ce8584b7ba1a45820760460612189c8123f7dc1abbec2268f4d5fa",
        ];
        assert_eq!(got, want);
    }
}
