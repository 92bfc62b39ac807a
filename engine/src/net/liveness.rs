//! How often a member says it is alive, how long its silence means it is
//! gone, and what a job's gossip costs each member's links: one rule for
//! the node, its step machine and both simulators.
//!
//! Why a rule: every heartbeat goes to every member by gossip, and each
//! member receives and relays every message about once per mesh peer. At
//! one heartbeat per member every 0.5 s, a job of 1,000 would put 2,000
//! messages a second through every member, several times over (about 29
//! Mbit/s each way on the wire, more than a home uplink). So the whole job
//! sends at most [`JOB_BEATS_PER_SEC`]: each member every 0.5 s up to 50
//! members, then less often, and silence means "gone" after the same
//! number of missed beats at any size.
//!
//! A member that announces a contribution every step is heard by every
//! member each step anyway, and its announcement carries its history as a
//! heartbeat does: so it skips the beats that fall soon after its own
//! announcement ([`beat_due`]), in a job large enough that its beats are
//! capped. At 1,000 members, where a member beats every 10 s and a step
//! takes about 12 s, that leaves about one beat in five; a member that
//! stops announcing beats again.

use std::time::Duration;

/// Heartbeats the whole job sends per second, every member's together.
pub const JOB_BEATS_PER_SEC: f64 = 100.0;
/// The most often one member beats.
pub const FASTEST_BEAT: Duration = Duration::from_millis(500);
/// Beats missed before a member counts as gone to the step machine.
pub const BEATS_TO_GONE: u32 = 4;

/// How often each of `members` sends its heartbeat: every 0.5 s up to 50
/// members, then `members / JOB_BEATS_PER_SEC` seconds (10 s at 1,000).
pub fn beat_interval(members: u32) -> Duration {
    FASTEST_BEAT.max(Duration::from_secs_f64(members as f64 / JOB_BEATS_PER_SEC))
}

/// How long a member unheard of counts as alive: `floor` (the shipped
/// `step::Timing::alive`, 2 s, is four beats at 0.5 s), or
/// [`BEATS_TO_GONE`] beats when those are longer.
pub fn alive_window(members: u32, floor: Duration) -> Duration {
    floor.max(beat_interval(members) * BEATS_TO_GONE)
}

/// How long after its own announcement a member skips its beats: the
/// next beat then still goes out within half of [`alive_window`] (one
/// interval later at most), as a member that does not announce leaves at
/// most a quarter of it between beats. None in a job whose members beat
/// at [`FASTEST_BEAT`] (50 members or fewer): there a step holds many
/// beats, so an announcement would stand in for few of them, and the
/// beats keep what only they carry (audits still open, the first step a
/// rejoiner contributes to, the updates applied) fresh to the half
/// second.
pub fn quiet_after_announce(members: u32, floor: Duration) -> Duration {
    let interval = beat_interval(members);
    if interval <= FASTEST_BEAT {
        return Duration::ZERO;
    }
    (alive_window(members, floor) / 2).saturating_sub(interval)
}

/// Whether a member's heartbeat is due at a tick of its beat timer,
/// `since_announce` after its last announcement (None: none yet): not
/// while that announcement, which shows it alive and its history, is
/// younger than [`quiet_after_announce`].
pub fn beat_due(members: u32, floor: Duration, since_announce: Option<Duration>) -> bool {
    since_announce.is_none_or(|s| s >= quiet_after_announce(members, floor))
}

/// Beats a member sends a second while it announces every `step_secs`:
/// of its timer's ticks (at a phase of its own), those within
/// [`quiet_after_announce`] of an announcement are skipped.
pub fn beats_per_sec_announcing(members: u32, floor: Duration, step_secs: f64) -> f64 {
    let interval = beat_interval(members).as_secs_f64();
    let quiet = quiet_after_announce(members, floor).as_secs_f64();
    let step = step_secs.max(1e-3);
    (step - quiet).max(0.0) / (interval * step)
}

