//! The sharded exchange's arithmetic under the shared rule: how a step's
//! drawn positions split into shards, which members aggregate each shard,
//! the exact integer vote sums an aggregator publishes, the direction every
//! node decodes from those sums, and the check that pins a lying aggregator
//! to one position. Pure functions with no I/O, for the node and the
//! simulator alike (issue "Scale", item 2).
//!
//! Why the shared rule: every member votes on the same positions, so a
//! shard's aggregate is one integer per position, of a fixed size whatever
//! the member count, nothing is re-sparsified, and anyone holding the
//! members' signed slices recomputes it exactly.

use crate::compress::{Decode, Draw, Layout, Payload, Select, finish};
use crate::error::EngineError;
use std::ops::Range;

/// One shard: consecutive chunks, counted over every parameter in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// (parameter, its chunks in this shard), in order.
    pub pieces: Vec<(usize, Range<usize>)>,
    /// Drawn positions in the shard: the length of its vote sums.
    pub positions: usize,
}

/// A shard's published sums disagree with the members' slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "position {position} of the shard: the aggregator published {claimed}, the slices sum to {actual}"
)]
pub struct Fraud {
    pub position: usize,
    pub claimed: i32,
    pub actual: i32,
}

/// Splits `layout`'s drawn positions into `count` shards of nearly equal
/// size, never cutting a chunk.
pub fn split(layout: &Layout, count: usize) -> Result<Vec<Shard>, EngineError> {
    if layout.select != Select::Shared {
        return Err(EngineError::Config(
            "a sharded exchange needs the shared rule: top-k payloads name positions of their own"
                .into(),
        ));
    }
    let chunks: usize = layout.dcts.iter().map(|d| d.tiling.chunks()).sum();
    if count == 0 || count > chunks {
        return Err(EngineError::Config(format!(
            "{count} shards for {chunks} chunks: expected 1 to {chunks}"
        )));
    }
    let total: usize = (0..layout.dcts.len())
        .map(|p| layout.dcts[p].tiling.chunks() * layout.topk[p])
        .sum();
    let mut out: Vec<Shard> = Vec::with_capacity(count);
    let mut current = Shard {
        pieces: Vec::new(),
        positions: 0,
    };
    let mut done = 0usize;
    let mut left = chunks;
    for p in 0..layout.dcts.len() {
        let k = layout.topk[p];
        for ch in 0..layout.dcts[p].tiling.chunks() {
            match current.pieces.last_mut() {
                Some((q, r)) if *q == p && r.end == ch => r.end += 1,
                _ => current.pieces.push((p, ch..ch + 1)),
            }
            current.positions += k;
            done += k;
            left -= 1;
            let shards_left = count - out.len() - 1;
            // Close the shard at its share of the positions, or when every
            // chunk left is needed to give each later shard one.
            let share = done * count >= (out.len() + 1) * total;
            if shards_left > 0 && (share || left == shards_left) {
                out.push(std::mem::replace(
                    &mut current,
                    Shard {
                        pieces: Vec::new(),
                        positions: 0,
                    },
                ));
            }
        }
    }
    out.push(current);
    Ok(out)
}

/// The `redundancy` distinct members that aggregate each of `shards`
/// shards at a step: the members, sorted and deduplicated, shuffled by
/// `draw`, then dealt round
/// robin, so each aggregates `shards · redundancy / members` shards, give or
/// take one, and nobody picks what it aggregates.
pub fn aggregators(
    members: &[u32],
    shards: usize,
    redundancy: usize,
    draw: Draw,
) -> Result<Vec<Vec<u32>>, EngineError> {
    if redundancy == 0 || redundancy > members.len() {
        return Err(EngineError::Config(format!(
            "redundancy {redundancy} with {} members: expected 1 to {}",
            members.len(),
            members.len()
        )));
    }
    // A canonical list first, so the seats do not depend on the order the
    // caller happens to hold the members in.
    let mut order = members.to_vec();
    order.sort_unstable();
    order.dedup();
    if redundancy > order.len() {
        return Err(EngineError::Config(format!(
            "redundancy {redundancy} with {} distinct members",
            order.len()
        )));
    }
    draw.shuffle(&mut order);
    let n = order.len();
    Ok((0..shards)
        .map(|s| {
            (0..redundancy)
                .map(|j| order[(s * redundancy + j) % n])
                .collect()
        })
        .collect())
}

