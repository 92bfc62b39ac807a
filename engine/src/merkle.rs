//! Merkle commitments: one 32-byte root in a signed message commits to many
//! pieces (a payload's shard slices today; its parts and a momentum's
//! chunks are the next users), each checkable alone with a short path.
//! Written here rather than taken from a crate because every node must
//! build the very same tree: blake3 with leaves and inner nodes tagged
//! apart (so an inner node cannot pose as a leaf), the leaf count bound
//! into the root (so a tree cannot pose as a longer one), and a level's odd
//! last node carried up unchanged.

/// A node of the tree, or its root.
pub type Hash = [u8; 32];

/// The hash of one piece.
pub fn leaf(bytes: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-merkle-leaf");
    h.update(bytes);
    *h.finalize().as_bytes()
}

fn node(left: &Hash, right: &Hash) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-merkle-node");
    h.update(left);
    h.update(right);
    *h.finalize().as_bytes()
}

fn seal(top: &Hash, count: usize) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-merkle-root");
    h.update(&(count as u64).to_le_bytes());
    h.update(top);
    *h.finalize().as_bytes()
}

fn up(level: &[Hash]) -> Vec<Hash> {
    level
        .chunks(2)
        .map(|p| {
            if p.len() == 2 {
                node(&p[0], &p[1])
            } else {
                p[0]
            }
        })
        .collect()
}

/// The root over `leaves`, in order.
pub fn root(leaves: &[Hash]) -> Hash {
    let mut level = leaves.to_vec();
    while level.len() > 1 {
        level = up(&level);
    }
    seal(&level.first().copied().unwrap_or([0; 32]), leaves.len())
}

/// The siblings that lead from leaf `index` to the root, bottom up (a
/// level where the node is carried up has none). Empty for an index past
/// the end.
pub fn path(leaves: &[Hash], index: usize) -> Vec<Hash> {
    let mut out = Vec::new();
    if index >= leaves.len() {
        return out;
    }
    let (mut level, mut i) = (leaves.to_vec(), index);
    while level.len() > 1 {
        let sibling = i ^ 1;
        if sibling < level.len() {
            out.push(level[sibling]);
        }
        level = up(&level);
        i /= 2;
    }
    out
}

/// Whether `leaf` is piece `index` of the `count` under `root`.
pub fn verify(root: &Hash, count: usize, index: usize, leaf: &Hash, path: &[Hash]) -> bool {
    if index >= count {
        return false;
    }
    let (mut cur, mut i, mut len, mut used) = (*leaf, index, count, 0usize);
    while len > 1 {
        let sibling = i ^ 1;
        if sibling < len {
            let Some(s) = path.get(used) else {
                return false;
            };
            used += 1;
            cur = if i % 2 == 0 {
                node(&cur, s)
            } else {
                node(s, &cur)
            };
        }
        i /= 2;
        len = len.div_ceil(2);
    }
    used == path.len() && seal(&cur, count) == *root
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n).map(|i| leaf(&(i as u32).to_le_bytes())).collect()
    }

    #[test]
    fn every_piece_verifies_with_its_path_for_every_tree_size() {
        for n in 1..40 {
            let l = leaves(n);
            let r = root(&l);
            for i in 0..n {
                let p = path(&l, i);
                assert!(p.len() <= (n as f64).log2().ceil() as usize);
                assert!(verify(&r, n, i, &l[i], &p), "n {n}, leaf {i}");
            }
        }
    }

    #[test]
    fn a_changed_piece_index_count_or_path_fails() {
        let l = leaves(13);
        let r = root(&l);
        let p = path(&l, 6);
        assert!(!verify(&r, 13, 6, &leaf(b"other"), &p));
        assert!(!verify(&r, 13, 7, &l[6], &p));
        assert!(!verify(&r, 14, 6, &l[6], &p));
        assert!(!verify(&r, 13, 13, &l[6], &p));
        let mut bent = p.clone();
        bent[1][0] ^= 1;
        assert!(!verify(&r, 13, 6, &l[6], &bent));
        assert!(!verify(&r, 13, 6, &l[6], &p[..p.len() - 1]));
        let mut longer = p.clone();
        longer.push([0; 32]);
        assert!(!verify(&r, 13, 6, &l[6], &longer));
    }

    #[test]
    fn the_root_binds_every_piece_and_the_count() {
        let l = leaves(9);
        let r = root(&l);
        for i in 0..9 {
            let mut m = l.clone();
            m[i][3] ^= 0x10;
            assert_ne!(root(&m), r);
        }
        // An inner node cannot pose as a leaf of a shorter tree.
        let top2 = up(&l[..4]);
        assert_ne!(root(&top2), root(&l[..4]));
        assert_ne!(root(&l[..8]), root(&l));
    }
}