/// Gossipsub's mesh degree (`swarm::gossip_config`).
pub const MESH_N: usize = 6;
/// Copies of each gossip message a member receives, and sends, about: one
/// per mesh peer, as gossipsub relays every message to its mesh, sends its
/// own to its mesh too (flood publishing is off), and small messages are
/// not spared duplicates.
pub const MESH_COPIES: f64 = MESH_N as f64;
/// Bytes gossipsub adds to each message on the wire, about: the topic
/// (`swarm::topic`, 25 to 27 bytes, and its field's 2) and the protobuf
/// framing of the data, the message and the RPC (7). Since message version
/// 8 it adds no author, sequence number or signature
/// (`swarm::GossipSigning`), which took 116 bytes more (140 was charged).
/// Transport framing (yamux, noise) is not counted, as before.
pub const GOSSIPSUB_OVERHEAD: f64 = 36.0;
/// Our signed envelope (magic, version, kind, signer, signature).
pub const ENVELOPE: f64 = 101.0;
/// A heartbeat's body: job, epoch, member, seq, ready_from, applied,
/// auditing, chain_step, chain.
pub const HEARTBEAT_BODY: f64 = 32.0 + 4.0 + 4.0 + 8.0 + 4.0 + 4.0 + 4.0 + 4.0 + 32.0;
/// An announcement's body: job, epoch, step, member, payload hash,
/// momentum hash, basis, len, produced_us, chain_step, chain. (Before
/// message version 11 it had no history, and this model left the basis
/// out: 120 bytes were charged for 152.)
pub const ANNOUNCE_BODY: f64 = 32.0 + 4.0 + 4.0 + 4.0 + 32.0 + 32.0 + 32.0 + 4.0 + 8.0 + 4.0 + 32.0;
/// A manifest's body with `members` entries.
pub fn manifest_body(members: u32) -> f64 {
    32.0 + 4.0 + 4.0 + 1.0 + 4.0 + 32.0 + 32.0 + 2.0 + 36.0 * members as f64
}
/// A sum hash's body (sharded exchange).
pub const SUM_HASH_BODY: f64 = 32.0 + 4.0 + 4.0 + 4.0 + 4.0 + 32.0 + 32.0;

fn wire(body: f64) -> f64 {
    body + ENVELOPE + GOSSIPSUB_OVERHEAD
}

fn copies(members: u32) -> f64 {
    MESH_COPIES.min(members.saturating_sub(1) as f64)
}

/// What the job's heartbeats cost each member, per direction, in bytes a
/// second: every member's at [`beat_interval`], each received and relayed
/// about [`MESH_COPIES`] times.
pub fn heartbeat_bytes_per_sec(members: u32) -> f64 {
    copies(members) * members as f64 / beat_interval(members).as_secs_f64() * wire(HEARTBEAT_BODY)
}

/// The same while every member announces every `step_secs` and skips the
/// beats its announcements stand in for ([`beats_per_sec_announcing`]).
pub fn heartbeat_bytes_per_sec_announcing(members: u32, floor: Duration, step_secs: f64) -> f64 {
    copies(members)
        * members as f64
        * beats_per_sec_announcing(members, floor, step_secs)
        * wire(HEARTBEAT_BODY)
}

/// What one step's gossip costs each member, per direction, in bytes:
/// every member's announcement, the manifests (1.5 a step: fall-backs and
/// late leaders add some) and `sum_hashes` sum hashes (none on the
/// all-to-all exchange, and none on the sharded one since message version
/// 9, whose seats send them by request: a what-if of the gossip before),
/// each received and relayed about [`MESH_COPIES`] times.
pub fn step_gossip_bytes(members: u32, sum_hashes: u64) -> f64 {
    copies(members)
        * (members as f64 * wire(ANNOUNCE_BODY)
            + 1.5 * wire(manifest_body(members))
            + sum_hashes as f64 * wire(SUM_HASH_BODY))
}

