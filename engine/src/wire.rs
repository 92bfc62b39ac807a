//! Wire format of a contribution, version 5 (laid out as 4; see `VERSION`). Little-endian; every size exact.
//!
//! ```text
//! signed       := contribution | ed25519 signature [64] by `member` over
//!                 "cohort-contribution-v5" | contribution
//! contribution := magic "CHC" | version u8 | job [32] | epoch u32 | step u32
//!                 | member [32] | train_loss f32 | momentum_hash [32]
//!                 | basis [32] | payload_len u32 | payload
//! payload      := param_count u16 | select u8 | per parameter:
//!                   chunks u32 | chunk_size u16 | k u16 | signs
//! signs, select 0 (top-k)  := ceil(chunks * k * (index_bits + 1) / 8) bytes of
//!                   (index, sign) pairs, LSB-first, index_bits = ceil(log2(chunk_size))
//! signs, select 1 (shared) := ceil(chunks * k / 8) bytes of sign bits, LSB-first,
//!                   one per position of the step's draw (`compress::Draw`,
//!                   from the contribution's job and step), chunk by chunk
//! ```
//! The receiver checks every count against its own model layout, so a payload
//! for another shape is refused rather than misread. Members exchange the
//! signed form: a step leader can list bytes under a member's name only if
//! that member signed them, so it cannot get an honest member audited (and
//! slashed) on garbage of its own making. `basis` names the shared state the
//! contribution was computed on, so nobody applies (or audits) it on
//! another: after a rewind, an honest member's contribution computed on the
//! abandoned history is skipped, never recomputed on weights it did not see.

use crate::compress::{Draw, Layout, Payload, Select, SparseSigns};
use crate::error::EngineError;
use cohort_program::codec::Reader;
use libp2p::identity::ed25519;

/// 5 (2026-12-06): contributions of the look-ahead recipe (recipe 3),
/// computed one step ahead on extrapolated weights; laid out as in 4.
pub const VERSION: u8 = 5;
/// Bytes the signature adds to a signed contribution.
pub const SIGNATURE_LEN: usize = 64;
const SIGN_DOMAIN: &[u8] = b"cohort-contribution-v5";
const MAGIC: &[u8; 3] = b"CHC";
/// Bytes of a contribution before its payload.
pub const HEADER_LEN: usize = 3 + 1 + 32 + 4 + 4 + 32 + 4 + 32 + 32 + 4;

/// A member's contribution for one step, as sent and as committed to.
#[derive(Debug, Clone, PartialEq)]
pub struct Contribution {
    pub job: [u8; 32],
    pub epoch: u32,
    pub step: u32,
    pub member: [u8; 32],
    pub train_loss: f32,
    /// Hash of the member's momentum before this step (for audits).
    pub momentum_hash: [u8; 32],
    /// Hash of the shared state it was computed on (zeros where there is
    /// only one history, as in the arena).
    pub basis: [u8; 32],
    pub payload: Payload,
}

fn index_bits(chunk_size: usize) -> u32 {
    usize::BITS - (chunk_size.max(2) - 1).leading_zeros()
}

/// Bits one sent coefficient takes under `layout`'s selection.
fn coefficient_bits(layout: &Layout, chunk_size: usize) -> u32 {
    match layout.select {
        Select::TopK => index_bits(chunk_size) + 1,
        Select::Shared => 1,
    }
}

fn select_byte(select: Select) -> u8 {
    match select {
        Select::TopK => 0,
        Select::Shared => 1,
    }
}

/// Exact encoded size of a payload for `layout`, without encoding it.
pub fn payload_len(layout: &Layout) -> usize {
    2 + 1
        + (0..layout.dcts.len())
            .map(|p| {
                let t = &layout.dcts[p].tiling;
                let bits =
                    t.chunks() * layout.topk[p] * coefficient_bits(layout, t.chunk_size()) as usize;
                4 + 2 + 2 + bits.div_ceil(8)
            })
            .sum::<usize>()
}

struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    fn put(&mut self, v: u64, bits: u32) {
        self.acc |= v << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    fn flush(&mut self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.acc = 0;
        self.n = 0;
    }
}