/// Rounds of reserve seats a shard has ([`reserve`]).
pub const RESERVE_ROUNDS: usize = 4;

/// Per shard, the seats that take it over when none of its aggregators
/// signs a sum (they are taken for dead), in the order they are called
/// on: [`RESERVE_ROUNDS`] rounds of `redundancy` members from a second
/// shuffle (`draw`, which must differ from the seats' own), never one of
/// the shard's seats, and fewer only when too few members are left. A
/// round that is silent too hands the shard to the next: with one round,
/// a shard whose two seats and two reserve seats were all dead stalled
/// its step; with four, a shard stalls only when ten members drawn for
/// it are all gone.
pub fn reserve(
    members: &[u32],
    seats: &[Vec<u32>],
    redundancy: usize,
    draw: Draw,
) -> Vec<Vec<u32>> {
    let mut order = members.to_vec();
    order.sort_unstable();
    order.dedup();
    draw.shuffle(&mut order);
    let n = order.len();
    seats
        .iter()
        .enumerate()
        .map(|(s, seat)| {
            (0..n)
                .map(|j| order[(s * redundancy + j) % n])
                .filter(|m| !seat.contains(m))
                .take(redundancy * RESERVE_ROUNDS)
                .collect()
        })
        .collect()
}

/// A member's signs in one shard, in order (true = negative): what it
/// sends that shard's aggregators.
pub fn slice(shard: &Shard, layout: &Layout, payload: &Payload) -> Vec<bool> {
    let mut out = Vec::with_capacity(shard.positions);
    for (p, chunks) in &shard.pieces {
        let k = layout.topk[*p];
        out.extend_from_slice(&payload.params[*p].neg[chunks.start * k..chunks.end * k]);
    }
    out
}

/// A member's whole payload from its slices of every shard, in order: the
/// inverse of [`slice`], with the positions `draw` names (the job's, at the
/// step). What a witness of the sharded exchange audits, since no node
/// holds a member's payload whole.
pub fn assemble(
    shards: &[Shard],
    layout: &Layout,
    slices: &[Vec<bool>],
    draw: Draw,
) -> Result<Payload, EngineError> {
    if slices.len() != shards.len() {
        return Err(EngineError::Shape(format!(
            "{} slices for {} shards",
            slices.len(),
            shards.len()
        )));
    }
    let mut neg: Vec<Vec<bool>> = (0..layout.dcts.len())
        .map(|p| Vec::with_capacity(layout.dcts[p].tiling.chunks() * layout.topk[p]))
        .collect();
    for (shard, signs) in shards.iter().zip(slices) {
        if signs.len() != shard.positions {
            return Err(EngineError::Shape(format!(
                "a slice of {} signs for a shard of {} positions",
                signs.len(),
                shard.positions
            )));
        }
        let mut at = 0;
        for (p, chunks) in &shard.pieces {
            let n = chunks.len() * layout.topk[*p];
            neg[*p].extend_from_slice(&signs[at..at + n]);
            at += n;
        }
    }
    let payload = Payload {
        params: neg
            .into_iter()
            .enumerate()
            .map(|(p, neg)| crate::compress::SparseSigns {
                idx: layout.drawn(p, draw),
                neg,
            })
            .collect(),
    };
    payload.validate(layout)?;
    Ok(payload)
}

