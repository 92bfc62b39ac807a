//! The libp2p stack: TCP (through the link shaper) and QUIC, noise, yamux;
//! gossipsub for signed announcements, manifests and heartbeats;
//! request-response for payloads, missed manifests and checkpoint chunks;
//! identify, Kademlia and mDNS for discovery; relay, dcutr and autonat for
//! nodes behind home NATs. The libp2p identity is the node's ed25519 key, so
//! a peer id names a Solana account.

use super::msg::{MAX_REQUEST, MAX_RESPONSE, Request, Response};
use super::shaper::{Link, Stream};
use libp2p::core::upgrade;
use libp2p::futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::identity::{self, ed25519};
use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{
    PeerId, StreamProtocol, Swarm, SwarmBuilder, Transport, autonat, connection_limits, dcutr,
    gossipsub, identify, kad, mdns, noise, ping, relay, request_response, tcp, yamux,
};
use std::io;
use std::time::Duration;

pub const BLOB_PROTOCOL: StreamProtocol = StreamProtocol::new("/cohort/blob/2");
const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/cohort/kad/1");
/// Gossip frames above this are dropped by gossipsub itself; between our
/// own limit and this one they reach the node and are counted.
pub const GOSSIP_TRANSMIT_MAX: usize = 64 * 1024;

#[derive(NetworkBehaviour)]
pub struct Behaviour {
    /// First, so a connection it denies is never seen by the others.
    pub limits: connection_limits::Behaviour,
    pub gossip: gossipsub::Behaviour,
    pub blobs: request_response::Behaviour<BlobCodec>,
    pub identify: identify::Behaviour,
    pub kad: kad::Behaviour<kad::store::MemoryStore>,
    pub mdns: Toggle<mdns::tokio::Behaviour>,
    pub relay: relay::client::Behaviour,
    pub dcutr: dcutr::Behaviour,
    pub autonat: autonat::Behaviour,
    pub ping: ping::Behaviour,
}

/// Connection limits: a flooder cannot hold more than a few connections
/// per peer id, nor exhaust the node with half-open or inbound ones. Loose
/// enough for a job of 1,000 members behind relays.
fn limits() -> connection_limits::ConnectionLimits {
    connection_limits::ConnectionLimits::default()
        .with_max_established_per_peer(Some(8))
        .with_max_pending_incoming(Some(64))
        .with_max_established_incoming(Some(2048))
}

/// Length-prefixed frames with hard size limits: a peer announcing a larger
/// frame is cut off before anything is allocated.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlobCodec;

async fn read_frame<T: AsyncRead + Unpin + Send>(io: &mut T, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {max}-byte limit"),
        ));
    }
    let mut buf = vec![0u8; len];
    io.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_frame<T: AsyncWrite + Unpin + Send>(io: &mut T, buf: &[u8]) -> io::Result<()> {
    io.write_all(&(buf.len() as u32).to_le_bytes()).await?;
    io.write_all(buf).await?;
    io.close().await
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed {what}"))
}

#[async_trait::async_trait]
impl request_response::Codec for BlobCodec {
    type Protocol = StreamProtocol;
    type Request = Request;
    type Response = Response;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Request>
    where
        T: AsyncRead + Unpin + Send,
    {
        Request::decode(&read_frame(io, MAX_REQUEST).await?).ok_or_else(|| invalid("request"))
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Response>
    where
        T: AsyncRead + Unpin + Send,
    {
        Response::decode(&read_frame(io, MAX_RESPONSE).await?).ok_or_else(|| invalid("response"))
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        r: Request,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &r.encode()).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        r: Response,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &r.encode()).await
    }
}

/// The gossip topic of one epoch of one job. Each epoch is a run of its
/// own on the same key and port, so a member still lingering in epoch e
/// must not count as present in epoch e+1: sharing a topic across epochs
/// let the next epoch start without it (it then missed steps, and pay).
pub fn topic(job: &[u8; 32], epoch: u32) -> gossipsub::IdentTopic {
    let short = super::node::hex(&job[..8]);
    gossipsub::IdentTopic::new(format!("cohort/{short}/{epoch}"))
}

/// Gossipsub peer scoring for a job's topic. Only invalid messages count
/// (P4: what a node rejects, which every honest node would reject too; see
/// `msg::Drop::blames_forwarder`): three in quick succession graylist the
/// sender, and the count decays by a tenth a second. Delivery-rate and
/// mesh penalties are off (a member that computes slowly sends little), and
/// so is the shared-address penalty (home connections behind one NAT, and
/// every test on 127.0.0.1, share an address).
pub fn scoring(
    topic: &gossipsub::IdentTopic,
) -> (gossipsub::PeerScoreParams, gossipsub::PeerScoreThresholds) {
    let topic_params = gossipsub::TopicScoreParams {
        topic_weight: 1.0,
        time_in_mesh_weight: 0.0,
        first_message_deliveries_weight: 0.0,
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        invalid_message_deliveries_weight: -10.0,
        invalid_message_deliveries_decay: 0.9,
        ..Default::default()
    };
    let mut params = gossipsub::PeerScoreParams {
        ip_colocation_factor_weight: 0.0,
        slow_peer_weight: 0.0,
        ..Default::default()
    };
    params.topics.insert(topic.hash(), topic_params);
    (params, gossipsub::PeerScoreThresholds::default())
}