pub fn encode_payload(p: &Payload, layout: &Layout) -> Vec<u8> {
    let mut w = BitWriter {
        out: Vec::with_capacity(payload_len(layout)),
        acc: 0,
        n: 0,
    };
    w.out
        .extend_from_slice(&(p.params.len() as u16).to_le_bytes());
    w.out.push(select_byte(layout.select));
    for (i, s) in p.params.iter().enumerate() {
        let t = &layout.dcts[i].tiling;
        w.out.extend_from_slice(&(t.chunks() as u32).to_le_bytes());
        w.out
            .extend_from_slice(&(t.chunk_size() as u16).to_le_bytes());
        w.out
            .extend_from_slice(&(layout.topk[i] as u16).to_le_bytes());
        match layout.select {
            Select::TopK => {
                let bits = index_bits(t.chunk_size());
                for (idx, neg) in s.idx.iter().zip(&s.neg) {
                    w.put(*idx as u64 | ((*neg as u64) << bits), bits + 1);
                }
            }
            Select::Shared => {
                for neg in &s.neg {
                    w.put(*neg as u64, 1);
                }
            }
        }
        w.flush();
    }
    w.out
}

fn trailing(r: &Reader) -> Result<(), EngineError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(EngineError::Malformed(format!("{n} trailing bytes"))),
    }
}

/// Decodes a payload for `layout`; under [`Select::Shared`] its positions
/// are `draw`'s (the contribution's job and step), filled in here.
pub fn decode_payload(buf: &[u8], layout: &Layout, draw: Draw) -> Result<Payload, EngineError> {
    let mut c = Reader::new(buf);
    let count = c.u16()? as usize;
    if count != layout.dcts.len() {
        return Err(EngineError::Shape(format!(
            "payload has {count} parameters, model has {}",
            layout.dcts.len()
        )));
    }
    let select = c.u8()?;
    if select != select_byte(layout.select) {
        return Err(EngineError::Shape(format!(
            "payload selects coefficients by rule {select}, the job by rule {}",
            select_byte(layout.select)
        )));
    }
    let mut params = Vec::with_capacity(count);
    for p in 0..count {
        let t = &layout.dcts[p].tiling;
        let (chunks, size, k) = (c.u32()? as usize, c.u16()? as usize, c.u16()? as usize);
        if chunks != t.chunks() || size != t.chunk_size() || k != layout.topk[p] {
            return Err(EngineError::Shape(format!(
                "parameter {p}: {chunks} chunks of {size} with k={k}, model has {} of {} with k={}",
                t.chunks(),
                t.chunk_size(),
                layout.topk[p]
            )));
        }
        let n = chunks * k;
        let mut s = SparseSigns {
            idx: Vec::with_capacity(n),
            neg: Vec::with_capacity(n),
        };
        match layout.select {
            Select::TopK => {
                let bits = index_bits(size);
                let bytes = c.bytes((n * (bits as usize + 1)).div_ceil(8))?;
                let (mut acc, mut have, mut pos) = (0u64, 0u32, 0usize);
                for _ in 0..n {
                    while have < bits + 1 {
                        acc |= (bytes[pos] as u64) << have;
                        pos += 1;
                        have += 8;
                    }
                    s.idx.push((acc & ((1 << bits) - 1)) as u16);
                    s.neg.push((acc >> bits) & 1 == 1);
                    acc >>= bits + 1;
                    have -= bits + 1;
                }
            }
            Select::Shared => {
                let bytes = c.bytes(n.div_ceil(8))?;
                s.neg
                    .extend((0..n).map(|i| (bytes[i / 8] >> (i % 8)) & 1 == 1));
                s.idx = layout.drawn(p, draw);
            }
        }
        params.push(s);
    }
    trailing(&c)?;
    let payload = Payload { params };
    payload.validate(layout)?;
    Ok(payload)
}