/// The leaf that commits to slice `index` of a payload: the shard's
/// number and its signs, packed 8 to a byte.
pub fn slice_leaf(index: usize, signs: &[bool]) -> crate::merkle::Hash {
    let mut bytes = Vec::with_capacity(8 + signs.len().div_ceil(8));
    bytes.extend_from_slice(&(index as u32).to_le_bytes());
    bytes.extend_from_slice(&(signs.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&pack_signs(signs));
    crate::merkle::leaf(&bytes)
}

/// Signs packed 8 to a byte, the first in the lowest bit: how a slice
/// travels and is committed to.
pub fn pack_signs(signs: &[bool]) -> Vec<u8> {
    signs
        .chunks(8)
        .map(|byte| {
            byte.iter()
                .enumerate()
                .fold(0u8, |b, (i, s)| b | (u8::from(*s) << i))
        })
        .collect()
}

/// `count` signs from [`pack_signs`]' bytes; None unless the bytes are
/// exactly that many, with the last byte's spare bits clear (so one slice
/// has one encoding).
pub fn unpack_signs(bytes: &[u8], count: usize) -> Option<Vec<bool>> {
    if bytes.len() != count.div_ceil(8) {
        return None;
    }
    let spare = bytes.len() * 8 - count;
    if spare > 0 && bytes[bytes.len() - 1] >> (8 - spare) != 0 {
        return None;
    }
    Some(
        (0..count)
            .map(|i| bytes[i / 8] >> (i % 8) & 1 == 1)
            .collect(),
    )
}

/// A shard's vote sums as they travel: their count (u32), the bits each
/// takes (u8), then each sum offset by half the range and packed
/// low bit first. The width follows the sums (7 bits for 48 one-vote
/// members), so an aggregate costs what the simulator assumes, and every
/// aggregator of a shard sends the same bytes.
pub fn pack_sums(sums: &[i32]) -> Vec<u8> {
    let widest = sums.iter().map(|&v| bits_for(v)).max().unwrap_or(1);
    let mut out = Vec::with_capacity(5 + (sums.len() * widest as usize).div_ceil(8));
    out.extend_from_slice(&(sums.len() as u32).to_le_bytes());
    out.push(widest);
    let half = 1i64 << (widest - 1);
    let (mut acc, mut held) = (0u64, 0u32);
    for &v in sums {
        acc |= ((i64::from(v) + half) as u64) << held;
        held += u32::from(widest);
        while held >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        out.push(acc as u8);
    }
    out
}

/// Sums from [`pack_sums`]' bytes; None for any other encoding (a wrong
/// length, a width outside 1–32, spare bits set, a width wider than the
/// sums need).
pub fn unpack_sums(bytes: &[u8]) -> Option<Vec<i32>> {
    let count = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let width = *bytes.get(4)?;
    if !(1..=32).contains(&width) {
        return None;
    }
    let body = &bytes[5..];
    let bits = count.checked_mul(usize::from(width))?;
    if body.len() != bits.div_ceil(8) {
        return None;
    }
    let half = 1i64 << (width - 1);
    let mask = (1u64 << width) - 1;
    let mut out = Vec::with_capacity(count);
    let (mut acc, mut held, mut next) = (0u64, 0u32, 0usize);
    for _ in 0..count {
        while held < u32::from(width) {
            acc |= u64::from(body[next]) << held;
            next += 1;
            held += 8;
        }
        out.push(((acc & mask) as i64 - half) as i32);
        acc >>= width;
        held -= u32::from(width);
    }
    let widest = out.iter().map(|&v| bits_for(v)).max().unwrap_or(1);
    (acc == 0 && widest == width).then_some(out)
}

/// Bits a sum takes offset by half the range: the least w with
/// -2^(w-1) <= v < 2^(w-1).
fn bits_for(v: i32) -> u8 {
    let magnitude = if v < 0 { !v } else { v } as u32;
    (33 - magnitude.leading_zeros()) as u8
}

/// The root a member signs in its announcement, over its slices of every
/// shard in order: an aggregator checks the one slice it gets with
/// [`crate::merkle::verify`] and its path, without the rest of the payload.
pub fn commit(slices: &[Vec<bool>]) -> crate::merkle::Hash {
    let leaves: Vec<_> = slices
        .iter()
        .enumerate()
        .map(|(i, s)| slice_leaf(i, s))
        .collect();
    crate::merkle::root(&leaves)
}

/// The integer vote sum per position of one shard over weighted slices:
/// what its aggregators publish. Integers, so every honest aggregator
/// publishes the same sums in any order.
pub fn sum(slices: &[(&[bool], i32)], positions: usize) -> Result<Vec<i32>, EngineError> {
    let mut out = vec![0i32; positions];
    for (s, w) in slices {
        if s.len() != positions {
            return Err(EngineError::Shape(format!(
                "a slice of {} signs for a shard of {positions} positions",
                s.len()
            )));
        }
        for (o, neg) in out.iter_mut().zip(s.iter()) {
            *o += if *neg { -w } else { *w };
        }
    }
    Ok(out)
}

/// The votes one shard's listed slices get: the screen of the all-to-all
/// exchange ([`crate::audit::screen`]) run on the shard alone, so a slice
/// whose signs go against the others' there gets no vote, as a flagged
/// payload gets none on the all-to-all exchange. A pure function of the
/// listed slices: every seat of the shard and every node that recomputes
/// it weighs them alike, so the sums stay exact and checkable. The first
/// pass judges each slice's sign agreement with every other slice's votes
/// (a tie counts half); the second judges the slices it flagged again
/// against the kept ones only, so that attackers who overturn a position
/// together cannot get the honest voters there flagged with them. Fewer
/// than [`crate::audit::MIN_SCREENED`] slices have no majority to judge
/// by: every one keeps its vote.
pub fn votes(slices: &[&[bool]]) -> Vec<i32> {
    let min_agreement = crate::audit::SCREEN.agreement;
    let n = slices.len();
    if n < crate::audit::MIN_SCREENED || slices.iter().any(|s| s.len() != slices[0].len()) {
        return vec![1; n];
    }
    let tally = |counted: &[bool]| -> Vec<i64> {
        let mut v = vec![0i64; slices[0].len()];
        for (s, _) in slices.iter().zip(counted).filter(|(_, c)| **c) {
            for (x, neg) in v.iter_mut().zip(s.iter()) {
                *x += if *neg { -1 } else { 1 };
            }
        }
        v
    };
    // Agreement of slice `i` with `votes`, its own vote taken out if counted.
    let agreement = |i: usize, votes: &[i64], counted: bool| -> f32 {
        let agree: usize = slices[i]
            .iter()
            .zip(votes)
            .map(|(neg, v)| {
                let own: i64 = if *neg { -1 } else { 1 };
                let others = v - if counted { own } else { 0 };
                match (others * own).signum() {
                    1 => 2,
                    0 => 1,
                    _ => 0,
                }
            })
            .sum();
        agree as f32 / (2 * slices[i].len().max(1)) as f32
    };
    let everyone = vec![true; n];
    let all = tally(&everyone);
    let mut kept: Vec<bool> = (0..n)
        .map(|i| agreement(i, &all, true) >= min_agreement)
        .collect();
    let count = kept.iter().filter(|k| **k).count();
    if count < n && count >= crate::audit::MIN_SCREENED {
        let honest = tally(&kept);
        let cleared: Vec<usize> = (0..n)
            .filter(|&i| !kept[i] && agreement(i, &honest, false) >= min_agreement)
            .collect();
        for i in cleared {
            kept[i] = true;
        }
    }
    kept.into_iter().map(i32::from).collect()
}

/// Checks published sums against the slices they claim to sum: the first
/// position that differs is the fraud proof, checkable by anyone holding
/// the members' signed slices. Sums or slices of the wrong length for the
/// shard are a shape error, not a fraud: nothing can be pinned on them.
pub fn check(
    shard: &Shard,
    claimed: &[i32],
    slices: &[(&[bool], i32)],
) -> Result<Result<(), Fraud>, EngineError> {
    if claimed.len() != shard.positions {
        return Err(EngineError::Shape(format!(
            "{} sums published for a shard of {} positions",
            claimed.len(),
            shard.positions
        )));
    }
    let actual = sum(slices, shard.positions)?;
    Ok(
        match claimed.iter().zip(&actual).position(|(c, a)| c != a) {
            None => Ok(()),
            Some(position) => Err(Fraud {
                position,
                claimed: claimed[position],
                actual: actual[position],
            }),
        },
    )
}

/// The update direction decoded from every shard's sums: the same bits as
/// [`crate::compress::aggregate`] over the members' whole payloads, since
/// within a chunk the basis functions go in in the same ascending order.
pub fn decode(
    layout: &Layout,
    shards: &[Shard],
    sums: &[Vec<i32>],
    draw: Draw,
    decode: Decode,
) -> Result<Vec<Vec<f32>>, EngineError> {
    if sums.len() != shards.len() || shards.iter().zip(sums).any(|(s, v)| s.positions != v.len()) {
        return Err(EngineError::Shape(
            "the sums do not match the shards".into(),
        ));
    }
    let mut x: Vec<Vec<f32>> = (0..layout.dcts.len())
        .map(|p| vec![0f32; layout.numel(p)])
        .collect();
    let drawn: Vec<Vec<u16>> = (0..layout.dcts.len())
        .map(|p| layout.drawn(p, draw))
        .collect();
    for (shard, v) in shards.iter().zip(sums) {
        let mut at = 0;
        for (p, chunks) in &shard.pieces {
            let (k, dct) = (layout.topk[*p], &layout.dcts[*p]);
            for ch in chunks.clone() {
                for (i, s) in drawn[*p][ch * k..(ch + 1) * k].iter().zip(&v[at..at + k]) {
                    if *s != 0 {
                        dct.add_basis(&mut x[*p], ch, *i as usize, *s as f32);
                    }
                }
                at += k;
            }
        }
    }
    x.iter_mut().for_each(|x| finish(x, decode));
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{CompressConfig, Compressor, aggregate};

    fn layout() -> Layout {
        Layout::new(
            &[vec![128, 64], vec![64], vec![96, 40]],
            &CompressConfig {
                max_chunk: 32,
                topk: 9,
                select: Select::Shared,
                ..CompressConfig::default()
            },
        )
    }

    /// `n` members' payloads for one step.
    fn payloads(layout: &Layout, n: usize, draw: Draw) -> Vec<Payload> {
        (0..n)
            .map(|m| {
                let mut c = Compressor::new(
                    layout,
                    CompressConfig {
                        select: Select::Shared,
                        ..CompressConfig::default()
                    },
                );
                let g: Vec<Vec<f32>> = (0..layout.dcts.len())
                    .map(|p| crate::dct::test_values(layout.numel(p), (100 * m + p) as u64))
                    .collect();
                c.compress(layout, &g, draw).unwrap()
            })
            .collect()
    }

    #[test]
    fn sums_travel_in_as_few_bits_as_they_need_and_only_one_encoding_reads_back() {
        // 48 one-vote members: -48..=48 takes 7 bits, as the simulator
        // assumes.
        let sums: Vec<i32> = (-48..=48).collect();
        let packed = pack_sums(&sums);
        assert_eq!(packed[4], 7);
        assert_eq!(packed.len(), 5 + (97 * 7usize).div_ceil(8));
        assert_eq!(unpack_sums(&packed).unwrap(), sums);
        for v in [
            vec![],
            vec![0],
            vec![-1],
            vec![1],
            vec![i32::MIN, i32::MAX, 0, -7],
        ] {
            assert_eq!(unpack_sums(&pack_sums(&v)).unwrap(), v, "{v:?}");
        }
        assert_eq!(pack_sums(&[-64, 63])[4], 7);
        assert_eq!(pack_sums(&[64])[4], 8);
        // Any other bytes: cut, padded, spare bits set, or wider than needed.
        assert!(unpack_sums(&packed[..packed.len() - 1]).is_none());
        let mut longer = packed.clone();
        longer.push(0);
        assert!(unpack_sums(&longer).is_none());
        let mut spare = pack_sums(&[1, 2, 3]);
        *spare.last_mut().unwrap() |= 0x80;
        assert!(unpack_sums(&spare).is_none());
        let mut wide = vec![1, 0, 0, 0, 8];
        wide.push(128 + 3);
        assert!(unpack_sums(&wide).is_none(), "3 in 8 bits when 3 suffice");
        assert!(unpack_sums(&[1, 0, 0, 0, 33, 0, 0, 0, 0, 0]).is_none());
    }

    #[test]
    fn signs_pack_eight_to_a_byte_and_spare_bits_must_be_clear() {
        let signs: Vec<bool> = (0..13).map(|i| i % 3 == 0).collect();
        let packed = pack_signs(&signs);
        assert_eq!(packed.len(), 2);
        assert_eq!(unpack_signs(&packed, 13).unwrap(), signs);
        assert!(unpack_signs(&packed, 12).is_none());
        assert!(unpack_signs(&packed, 17).is_none());
        let mut dirty = packed.clone();
        dirty[1] |= 0x80;
        assert!(unpack_signs(&dirty, 13).is_none());
        assert_eq!(unpack_signs(&[], 0).unwrap(), Vec::<bool>::new());
    }

    #[test]
    fn shards_cover_every_position_once_in_order_and_nearly_equally() {
        let l = layout();
        let total: usize = (0..3).map(|p| l.dcts[p].tiling.chunks() * l.topk[p]).sum();
        for count in [1, 2, 5, 7] {
            let s = split(&l, count).unwrap();
            assert_eq!(s.len(), count);
            assert_eq!(s.iter().map(|s| s.positions).sum::<usize>(), total);
            let mut next = (0, 0);
            for shard in &s {
                for (p, r) in &shard.pieces {
                    if (*p, r.start) != next {
                        assert_eq!((*p, r.start), (next.0 + 1, 0), "a gap or an overlap");
                    }
                    next = (*p, r.end);
                }
            }
            let biggest_chunk = 9;
            let (lo, hi) = (
                s.iter().map(|s| s.positions).min().unwrap(),
                s.iter().map(|s| s.positions).max().unwrap(),
            );
            assert!(hi - lo <= 2 * biggest_chunk, "{count} shards: {lo}..{hi}");
        }
        assert!(split(&l, 0).is_err());
        let topk = Layout::new(&[vec![64, 64]], &CompressConfig::default());
        assert!(
            split(&topk, 1).is_err(),
            "top-k payloads cannot be summed by shard"
        );
    }

    #[test]
    fn every_shard_gets_distinct_aggregators_and_the_load_is_even_and_moves_each_step() {
        let members: Vec<u32> = (0..10).collect();
        let a = aggregators(&members, 16, 3, Draw(1)).unwrap();
        let mut load = [0usize; 10];
        for agg in &a {
            let mut d = agg.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 3, "{agg:?}");
            agg.iter().for_each(|m| load[*m as usize] += 1);
        }
        // 16 shards × 3 = 48 seats over 10 members: 4 or 5 each.
        assert!(load.iter().all(|l| (4..=5).contains(l)), "{load:?}");
        assert_ne!(a, aggregators(&members, 16, 3, Draw(2)).unwrap());
        // The caller's order does not matter.
        let reversed: Vec<u32> = members.iter().rev().copied().collect();
        assert_eq!(a, aggregators(&reversed, 16, 3, Draw(1)).unwrap());
        assert!(aggregators(&members, 16, 11, Draw(1)).is_err());
    }

    #[test]
    fn reserve_seats_are_never_the_shards_own_and_every_caller_draws_the_same() {
        let members: Vec<u32> = (0..10).collect();
        let seats = aggregators(&members, 10, 2, Draw(1)).unwrap();
        let r = reserve(&members, &seats, 2, Draw(9));
        assert_eq!(r.len(), 10);
        for (seat, res) in seats.iter().zip(&r) {
            // Every member but the shard's own seats, up to four rounds.
            assert_eq!(res.len(), 8);
            assert!(res.iter().all(|m| !seat.contains(m)), "{seat:?} {res:?}");
            let mut distinct = res.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), res.len(), "{res:?}");
        }
        let reversed: Vec<u32> = members.iter().rev().copied().collect();
        assert_eq!(r, reserve(&reversed, &seats, 2, Draw(9)));
        // With only the seats themselves as members, there is no reserve.
        let two = aggregators(&[3, 4], 1, 2, Draw(1)).unwrap();
        assert_eq!(reserve(&[3, 4], &two, 2, Draw(9)), vec![Vec::<u32>::new()]);
    }

    #[test]
    fn decoding_the_shard_sums_gives_the_all_to_all_direction_bit_for_bit() {
        let l = layout();
        let draw = Draw::for_step(&[3; 32], 11);
        let ps = payloads(&l, 5, draw);
        // One payload flagged by the screen: weight 0, as the node applies.
        let weights = [1, 1, 0, 1, 1];
        let shards = split(&l, 7).unwrap();
        let sums: Vec<Vec<i32>> = shards
            .iter()
            .map(|s| {
                let slices: Vec<Vec<bool>> = ps.iter().map(|p| slice(s, &l, p)).collect();
                let weighted: Vec<(&[bool], i32)> = slices
                    .iter()
                    .zip(weights)
                    .map(|(s, w)| (s.as_slice(), w))
                    .collect();
                sum(&weighted, s.positions).unwrap()
            })
            .collect();
        let whole: Vec<(&Payload, i32)> = ps.iter().zip(weights).collect();
        for d in [Decode::Sign, Decode::Rms] {
            assert_eq!(
                decode(&l, &shards, &sums, draw, d).unwrap(),
                aggregate(&l, &whole, d),
                "{d:?}"
            );
        }
    }

    #[test]
    fn each_slice_checks_alone_against_the_signed_root_and_a_flipped_sign_does_not() {
        let layout = layout();
        let shards = split(&layout, 5).unwrap();
        let p = &payloads(&layout, 1, Draw(11))[0];
        let slices: Vec<Vec<bool>> = shards.iter().map(|s| slice(s, &layout, p)).collect();
        let root = commit(&slices);
        let leaves: Vec<_> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| slice_leaf(i, s))
            .collect();
        for (i, s) in slices.iter().enumerate() {
            let path = crate::merkle::path(&leaves, i);
            assert!(crate::merkle::verify(&root, 5, i, &slice_leaf(i, s), &path));
            let mut flipped = s.clone();
            flipped[s.len() / 2] ^= true;
            assert!(!crate::merkle::verify(
                &root,
                5,
                i,
                &slice_leaf(i, &flipped),
                &path
            ));
            // Nor does a slice pass as another shard's.
            let j = (i + 1) % 5;
            assert!(!crate::merkle::verify(
                &root,
                5,
                j,
                &slice_leaf(j, s),
                &path
            ));
        }
    }

    #[test]
    fn a_payload_cut_into_slices_is_assembled_back_whole_and_a_short_slice_is_refused() {
        let layout = layout();
        let draw = Draw::for_step(&[3; 32], 7);
        let p = payloads(&layout, 1, draw).remove(0);
        for count in [1, 2, 5] {
            let shards = split(&layout, count).unwrap();
            let mut slices: Vec<Vec<bool>> = shards.iter().map(|s| slice(s, &layout, &p)).collect();
            assert_eq!(assemble(&shards, &layout, &slices, draw).unwrap(), p);
            slices[0].pop();
            assert!(assemble(&shards, &layout, &slices, draw).is_err());
            assert!(assemble(&shards, &layout, &slices[1..], draw).is_err());
        }
    }

    #[test]
    fn a_slice_against_the_others_gets_no_vote_in_its_shard_and_too_few_slices_keep_theirs() {
        // Four members agree on 10 signs, a fifth flips them all.
        let honest: Vec<bool> = (0..10).map(|i| i % 3 == 0).collect();
        let flipped: Vec<bool> = honest.iter().map(|b| !b).collect();
        let mut near = honest.clone();
        near[0] = !near[0];
        let slices: Vec<&[bool]> = vec![&honest, &honest, &near, &honest, &flipped];
        assert_eq!(votes(&slices), vec![1, 1, 1, 1, 0]);
        // Two slices: no majority to judge by.
        assert_eq!(votes(&[&honest, &flipped]), vec![1, 1]);
        // The same on every node whatever the order it lists them in.
        let reversed: Vec<&[bool]> = slices.iter().rev().copied().collect();
        assert_eq!(votes(&reversed), vec![0, 1, 1, 1, 1]);
        // Two flippers among seven: both lose their votes, nobody else does.
        let mut mixed: Vec<&[bool]> = vec![&honest[..]; 5];
        mixed.extend([&flipped[..], &flipped[..]]);
        assert_eq!(votes(&mixed), vec![1, 1, 1, 1, 1, 0, 0]);
    }

    #[test]
    fn a_lying_aggregator_is_pinned_to_the_first_position_it_changed() {
        let l = layout();
        let draw = Draw(9);
        let ps = payloads(&l, 4, draw);
        let shard = &split(&l, 3).unwrap()[1];
        let slices: Vec<Vec<bool>> = ps.iter().map(|p| slice(shard, &l, p)).collect();
        let weighted: Vec<(&[bool], i32)> = slices.iter().map(|s| (s.as_slice(), 1)).collect();
        let honest = sum(&weighted, shard.positions).unwrap();
        assert_eq!(check(shard, &honest, &weighted).unwrap(), Ok(()));
        let mut lie = honest.clone();
        lie[17] += 2;
        lie[40] = -lie[40] - 2;
        assert_eq!(
            check(shard, &lie, &weighted).unwrap(),
            Err(Fraud {
                position: 17,
                claimed: honest[17] + 2,
                actual: honest[17]
            })
        );
        // Sums of the wrong length, or a short slice, prove nothing.
        assert!(check(shard, &honest[1..], &weighted).is_err());
        let short: Vec<(&[bool], i32)> = vec![(&slices[0][1..], 1)];
        assert!(check(shard, &honest, &short).is_err());
    }
}
