//! Whose state is wrong when a manifest's state hash is not this node's: a
//! single leader's word is evidence against that leader, and only more
//! distinct leaders than the job can have faulty members make this node
//! conclude that it diverged. Pure: the network node feeds it one check per
//! applied manifest of the same history.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conclusion {
    /// The leader's hash matched this node's state.
    Agreed,
    /// `leader` published a state hash this node does not have, and not
    /// enough other leaders agree with it: evidence against `leader`.
    Suspect { leader: u32 },
    /// More distinct leaders than could be faulty disagree with this node:
    /// it is this node whose state is wrong.
    Diverged,
}

#[derive(Debug, Clone)]
pub struct DivergenceVote {
    faulty: usize,
    /// Leaders whose state hash disagreed since a leader last agreed, with
    /// the step they disagreed at.
    disagreeing: BTreeMap<u32, u32>,
}

impl DivergenceVote {
    /// For a job of `members`: up to a third of them (at least one) may be
    /// faulty.
    pub fn new(members: u32) -> Self {
        Self {
            faulty: (members.saturating_sub(1) / 3).max(1) as usize,
            disagreeing: BTreeMap::new(),
        }
    }

    /// Most leaders that may disagree with an honest node's state.
    pub fn faulty(&self) -> usize {
        self.faulty
    }

    /// The state-hash check of `leader`'s manifest for `step`. A leader that
    /// agrees clears the count: this node's state was right there, so the
    /// leaders that disagreed before it lied.
    pub fn check(&mut self, step: u32, leader: u32, matches: bool) -> Conclusion {
        if matches {
            self.disagreeing.clear();
            return Conclusion::Agreed;
        }
        self.disagreeing.insert(leader, step);
        if self.disagreeing.len() > self.faulty {
            Conclusion::Diverged
        } else {
            Conclusion::Suspect { leader }
        }
    }

    /// Leaders that disagreed since the last agreement, with their steps.
    pub fn suspects(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.disagreeing.iter().map(|(l, s)| (*l, *s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_leader_with_a_bogus_state_hash_is_a_suspect_not_a_divergence() {
        let mut v = DivergenceVote::new(4);
        assert_eq!(v.check(3, 2, false), Conclusion::Suspect { leader: 2 });
        // The same liar again still counts once.
        assert_eq!(v.check(7, 2, false), Conclusion::Suspect { leader: 2 });
        assert_eq!(v.check(8, 0, true), Conclusion::Agreed);
        assert_eq!(v.suspects().count(), 0);
    }

    #[test]
    fn more_leaders_than_could_be_faulty_disagreeing_means_this_node_diverged() {
        let mut v = DivergenceVote::new(4);
        assert_eq!(v.faulty(), 1);
        assert_eq!(v.check(3, 1, false), Conclusion::Suspect { leader: 1 });
        assert_eq!(v.check(4, 2, false), Conclusion::Diverged);
        let mut big = DivergenceVote::new(10);
        assert_eq!(big.faulty(), 3);
        for (i, leader) in [4, 5, 6].into_iter().enumerate() {
            assert_eq!(
                big.check(i as u32, leader, false),
                Conclusion::Suspect { leader }
            );
        }
        assert_eq!(big.check(3, 7, false), Conclusion::Diverged);
    }

    #[test]
    fn even_a_three_member_job_survives_one_lying_leader() {
        let mut v = DivergenceVote::new(3);
        assert_eq!(v.check(0, 1, false), Conclusion::Suspect { leader: 1 });
        assert_eq!(v.check(1, 2, true), Conclusion::Agreed);
        assert_eq!(v.check(2, 0, true), Conclusion::Agreed);
    }
}