impl Contribution {
    pub fn encode(&self, layout: &Layout) -> Vec<u8> {
        let payload = encode_payload(&self.payload, layout);
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.job);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&self.member);
        out.extend_from_slice(&self.train_loss.to_le_bytes());
        out.extend_from_slice(&self.momentum_hash);
        out.extend_from_slice(&self.basis);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// The signed form members exchange (see the module docs).
    pub fn encode_signed(&self, layout: &Layout, key: &ed25519::Keypair) -> Vec<u8> {
        let mut out = self.encode(layout);
        let sig = key.sign(&[SIGN_DOMAIN, &out[..]].concat());
        out.extend_from_slice(&sig);
        out
    }

    /// Decodes a signed contribution, refusing it unless the key it names
    /// as `member` signed exactly these bytes (checked before decoding).
    pub fn decode_signed(buf: &[u8], layout: &Layout) -> Result<Self, EngineError> {
        let body_len = buf
            .len()
            .checked_sub(SIGNATURE_LEN)
            .filter(|n| *n >= 3 + 1 + 32 + 4 + 4 + 32)
            .ok_or_else(|| EngineError::Malformed("too short to be signed".into()))?;
        let (body, sig) = buf.split_at(body_len);
        let member: [u8; 32] = body[3 + 1 + 32 + 4 + 4..3 + 1 + 32 + 4 + 4 + 32]
            .try_into()
            .map_err(|_| EngineError::Malformed("member".into()))?;
        let key =
            ed25519::PublicKey::try_from_bytes(&member).map_err(|_| EngineError::Signature)?;
        if !key.verify(&[SIGN_DOMAIN, body].concat(), sig) {
            return Err(EngineError::Signature);
        }
        Self::decode(body, layout)
    }

    pub fn decode(buf: &[u8], layout: &Layout) -> Result<Self, EngineError> {
        let mut c = Reader::new(buf);
        if c.bytes(3)? != MAGIC {
            return Err(EngineError::Malformed("not a Cohort contribution".into()));
        }
        let version = c.u8()?;
        if version != VERSION {
            return Err(EngineError::Version {
                found: version,
                supported: VERSION,
            });
        }
        let job = c.array()?;
        let epoch = c.u32()?;
        let step = c.u32()?;
        let member = c.array()?;
        let train_loss = f32::from_le_bytes(c.array()?);
        if !train_loss.is_finite() {
            return Err(EngineError::NonFinite("reported training loss".into()));
        }
        let momentum_hash = c.array()?;
        let basis = c.array()?;
        let len = c.u32()? as usize;
        let payload = decode_payload(c.bytes(len)?, layout, Draw::for_step(&job, step))?;
        trailing(&c)?;
        Ok(Self {
            job,
            epoch,
            step,
            member,
            train_loss,
            momentum_hash,
            basis,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{CompressConfig, Compressor};

    fn sample() -> (Layout, Contribution) {
        sample_with(Select::TopK)
    }

    fn sample_with(select: Select) -> (Layout, Contribution) {
        let shapes = vec![vec![128, 64], vec![64], vec![30, 7]];
        let cfg = CompressConfig {
            select,
            // Over 255, so the coefficient count needs its two bytes.
            topk: if select == Select::Shared { 300 } else { 4 },
            ..CompressConfig::default()
        };
        let layout = Layout::new(&shapes, &cfg);
        let mut c = Compressor::new(&layout, cfg);
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|p| {
                (0..layout.numel(p))
                    .map(|i| ((i * 7919 + p) % 97) as f32 - 48.0)
                    .collect()
            })
            .collect();
        let payload = c
            .compress(&layout, &grads, Draw::for_step(&[1; 32], 17))
            .unwrap();
        let contribution = Contribution {
            job: [1; 32],
            epoch: 2,
            step: 17,
            member: [3; 32],
            train_loss: 2.5,
            momentum_hash: [4; 32],
            basis: [5; 32],
            payload,
        };
        (layout, contribution)
    }

    #[test]
    fn round_trip_and_exact_size() {
        for select in [Select::TopK, Select::Shared] {
            let (layout, c) = sample_with(select);
            let bytes = c.encode(&layout);
            assert_eq!(bytes.len(), HEADER_LEN + payload_len(&layout));
            assert_eq!(Contribution::decode(&bytes, &layout).unwrap(), c);
        }
    }

    #[test]
    fn shared_signs_decode_at_the_positions_of_their_own_job_and_step() {
        let (layout, c) = sample_with(Select::Shared);
        let mut moved = c.clone();
        moved.step += 1;
        let back = Contribution::decode(&moved.encode(&layout), &layout).unwrap();
        assert_eq!(back.payload.params[0].neg, c.payload.params[0].neg);
        assert_ne!(back.payload.params[0].idx, c.payload.params[0].idx);
        back.payload
            .check_drawn(&layout, Draw::for_step(&back.job, back.step))
            .unwrap();
        // A payload of the other rule is refused, not misread.
        let (topk, t) = sample_with(Select::TopK);
        assert!(matches!(
            Contribution::decode(&t.encode(&topk), &layout),
            Err(EngineError::Shape(_))
        ));
    }

    #[test]
    fn truncated_payload_is_refused() {
        let (layout, c) = sample();
        let bytes = c.encode(&layout);
        for cut in [0, 3, HEADER_LEN - 1, HEADER_LEN + 5, bytes.len() - 1] {
            assert!(
                Contribution::decode(&bytes[..cut], &layout).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            Contribution::decode(&long, &layout),
            Err(EngineError::Malformed(_))
        ));
    }

    #[test]
    fn wrong_shape_is_refused() {
        let (layout, c) = sample();
        let bytes = c.encode(&layout);
        let other = Layout::new(
            &[vec![128, 32], vec![64], vec![30, 7]],
            &CompressConfig::default(),
        );
        assert!(matches!(
            Contribution::decode(&bytes, &other),
            Err(EngineError::Shape(_))
        ));
    }

    #[test]
    fn wrong_version_is_refused() {
        let (layout, c) = sample();
        let mut bytes = c.encode(&layout);
        bytes[3] = 1;
        assert!(matches!(
            Contribution::decode(&bytes, &layout),
            Err(EngineError::Version { found: 1, .. })
        ));
    }

    #[test]
    fn non_finite_loss_is_refused() {
        let (layout, mut c) = sample();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            c.train_loss = bad;
            let bytes = c.encode(&layout);
            assert!(matches!(
                Contribution::decode(&bytes, &layout),
                Err(EngineError::NonFinite(_))
            ));
        }
    }

    #[test]
    fn a_4096_chunk_costs_13_bits_a_coefficient_under_top_k_and_1_bit_shared() {
        let layout = Layout::new(&[vec![64, 64]], &CompressConfig::default());
        // 2 (count) + 1 (rule) + 4 + 2 + 2 (per-parameter header) + 4 * 13 bits = 7 bytes.
        assert_eq!(payload_len(&layout), 3 + 8 + 7);
        let shared = Layout::new(
            &[vec![64, 64]],
            &CompressConfig {
                topk: 61,
                select: Select::Shared,
                ..CompressConfig::default()
            },
        );
        assert_eq!(payload_len(&shared), 3 + 8 + 8);
    }

    #[test]
    fn a_signed_contribution_opens_only_with_its_member_s_signature() {
        let (layout, c) = sample();
        let key = ed25519::Keypair::generate();
        let mut c = c;
        c.member = key.public().to_bytes();
        let bytes = c.encode_signed(&layout, &key);
        assert_eq!(Contribution::decode_signed(&bytes, &layout).unwrap(), c);
        // Any byte changed, or the same bytes under another member's name,
        // and the signature no longer opens.
        for at in [10, HEADER_LEN + 3, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(
                Contribution::decode_signed(&bad, &layout).is_err(),
                "byte {at}"
            );
        }
        let other = ed25519::Keypair::generate();
        let mut forged = c.clone();
        forged.member = other.public().to_bytes();
        let mut under_other_name = forged.encode(&layout);
        under_other_name.extend_from_slice(&bytes[bytes.len() - SIGNATURE_LEN..]);
        assert!(matches!(
            Contribution::decode_signed(&under_other_name, &layout),
            Err(EngineError::Signature)
        ));
    }
}