/// Both, as bytes a second for steps of about `step_secs`. Calibrated
/// against `cohort-bench traffic` (8 members): see `docs/p2p.md`.
pub fn gossip_bytes_per_sec(members: u32, step_secs: f64, sum_hashes: u64) -> f64 {
    heartbeat_bytes_per_sec(members) + step_gossip_bytes(members, sum_hashes) / step_secs.max(1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_s_heartbeats_stay_within_a_fixed_rate_whatever_its_size() {
        assert_eq!(beat_interval(8), FASTEST_BEAT);
        assert_eq!(beat_interval(50), FASTEST_BEAT);
        assert_eq!(beat_interval(1000), Duration::from_secs(10));
        for n in [2u32, 8, 48, 50, 51, 200, 1000, 5000] {
            let job_rate = n as f64 / beat_interval(n).as_secs_f64();
            assert!(job_rate <= JOB_BEATS_PER_SEC + 1e-9, "{n}: {job_rate}");
        }
        // Gone after the same number of missed beats at every size, and
        // never sooner than the floor.
        let floor = Duration::from_secs(2);
        assert_eq!(alive_window(8, floor), floor);
        assert_eq!(alive_window(1000, floor), Duration::from_secs(40));
    }

    #[test]
    fn a_member_that_announced_lately_skips_its_beat_and_is_still_heard_within_half_its_window() {
        let floor = Duration::from_secs(2);
        for n in [2u32, 8, 48, 50, 51, 200, 1000, 5000] {
            let quiet = quiet_after_announce(n, floor);
            let interval = beat_interval(n);
            assert!(beat_due(n, floor, None), "{n}: no announcement yet");
            assert!(beat_due(n, floor, Some(quiet)), "{n}");
            if !quiet.is_zero() {
                assert!(!beat_due(n, floor, Some(quiet - Duration::from_millis(1))));
            }
            // The longest silence: a tick just inside the quiet time is
            // skipped, the next one beats.
            assert!(quiet + interval <= alive_window(n, floor) / 2, "{n}");
        }
        assert_eq!(quiet_after_announce(1000, floor), Duration::from_secs(10));
        // Up to 50 members every beat goes out, announced or not.
        assert_eq!(quiet_after_announce(50, floor), Duration::ZERO);
        assert!(beat_due(8, floor, Some(Duration::ZERO)));
        assert_eq!(
            heartbeat_bytes_per_sec_announcing(48, floor, 10.0),
            heartbeat_bytes_per_sec(48)
        );
        assert!(quiet_after_announce(51, floor) > Duration::ZERO);
        // At 1,000 members and 12.4 s steps about one tick in five beats.
        let full = 1.0 / beat_interval(1000).as_secs_f64();
        let skipping = beats_per_sec_announcing(1000, floor, 12.4);
        assert!((skipping / full - 2.4 / 12.4).abs() < 1e-9, "{skipping}");
        // Steps shorter than the quiet time: no beat at all.
        assert_eq!(beats_per_sec_announcing(1000, floor, 9.0), 0.0);
        assert!(
            heartbeat_bytes_per_sec_announcing(1000, floor, 12.4)
                < heartbeat_bytes_per_sec(1000) / 4.0
        );
    }

    #[test]
    fn gossip_per_member_no_longer_grows_with_the_job_through_heartbeats() {
        // At 1,000 members a beat every 0.5 s alone would be 2,000
        // messages a second, six times over: about 2.8 MB/s.
        let old = 1000.0 / 0.5 * (HEARTBEAT_BODY + ENVELOPE + GOSSIPSUB_OVERHEAD) * MESH_COPIES;
        assert!(old > 2.5e6);
        let now = gossip_bytes_per_sec(1000, 8.5, 2000);
        assert!(now < old / 3.0, "{now} against {old}");
        // Small jobs: tens of kB/s.
        let small = gossip_bytes_per_sec(8, 1.0, 16);
        assert!((10e3..100e3).contains(&small), "{small}");
    }
}
