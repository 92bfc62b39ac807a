//! Master weights: f32 on the CPU, in a fixed parameter order, identical bit
//! for bit on every honest node.

#[derive(Debug, Clone, PartialEq)]
pub struct ParamSet {
    pub names: Vec<String>,
    pub shapes: Vec<Vec<usize>>,
    pub values: Vec<Vec<f32>>,
}

impl ParamSet {
    /// blake3 over a tag, then each parameter's name, shape and little-endian
    /// values in order: equal hashes mean equal models.
    pub fn model_hash(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"cohort-model-v1");
        for ((name, shape), values) in self.names.iter().zip(&self.shapes).zip(&self.values) {
            h.update(&(name.len() as u32).to_le_bytes());
            h.update(name.as_bytes());
            h.update(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                h.update(&(*d as u64).to_le_bytes());
            }
            let mut buf = Vec::with_capacity(values.len() * 4);
            for v in values {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            h.update(&buf);
        }
        *h.finalize().as_bytes()
    }

    pub fn numel(&self) -> usize {
        self.values.iter().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_sees_every_bit() {
        let p = ParamSet {
            names: vec!["a".into(), "b".into()],
            shapes: vec![vec![2], vec![1, 2]],
            values: vec![vec![1.0, 2.0], vec![3.0, 4.0]],
        };
        let mut q = p.clone();
        assert_eq!(p.model_hash(), q.model_hash());
        q.values[1][1] = f32::from_bits(4.0f32.to_bits() + 1);
        assert_ne!(p.model_hash(), q.model_hash());
        let mut r = p.clone();
        r.shapes[1] = vec![2, 1];
        assert_ne!(p.model_hash(), r.model_hash());
    }
}
