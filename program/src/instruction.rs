//! Instruction data. One tag byte, then fixed little-endian fields; the whole
//! buffer must be consumed. Account lists are documented per variant and built
//! by `client`, which is the only place clients should assemble them.

use crate::codec::{CodecError, Reader, Writer};
use crate::merkle::{Hash32, MAX_PROOF_LEN};
use crate::state::{Benchmark, JobSpec};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTerms {
    pub price: u64,
    pub available_from: i64,
    pub available_until: i64,
    pub benchmark: Benchmark,
}

impl NodeTerms {
    fn write(&self, w: &mut Writer) {
        w.u64(self.price)
            .i64(self.available_from)
            .i64(self.available_until);
        self.benchmark.write(w);
    }
    fn read(r: &mut Reader) -> Result<Self, CodecError> {
        Ok(Self {
            price: r.u64()?,
            available_from: r.i64()?,
            available_until: r.i64()?,
            benchmark: Benchmark::read(r)?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CohortInstruction {
    /// [owner (s, w), node (w), system program, rent]
    RegisterNode { terms: NodeTerms, stake: u64 },
    /// [owner (s, w), node (w), system program]
    UpdateNode { terms: NodeTerms, add_stake: u64 },
    /// [owner (s), node (w), clock]
    DeregisterNode,
    /// [owner (s, w), node (w), clock]
    CloseNode,
    /// [requester (s, w), job (w), requester account (w), system program, rent, clock]
    CreateJob {
        job_id: u64,
        spec: JobSpec,
        deposit: u64,
    },
    /// [owner (s, w), node (w), job (w), member (w), system program, rent, clock]
    JoinJob,
    /// [owner (s), node (w), job (w), member (w), last member (w)]
    LeaveJob,
    /// [cranker (s, w), job (w), epoch (w), system program, rent, clock]
    StartEpoch,
    /// [job, epoch (w), clock, slot hashes, then the member account of
    ///  each committee seat, in seat order]. Anyone may send it.
    SealEpoch,
    /// [job (w), epoch (w), clock]. Anyone may send it once the open
    /// epoch's deadline has passed unattested.
    SkipEpoch,
    /// [witness (s), node (w), member (w), job (w), epoch (w), clock]
    AttestEpoch {
        epoch: u32,
        model_hash: Hash32,
        root: Hash32,
        total_points: u64,
    },
    /// [owner (s, w), job (w), member (w)]
    Claim { points: u64, proof: Vec<Hash32> },
    /// [job (w), epoch, accused member (w), accused node (w), last member (w),
    ///  incinerator (w), clock, fraud case (w), payer (s, w), system program,
    ///  rent, then per witness: witness (s), witness member]. Votes add up
    ///  in the fraud case over transactions; the quorum's vote slashes.
    ReportFraud { epoch: u32, evidence: Hash32 },
    /// [requester (s, w), job (w), clock]
    CancelJob,
    /// [job (w), clock]
    ExpireJob,
    /// [owner (s, w), node (w), job (w), member (w), clock]; inside the claim
    /// window the member's points and proof settle what it is still owed.
    CloseMember { points: u64, proof: Vec<Hash32> },
    /// [rent payer (w), job, epoch (w), clock]
    CloseEpoch,
    /// [requester (s, w), job (w), incinerator (w), clock]
    CloseJob,
    /// [requester (s, w), job (w)]
    Withdraw,
    /// [rent payer (w), job, fraud case (w), clock]
    CloseFraudCase,
}

impl CohortInstruction {
    pub fn unpack(data: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new(data);
        let ix = match r.u8()? {
            0 => Self::RegisterNode {
                terms: NodeTerms::read(&mut r)?,
                stake: r.u64()?,
            },
            1 => Self::UpdateNode {
                terms: NodeTerms::read(&mut r)?,
                add_stake: r.u64()?,
            },
            2 => Self::DeregisterNode,
            3 => Self::CloseNode,
            4 => Self::CreateJob {
                job_id: r.u64()?,
                spec: JobSpec::read(&mut r)?,
                deposit: r.u64()?,
            },
            5 => Self::JoinJob,
            6 => Self::LeaveJob,
            7 => Self::StartEpoch,
            8 => Self::AttestEpoch {
                epoch: r.u32()?,
                model_hash: r.array()?,
                root: r.array()?,
                total_points: r.u64()?,
            },
            9 => {
                let (points, proof) = read_proof(&mut r)?;
                Self::Claim { points, proof }
            }
            10 => Self::ReportFraud {
                epoch: r.u32()?,
                evidence: r.array()?,
            },
            11 => Self::CancelJob,
            12 => Self::ExpireJob,
            13 => {
                let (points, proof) = read_proof(&mut r)?;
                Self::CloseMember { points, proof }
            }
            14 => Self::CloseEpoch,
            15 => Self::CloseJob,
            16 => Self::Withdraw,
            17 => Self::CloseFraudCase,
            18 => Self::SealEpoch,
            19 => Self::SkipEpoch,
            _ => return Err(CodecError),
        };
        r.finish()?;
        Ok(ix)
    }

    pub fn pack(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Self::RegisterNode { terms, stake } => {
                w.u8(0);
                terms.write(&mut w);
                w.u64(*stake);
            }
            Self::UpdateNode { terms, add_stake } => {
                w.u8(1);
                terms.write(&mut w);
                w.u64(*add_stake);
            }
            Self::DeregisterNode => {
                w.u8(2);
            }
            Self::CloseNode => {
                w.u8(3);
            }
            Self::CreateJob {
                job_id,
                spec,
                deposit,
            } => {
                w.u8(4).u64(*job_id);
                spec.write(&mut w);
                w.u64(*deposit);
            }
            Self::JoinJob => {
                w.u8(5);
            }
            Self::LeaveJob => {
                w.u8(6);
            }
            Self::StartEpoch => {
                w.u8(7);
            }
            Self::AttestEpoch {
                epoch,
                model_hash,
                root,
                total_points,
            } => {
                w.u8(8)
                    .u32(*epoch)
                    .bytes(model_hash)
                    .bytes(root)
                    .u64(*total_points);
            }
            Self::Claim { points, proof } => {
                w.u8(9);
                write_proof(&mut w, *points, proof);
            }
            Self::ReportFraud { epoch, evidence } => {
                w.u8(10).u32(*epoch).bytes(evidence);
            }
            Self::CancelJob => {
                w.u8(11);
            }
            Self::ExpireJob => {
                w.u8(12);
            }
            Self::CloseMember { points, proof } => {
                w.u8(13);
                write_proof(&mut w, *points, proof);
            }
            Self::CloseEpoch => {
                w.u8(14);
            }
            Self::CloseJob => {
                w.u8(15);
            }
            Self::Withdraw => {
                w.u8(16);
            }
            Self::CloseFraudCase => {
                w.u8(17);
            }
            Self::SealEpoch => {
                w.u8(18);
            }
            Self::SkipEpoch => {
                w.u8(19);
            }
        }
        w.buf
    }
}

/// Points, then a one-byte count (at most `MAX_PROOF_LEN`) of 32-byte siblings.
fn read_proof(r: &mut Reader) -> Result<(u64, Vec<Hash32>), CodecError> {
    let points = r.u64()?;
    let n = r.u8()? as usize;
    if n > MAX_PROOF_LEN {
        return Err(CodecError);
    }
    let mut proof = Vec::with_capacity(n);
    for _ in 0..n {
        proof.push(r.array()?);
    }
    Ok((points, proof))
}

fn write_proof(w: &mut Writer, points: u64, proof: &[Hash32]) {
    w.u64(points).u8(proof.len() as u8);
    for p in proof {
        w.bytes(p);
    }
}