/// Gossipsub as the job runs it. Its mesh degree is the cost model's
/// ([`super::liveness::MESH_N`]), and a node sends its own messages to its
/// mesh like any other, not to every peer it is connected to: gossipsub's
/// default "flood publishing" would have each member send each of its own
/// announcements, sum hashes and heartbeats to every member it holds a
/// connection with, and in a sharded job a member connects to about every
/// other (it pushes to the seats of every shard): about 1.5 MB more upload
/// a step at 1,000 members, in bursts when its uplink is busiest, which
/// the simulator's model of the node did not count. A member whose mesh
/// drops its messages is still heard: gossipsub advertises every message
/// it holds to other peers each heartbeat (IHAVE, then IWANT), and the
/// step machine's fall-backs cover an announcement that comes late.
///
/// Under [`GossipSigning::Envelope`] a message carries no author, sequence
/// number or gossipsub signature, and its id is a hash of its topic and
/// bytes. gossipsub remembers an id for [`SEEN`]: the same bytes again
/// within it are dropped before the node sees them; later, they reach the
/// step machine, which drops a replay whatever its age.
pub fn gossip_config(signing: GossipSigning) -> Result<gossipsub::Config, SetupError> {
    let mut b = gossipsub::ConfigBuilder::default();
    match signing {
        // A node's own message that comes back is a duplicate for `SEEN`
        // and a replay after it, like anyone's: gossipsub's check for it
        // (a list of our own ids kept 10 s, run before the duplicate
        // check) would penalise whoever relayed it, honest or not.
        GossipSigning::Envelope => {
            b.validation_mode(gossipsub::ValidationMode::Anonymous)
                .message_id_fn(content_id)
                .allow_self_origin(true);
        }
        GossipSigning::Libp2p => {
            b.validation_mode(gossipsub::ValidationMode::Strict);
        }
    }
    b.heartbeat_interval(Duration::from_millis(500))
        .duplicate_cache_time(SEEN)
        .validate_messages()
        .max_transmit_size(GOSSIP_TRANSMIT_MAX)
        .mesh_n(super::liveness::MESH_N)
        .mesh_n_low(2)
        .mesh_n_high(12)
        .mesh_outbound_min(1)
        .flood_publish(false)
        .build()
        .map_err(setup)
}

/// Who signs a gossip message.
///
/// Why not gossipsub: every message on a job's topic is our own signed
/// envelope (`msg::sign`: signer, signature), opened and checked before the
/// node accepts or relays it (`node::gossip`), and a replay is caught by
/// the step machine, not by gossipsub's sequence numbers (anyone may
/// re-gossip an old message). gossipsub's own author, sequence number and
/// signature proved nothing more and cost about 116 bytes of each message
/// on the wire, about a third of a heartbeat's or a sum hash's
/// (`liveness::GOSSIPSUB_OVERHEAD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GossipSigning {
    /// Our envelope only (message version 8 on): gossipsub ids a message
    /// by a hash of its topic and bytes.
    #[default]
    Envelope,
    /// gossipsub signs every message too, as before version 8. Kept so
    /// that `cohort-bench traffic` measures what it cost in the same run;
    /// a node of one kind drops the other kind's messages.
    Libp2p,
}

/// How long gossipsub remembers a message's id. Why 5 s and not its
/// default minute: it keeps a message for IWANT for 5 heartbeats (2.5 s)
/// and advertises it for 3, so no honest copy comes later than that but
/// over a stalled link; and since a message is known by its bytes, a
/// replay inside this time never reaches the step machine, whose own
/// replay defence the `p2p` tests exercise past it (under gossipsub's
/// signatures every replay was a new message and reached it).
pub const SEEN: Duration = Duration::from_secs(5);

/// A gossip message's id under [`GossipSigning::Envelope`]: the first 20
/// bytes of blake3 over its topic and bytes, so the same message relayed
/// by several peers is one message, and two different ones never are.
fn content_id(m: &gossipsub::Message) -> gossipsub::MessageId {
    let mut h = blake3::Hasher::new();
    h.update(m.topic.as_str().as_bytes());
    h.update(&[0]);
    h.update(&m.data);
    gossipsub::MessageId::new(&h.finalize().as_bytes()[..20])
}

/// The peer id of a member's node key.
pub fn peer_id(member: &[u8; 32]) -> Option<PeerId> {
    let pk = ed25519::PublicKey::try_from_bytes(member).ok()?;
    Some(PeerId::from_public_key(&identity::PublicKey::from(pk)))
}

#[derive(Debug, thiserror::Error)]
#[error("network setup: {0}")]
pub struct SetupError(pub String);

fn setup<E: std::fmt::Display>(e: E) -> SetupError {
    SetupError(e.to_string())
}

/// Builds the swarm. `link` shapes TCP connections (benchmarks and tests);
/// `mdns` enables LAN discovery (off in tests: it would multicast beyond
/// loopback).
pub fn build(
    key: &ed25519::Keypair,
    link: Link,
    mdns: bool,
    signing: GossipSigning,
) -> Result<Swarm<Behaviour>, SetupError> {
    let id = identity::Keypair::from(key.clone());
    let swarm = SwarmBuilder::with_existing_identity(id)
        .with_tokio()
        .with_quic()
        .with_other_transport(|k| {
            let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
                .map(move |s, _| Stream::new(s, link));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                tcp.upgrade(upgrade::Version::V1Lazy)
                    .authenticate(noise::Config::new(k)?)
                    .multiplex(yamux::Config::default()),
            )
        })
        .map_err(setup)?
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .map_err(setup)?
        .with_behaviour(|k, relay| {
            let me = k.public().to_peer_id();
            let gcfg = gossip_config(signing)?;
            let authenticity = match signing {
                GossipSigning::Envelope => gossipsub::MessageAuthenticity::Anonymous,
                GossipSigning::Libp2p => gossipsub::MessageAuthenticity::Signed(k.clone()),
            };
            let gossip = gossipsub::Behaviour::new(authenticity, gcfg)?;
            let blobs = request_response::Behaviour::with_codec(
                BlobCodec,
                [(BLOB_PROTOCOL, request_response::ProtocolSupport::Full)],
                request_response::Config::default()
                    .with_request_timeout(Duration::from_secs(20))
                    .with_max_concurrent_streams(256),
            );
            let mut kad = kad::Behaviour::with_config(
                me,
                kad::store::MemoryStore::new(me),
                kad::Config::new(KAD_PROTOCOL),
            );
            kad.set_mode(Some(kad::Mode::Server));
            let mdns = if mdns {
                Some(mdns::tokio::Behaviour::new(mdns::Config::default(), me)?)
            } else {
                None
            };
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Behaviour {
                limits: connection_limits::Behaviour::new(limits()),
                gossip,
                blobs,
                identify: identify::Behaviour::new(identify::Config::new(
                    "/cohort/1".into(),
                    k.public(),
                )),
                kad,
                mdns: Toggle::from(mdns),
                relay,
                dcutr: dcutr::Behaviour::new(me),
                autonat: autonat::Behaviour::new(me, autonat::Config::default()),
                // Every 2 s rather than libp2p's 15: members show peers'
                // round trips live, at a few dozen bytes a ping.
                ping: ping::Behaviour::new(
                    ping::Config::new().with_interval(Duration::from_secs(2)),
                ),
            })
        })
        .map_err(setup)?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(120)))
        .build();
    Ok(swarm)
}

/// A public relay for members behind home NATs: circuit relay v2 (the
/// members reserve a slot and reach each other through it until DCUtR
/// punches a direct hole), identify (which tells each member the address
/// its NAT maps it to: the hole to punch) and ping.
#[derive(NetworkBehaviour)]
pub struct RelayBehaviour {
    /// First: only the job's members may connect (reserve, relay, or
    /// be relayed to); anyone else is refused before the relay sees them.
    pub members: libp2p::allow_block_list::Behaviour<libp2p::allow_block_list::AllowedPeers>,
    pub limits: connection_limits::Behaviour,
    pub relay: relay::Behaviour,
    pub identify: identify::Behaviour,
    pub ping: ping::Behaviour,
}

/// libp2p's defaults cut a circuit after 2 minutes or 128 KiB: made for
/// setting up a hole punch, not for carrying a step's payloads when the
/// punch fails. A job's relay carries a member's traffic until it does,
/// for every pair of a job's members (the wire admits 1,024). Its rate
/// limits (30 circuits per peer, then one per 2 minutes) would refuse a
/// job's real circuits once redials spent them; only members can connect
/// at all (`RelayBehaviour::members`), so the caps here are sized to the
/// job, not to strangers.
pub fn relay_config() -> relay::Config {
    relay::Config {
        max_reservations: 2048,
        max_reservations_per_peer: 4,
        reservation_rate_limiters: Vec::new(),
        max_circuits: 65_536,
        max_circuits_per_peer: 2048,
        max_circuit_duration: Duration::from_secs(24 * 3600),
        // 0: no byte limit (libp2p-relay 0.21's `CopyFuture` checks only a
        // positive limit, and the client only reports it).
        max_circuit_bytes: 0,
        circuit_src_rate_limiters: Vec::new(),
        ..relay::Config::default()
    }
}

/// Builds a relay's swarm (TCP and QUIC, like the members') that serves
/// `members` only.
pub fn build_relay(
    key: &ed25519::Keypair,
    members: &[PeerId],
) -> Result<Swarm<RelayBehaviour>, SetupError> {
    let id = identity::Keypair::from(key.clone());
    let swarm = SwarmBuilder::with_existing_identity(id)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .map_err(setup)?
        .with_quic()
        .with_behaviour(|k| RelayBehaviour {
            members: {
                let mut allow = libp2p::allow_block_list::Behaviour::default();
                for m in members {
                    allow.allow_peer(*m);
                }
                allow
            },
            limits: connection_limits::Behaviour::new(limits()),
            relay: relay::Behaviour::new(k.public().to_peer_id(), relay_config()),
            identify: identify::Behaviour::new(identify::Config::new(
                "/cohort/1".into(),
                k.public(),
            )),
            ping: ping::Behaviour::new(ping::Config::new()),
        })
        .map_err(setup)?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
        .build();
    Ok(swarm)
}

/// An error and its causes in words. libp2p's transport errors can print
/// as nothing at all ("cannot listen on …: "), their cause being one level
/// down; with no words anywhere, the debug form.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !s.is_empty() && !parts.contains(&s) {
            parts.push(s);
        }
        cur = err.source();
    }
    if parts.is_empty() {
        format!("{e:?}")
    } else {
        parts.join(": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_epoch_of_a_job_gossips_on_a_topic_of_its_own() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert_eq!(topic(&a, 3).hash(), topic(&a, 3).hash());
        assert_ne!(topic(&a, 3).hash(), topic(&a, 4).hash());
        assert_ne!(topic(&a, 3).hash(), topic(&b, 3).hash());
    }

    #[test]
    fn a_node_sends_its_own_gossip_to_as_many_peers_as_the_cost_model_counts() {
        let c = gossip_config(GossipSigning::Envelope).unwrap();
        assert!(!c.flood_publish());
        assert_eq!(c.mesh_n(), super::super::liveness::MESH_N);
        assert_eq!(
            super::super::liveness::MESH_COPIES,
            super::super::liveness::MESH_N as f64
        );
    }

    #[test]
    fn a_gossip_message_carries_no_gossipsub_signature_and_is_known_by_its_content() {
        let c = gossip_config(GossipSigning::Envelope).unwrap();
        assert!(matches!(
            c.validation_mode(),
            gossipsub::ValidationMode::Anonymous
        ));
        assert!(c.allow_self_origin());
        let topic = gossipsub::IdentTopic::new("cohort/test").hash();
        let m = |data: &[u8], seq| gossipsub::Message {
            source: None,
            data: data.to_vec(),
            sequence_number: seq,
            topic: topic.clone(),
        };
        // The same bytes relayed twice are one message; other bytes are
        // another, whatever gossipsub's fields say.
        assert_eq!(
            c.message_id(&m(b"a", None)),
            c.message_id(&m(b"a", Some(1)))
        );
        assert_ne!(c.message_id(&m(b"a", None)), c.message_id(&m(b"b", None)));
        let signed = gossip_config(GossipSigning::Libp2p).unwrap();
        assert!(matches!(
            signed.validation_mode(),
            gossipsub::ValidationMode::Strict
        ));
    }

    #[test]
    fn the_cost_model_charges_a_gossip_message_its_topic_and_framing() {
        let overhead = super::super::liveness::GOSSIPSUB_OVERHEAD;
        for epoch in [0, 99] {
            let t = topic(&[7; 32], epoch).to_string().len() as f64;
            // The topic and its field, then at most 12 bytes of framing.
            assert!((t + 2.0..=t + 14.0).contains(&overhead), "{t} {overhead}");
        }
    }

    #[test]
    fn scoring_is_valid_and_three_invalid_messages_graylist_a_peer() {
        let topic = gossipsub::IdentTopic::new("cohort/test");
        let (params, thresholds) = scoring(&topic);
        assert!(params.validate().is_ok());
        assert!(thresholds.validate().is_ok());
        let p4 = params.topics[&topic.hash()].invalid_message_deliveries_weight;
        // P4 is the square of the count of invalid messages.
        assert!(p4 * 2.0 * 2.0 > thresholds.graylist_threshold);
        assert!(p4 * 3.0 * 3.0 < thresholds.graylist_threshold);
    }
}
