//! Message bodies: requests (client → server), responses, and pushes
//! (server → client, unsolicited, tagged with a stream id).
//!
//! Each message is identified by the frame's opcode. Fields are encoded in
//! declaration order with [`Wire`]. `Produce` and `Events` end with the batch
//! metadata section, which takes the rest of the body (no length prefix); the
//! events' data parts travel in the frame's bulk payload.

use bytes::{Bytes, BytesMut};

use crate::codec::{Reader, Wire};
use crate::error::{ErrorCode, ProtoError};
use crate::group::{
    ConsumerGroupInfo, ConsumerGroupSpec, GroupConsumerInfo, GroupPartitionInfo, Run,
};
use crate::topic::{
    GroupMember, MemberInfo, PartitionInfo, ReplicaBatchHead, ReplicaRole, StartPos, TopicInfo,
    TopicSpec,
};
#[cfg(test)]
use crate::PROTOCOL_VERSION;

/// A byte range `(position, length)`.
pub type Range = (u64, u64);

/// Data wanted from one stored batch: its base offset and ranges relative to
/// the start of the batch's data section.
pub type DataItem = (u64, Vec<Range>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The first request of a connection, always sent at version
    /// [`crate::MIN_PROTOCOL_VERSION`]: who the client is and the newest
    /// protocol version it speaks. The answer names the version both sides
    /// use from then on.
    Hello {
        client: String,
        max_version: u8,
        /// A member's fresh random nonce (protocol version 7), the start of
        /// its proof of membership ([`Request::ProveMember`]); empty from a
        /// plain client. A member sends its `Hello` at version 7 to carry it.
        nonce: Bytes,
    },
    /// Creates a topic; `member` places every partition on one member,
    /// otherwise partitions are spread round-robin over live members.
    CreateTopic {
        spec: TopicSpec,
        member: Option<u32>,
    },
    /// `offsets: false` skips asking each owner for its partitions' offsets.
    DescribeTopic {
        name: String,
        offsets: bool,
    },
    ListTopics,
    DeleteTopic {
        name: String,
    },
    /// Ends the topic's stream explicitly.
    CompleteTopic {
        name: String,
    },
    RegisterProducer {
        topic: String,
    },
    CloseProducer {
        topic: String,
        producer: u64,
    },
    /// Appends one batch; `meta` is a [`crate::BatchView`]-parsable section,
    /// the data parts follow in the bulk payload.
    Produce {
        topic: String,
        partition: u32,
        count: u32,
        /// Replicated partitions (protocol version 4): `false` (the
        /// default) acknowledges after the leader's append, `true` after
        /// every in-sync replica has the batch.
        acks_all: bool,
        meta: Bytes,
    },
    /// Starts pushing metadata batches of a partition as stream `stream`.
    Subscribe {
        stream: u64,
        topic: String,
        partition: u32,
        consumer: String,
        start: StartPos,
        /// Events the server may push ahead of demand.
        prefetch: u32,
    },
    /// Grants the stream room for `events` more events. Sent with request id 0: no response.
    Credit {
        stream: u64,
        events: u32,
    },
    Unsubscribe {
        stream: u64,
    },
    /// Reads data ranges; the response's bulk holds them back to back.
    FetchData {
        topic: String,
        partition: u32,
        items: Vec<DataItem>,
    },
    /// Persists `offset` (the next offset to read) for a consumer name.
    Commit {
        topic: String,
        partition: u32,
        consumer: String,
        offset: u64,
    },
    /// Committed offsets of every consumer name of a partition.
    Offsets {
        topic: String,
        partition: u32,
    },
    /// A server joins the group (`member` is its previous id after a restart).
    Join {
        member: Option<u32>,
        addr: String,
        /// Every address it listens on (protocol version 3).
        addrs: Vec<String>,
        /// The process joins for the first time since it started (protocol
        /// version 5): it is out of every in-sync replica set until it
        /// catches up again, and what it led fails over (its log may have
        /// lost what it held: a memory partition, an emptied data dir).
        restarted: bool,
    },
    /// A member tells the master it is alive (and where).
    Heartbeat {
        member: u32,
        addr: String,
        /// Every address it listens on (protocol version 3).
        addrs: Vec<String>,
    },
    /// Master → member: host these partitions of a topic (idempotent).
    HostPartitions {
        topic_id: u64,
        spec: TopicSpec,
        partitions: Vec<u32>,
        sealed: bool,
    },
    /// Master → member: the topic's stream ended; seal local partitions.
    SealPartitions {
        topic: String,
    },
    /// Master → member: the topic was deleted; drop local partitions.
    DropPartitions {
        topic: String,
    },
    /// Adds `count` partitions to a topic (on `member`, or round-robin).
    AddPartitions {
        topic: String,
        count: u32,
        member: Option<u32>,
    },
    /// The group's members and whether each is alive.
    Members,
    /// Offsets of partitions hosted by the receiving server.
    PartitionStats {
        topic: String,
        partitions: Vec<u32>,
    },
    /// The receiving server's size limits; clients ask once per connection.
    Limits,
    /// Checks every CRC of one partition hosted by the receiving server,
    /// online, and quarantines what is damaged (`strom scrub`).
    Scrub {
        topic: String,
        partition: u32,
    },
    /// Registers a producer holding a lease of `lease_ms` (the server
    /// clamps it to its range; 0 asks for the server's default). The client
    /// must renew it with [`Request::RenewLeases`] or the producer expires
    /// and counts as closed. Protocol version 2.
    OpenProducer {
        topic: String,
        lease_ms: u32,
    },
    /// Renews the leases of every listed `(topic, producer)`: one request
    /// per client process. Protocol version 2.
    RenewLeases {
        producers: Vec<(String, u64)>,
    },
    /// Joins (creating it if missing) a consumer group, to the master.
    /// `consumer` rejoins under a previous id. Pushes of the membership
    /// (`ConsumerAssignment`, partitioned groups) go to `stream`. Protocol 2.
    JoinConsumerGroup {
        stream: u64,
        spec: ConsumerGroupSpec,
        consumer: Option<u64>,
        label: String,
    },
    /// A member is alive; `owned` lists `(partition, epoch)` it holds and
    /// `done` `(partition, end offset)` it read and committed to the end.
    ConsumerHeartbeat {
        group: String,
        consumer: u64,
        owned: Vec<(u32, u64)>,
        done: Vec<(u32, u64)>,
    },
    LeaveConsumerGroup {
        group: String,
        consumer: u64,
    },
    DescribeConsumerGroup {
        group: String,
    },
    ListConsumerGroups,
    DeleteConsumerGroup {
        group: String,
    },
    /// Starts a consumer group's stream of one partition, to its owner:
    /// `Events` pushes (partitioned, checked against `epoch`) or `Deliver`
    /// pushes (shared). Credit and `Unsubscribe` work as for `Subscribe`.
    GroupSubscribe {
        stream: u64,
        spec: ConsumerGroupSpec,
        partition: u32,
        consumer: u64,
        epoch: u64,
        prefetch: u32,
    },
    /// Shared groups: resolves `acks` and redelivers `nacks` at once, as
    /// ranges `(first, count)`. Answered once the acks are durable.
    GroupAck {
        topic: String,
        partition: u32,
        group: String,
        acks: Vec<(u64, u32)>,
        nacks: Vec<(u64, u32)>,
    },
    /// Partitioned groups: commits `offset` for the holder `(consumer, epoch)`.
    GroupCommit {
        topic: String,
        partition: u32,
        group: String,
        consumer: u64,
        epoch: u64,
        offset: u64,
    },
    /// Master → owner: only `(consumer, epoch)` may read and commit the
    /// partition from now on (answered once durable).
    FenceGroupPartition {
        topic: String,
        partition: u32,
        group: String,
        consumer: u64,
        epoch: u64,
    },
    /// A consumer group's state on the receiving server's partitions.
    ConsumerGroupStats {
        spec: ConsumerGroupSpec,
        partitions: Vec<u32>,
    },
    /// Master → owner: forget the consumer group's state on a topic.
    DropConsumerGroup {
        topic: String,
        group: String,
    },
    /// The receiving server's metrics snapshot (its partitions' counters,
    /// storage and consumer lag): how the master's dashboard sees the group.
    ServerSnapshot,
    /// A Kafka listener's group coordinator → the master: a Kafka group's
    /// spec (mode `Kafka`), generation and members as the Kafka protocol
    /// has them now, so `describe` and `list` show it. Sent on every change
    /// and refreshed every few seconds; the master creates the group on
    /// first sight. Protocol version 3.
    KafkaGroupView {
        spec: ConsumerGroupSpec,
        generation: u64,
        consumers: Vec<GroupConsumerInfo>,
    },
    /// Member → member: one Raft RPC of the metadata quorum (strom-meta's
    /// encoding, opaque here), answered by [`Response::MetaRpc`]. Protocol 3.
    MetaRpc {
        rpc: Bytes,
    },
    /// From the registry to a replica's member: lead or follow these
    /// partitions of `topic` (docs/replication.md).
    SetReplicaRoles {
        topic: String,
        roles: Vec<ReplicaRole>,
    },
    /// From a follower to its partition's leader: the batches from
    /// `from` on (everything below is durable on the follower), with the
    /// follower's latest leader epoch for the divergence check.
    ReplicaFetch {
        topic: String,
        partition: u32,
        epoch: u64,
        follower: u32,
        from: u64,
        last_epoch: u64,
        max_bytes: u32,
    },
    /// From a partition's leader to the registry: its in-sync replicas
    /// changed; recorded only if `epoch` is still the partition's.
    ReportIsr {
        topic: String,
        partition: u32,
        epoch: u64,
        isr: Vec<u32>,
    },
    /// Master → member: drop the local copies of these partitions of the
    /// topic (they moved away; docs/elasticity.md). Protocol version 6.
    ReleasePartitions {
        topic: String,
        topic_id: u64,
        partitions: Vec<u32>,
    },
    /// Moves a replicated partition to `replicas` (distinct members, the
    /// wanted leader first) online: the new replicas copy it, the
    /// leadership moves if it must, and the old replicas drop it. Answered
    /// once the move is recorded; `PartitionInfo::moving_to` shows it
    /// until it is done. An empty `replicas` cancels a move that has not
    /// finished. Protocol version 6.
    MovePartition {
        topic: String,
        partition: u32,
        replicas: Vec<u32>,
    },
    /// Moves every partition off `member`, then lets it leave the group
    /// (`dead`: it is gone; its copies are re-created from the others).
    /// Answered once the drain is recorded. Protocol version 6.
    DrainMember {
        member: u32,
        dead: bool,
    },
    /// A server proves it is a member of the group, after a `Hello` that
    /// carried its nonce: `proof` is the HMAC-SHA256, keyed by the group's
    /// cluster secret, of both nonces and `member` (the id it claims,
    /// `u32::MAX` before it has one). Answered by
    /// [`Response::MemberProven`]; from then on the connection is that
    /// member's (docs/protocol.md, "Members"). Protocol version 7.
    ProveMember {
        member: u32,
        proof: Bytes,
    },
    /// Presents a Strom token (protocol version 9); the connection is the
    /// token's subject from then on. Once per connection.
    Authenticate {
        token: String,
    },
    /// The registry's security table (ACLs, revoked tokens) if its version
    /// is not `have`: members keep a copy to decide requests with, and an
    /// operator lists the ACLs (`strom acl list`).
    SecurityTable {
        have: u64,
    },
    /// Adds (`add`) or removes ACL entries, a JSON array of
    /// `strom_auth::AclEntry`.
    AlterAcls {
        add: bool,
        json: String,
    },
    /// Revokes a token by its id (`jti`) for the rest of its life.
    RevokeToken {
        id: String,
    },
    /// Changes a SCRAM user's credentials for the Kafka port (`json`: a
    /// `strom_auth::scram::ScramUpdate`: an array of credentials replaces
    /// them all, empty removes the user; `{"set": [...], "remove":
    /// [mechanism, ...]}` changes single mechanisms).
    SetScramUser {
        user: String,
        json: String,
    },
    /// Sets or removes one quota (docs/quotas.md); `json` is a
    /// `strom_server::quota::QuotaChange`.
    AlterQuotas {
        json: String,
    },
    /// The registry's quota table if its version is not `have`: members
    /// keep a copy to enforce, and an operator lists it (`strom quota
    /// list`).
    QuotaTable {
        have: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Error {
        code: ErrorCode,
        message: String,
    },
    Done,
    /// `version`: the protocol version of the rest of the connection, the
    /// newest both sides speak.
    Hello {
        member: u32,
        master: u32,
        members: Vec<GroupMember>,
        version: u8,
        /// The server's fresh nonce, when the client's `Hello` carried one
        /// (protocol version 7).
        nonce: Bytes,
    },
    Topic(TopicInfo),
    Topics(Vec<TopicInfo>),
    Producer {
        id: u64,
    },
    Produced {
        base_offset: u64,
        count: u32,
        timestamp_us: u64,
    },
    Subscribed {
        start_offset: u64,
    },
    /// Total bytes in the bulk payload that follows.
    Data {
        total: u64,
    },
    Offsets(Vec<(String, u64)>),
    Joined {
        member: u32,
        members: Vec<MemberInfo>,
    },
    Members(Vec<MemberInfo>),
    Stats(Vec<PartitionInfo>),
    /// Answer to [`Request::Limits`].
    Limits {
        /// Largest frame the server accepts (`frame_len`, header excluded).
        max_frame_bytes: u64,
        /// Largest batch (metadata section + data) it appends.
        max_batch_bytes: u64,
        /// Voters of the metadata quorum the server belongs to (protocol
        /// version 8; 0 from older servers): 1 without one (the registry
        /// master is member 0 and never moves), 3 or 5 with one (a master
        /// that is gone is replaced by an election, so a client waits for it).
        meta_voters: u32,
        /// How the server guards itself (protocol version 9; 0 from older
        /// servers): 1 protected mode (no auth; loopback and same-node
        /// addresses only), 2 `auth`, 3 `insecure` (network addresses
        /// without auth).
        security: u8,
    },
    /// What a scrub checked; `damaged` lists ranges found by this pass,
    /// `quarantined` every quarantined range after it, as `(first, last)`.
    Scrubbed {
        segments: u32,
        batches: u64,
        bytes: u64,
        damaged: Vec<(u64, u64)>,
        quarantined: Vec<(u64, u64)>,
    },
    /// Answer to [`Request::OpenProducer`]: the id and the lease granted.
    ProducerLease {
        id: u64,
        lease_ms: u32,
    },
    /// Answer to [`Request::RenewLeases`]: the producers whose lease could
    /// not be renewed (expired, closed, or unknown). They must stop.
    Leases {
        lost: Vec<(String, u64)>,
    },
    /// Answer to [`Request::JoinConsumerGroup`]: the member's id and the
    /// group's spec as stored (which wins over the one asked for).
    ConsumerJoined {
        consumer: u64,
        spec: ConsumerGroupSpec,
        generation: u64,
    },
    /// The partitions a member of a partitioned group may hold, with their
    /// epochs (also pushed when it changes).
    ConsumerAssignment {
        generation: u64,
        assigned: Vec<(u32, u64)>,
        ended: bool,
        heartbeat_ms: u32,
    },
    ConsumerGroup(ConsumerGroupInfo),
    ConsumerGroups(Vec<ConsumerGroupInfo>),
    GroupStats(Vec<GroupPartitionInfo>),
    /// Answer to [`Request::GroupAck`]: the partition's new floor.
    Acked {
        floor: u64,
    },
    /// Answer to [`Request::ServerSnapshot`]: the snapshot as JSON (its
    /// fields are documented in docs/observability.md).
    ServerSnapshot {
        json: String,
    },
    /// Answer to [`Request::MetaRpc`]: the receiving member's quorum's
    /// answer, opaque here.
    MetaRpc {
        rpc: Bytes,
    },
    /// Answer to `ReplicaFetch`: the leader's high watermark and epoch
    /// history, and either where the follower must cut its log
    /// (`truncate_to`) or the batches, whose meta and data sections follow
    /// each other in `bytes`.
    ReplicaBatches {
        hwm: u64,
        truncate_to: Option<u64>,
        epochs: Vec<(u64, u64)>,
        batches: Vec<ReplicaBatchHead>,
        bytes: Bytes,
        /// The named consumers' committed offsets on the leader.
        offsets: Vec<(String, u64)>,
    },
    /// Answer to [`Request::ProveMember`]: the server's own proof that it
    /// holds the cluster secret (the HMAC of both nonces and its member
    /// id, under another label), so the member knows whom it reached.
    MemberProven {
        member: u32,
        proof: Bytes,
    },
    /// Who the connection is now (`Authenticate`).
    Authenticated {
        principal: String,
    },
    /// The security table as JSON, empty if it is still the version asked.
    SecurityTable {
        version: u64,
        json: String,
    },
    /// The quota table as JSON, empty if it is still the version asked.
    QuotaTable {
        version: u64,
        json: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Push {
    /// One stored batch; consumers skip events before their position.
    Events {
        partition: u32,
        base_offset: u64,
        count: u32,
        timestamp_us: u64,
        meta: Bytes,
    },
    /// Every event before `end_offset` was delivered and the stream has ended.
    EndOfStream { partition: u32, end_offset: u64 },
    /// The stream failed and was dropped by the server.
    StreamError { code: ErrorCode, message: String },
    /// Offsets `first..=last` cannot be delivered (`code`: `DATA_CORRUPT`,
    /// damaged on disk and quarantined); the stream goes on after `last`.
    Gap {
        partition: u32,
        first: u64,
        last: u64,
        code: ErrorCode,
    },
    /// Shared groups: events for this member, as runs of stored batches;
    /// `meta` holds exactly the runs' events, in order.
    Deliver {
        partition: u32,
        runs: Vec<Run>,
        meta: Bytes,
    },
    /// Partitioned groups: the member's assignment changed.
    ConsumerAssignment {
        generation: u64,
        assigned: Vec<(u32, u64)>,
        ended: bool,
        heartbeat_ms: u32,
    },
}

impl Wire for ErrorCode {
    const MIN_SIZE: usize = 2;
    fn put(&self, out: &mut BytesMut) {
        self.0.put(out)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(ErrorCode(u16::get(r)?))
    }
}

/// Defines `opcode()`, `encode()` and `decode()` for a message enum.
/// `@rest` marks a final `Bytes` field that takes the remainder of the body.
/// `field @ N` marks a field added in protocol version `N`: encoded only for
/// peers that negotiated `N` or later, and decoded as its `Default` from
/// older ones. That is how a message grows without breaking older peers.
macro_rules! messages {
    ($ty:ident { $($op:literal => $var:ident $({ $($f:ident $(@ $since:literal)?),* $(; @rest $rest:ident)? })? $(( $tuple:ident ))?,)* }) => {
        impl $ty {
            pub fn opcode(&self) -> u16 {
                match self { $($ty::$var { .. } => $op,)* }
            }

            /// Encodes the body for a peer speaking protocol `version`; the
            /// opcode and the version go in the frame header.
            pub fn encode(&self, version: u8, out: &mut BytesMut) {
                self.encode_head(version, out);
                if let Some(rest) = self.rest() {
                    out.extend_from_slice(rest);
                }
            }

            /// Encodes the body without its `@rest` field, which a sender
            /// can then write after it from its own buffer ([`Self::rest`]):
            /// `encode_head` then the rest is exactly [`Self::encode`].
            #[allow(unused_variables)]
            pub fn encode_head(&self, version: u8, out: &mut BytesMut) {
                match self {
                    $($ty::$var $({ $($f,)* .. })? $(( $tuple ))? => {
                        $($( if messages!(@sent version $(, $since)?) { $f.put_v(version, out); } )*)?
                        $( $tuple.put_v(version, out); )?
                    })*
                }
            }

            /// The message's `@rest` field (the end of its body), if it has one.
            #[allow(unused_variables)]
            pub fn rest(&self) -> Option<&Bytes> {
                match self {
                    $($ty::$var $({ $($rest,)? .. })? $(( $tuple ))? => messages!(@rest $($($rest)?)?),)*
                }
            }

            /// Decodes a body encoded at protocol `version` (the frame
            /// header's); fields newer than `version` take their default.
            #[allow(unused_variables)]
            pub fn decode(version: u8, opcode: u16, body: &Bytes) -> Result<Self, ProtoError> {
                let mut r = Reader::at(body, version);
                let msg = match opcode {
                    $($op => messages!(@build r, version, $ty, $var $({ $($f $(@ $since)?),* $(; @rest $rest)? })? $(( $tuple ))?),)*
                    other => return Err(ProtoError::Unknown { what: "opcode", value: other as u64 }),
                };
                r.finish()?;
                Ok(msg)
            }
        }
    };
    (@rest) => { None };
    (@rest $rest:ident) => { Some($rest) };
    (@sent $v:ident) => { true };
    (@sent $v:ident, $since:literal) => { $v >= $since };
    (@get $r:ident, $v:ident) => { Wire::get(&mut $r)? };
    (@get $r:ident, $v:ident, $since:literal) => {
        if $v >= $since { Wire::get(&mut $r)? } else { Default::default() }
    };
    (@build $r:ident, $v:ident, $ty:ident, $var:ident { $($f:ident $(@ $since:literal)?),* $(; @rest $rest:ident)? }) => {
        $ty::$var { $($f: messages!(@get $r, $v $(, $since)?),)* $($rest: $r.rest(),)? }
    };
    (@build $r:ident, $v:ident, $ty:ident, $var:ident ( $tuple:ident )) => {
        $ty::$var(Wire::get(&mut $r)?)
    };
    (@build $r:ident, $v:ident, $ty:ident, $var:ident) => {
        $ty::$var
    };
}

messages!(Request {
    1 => Hello { client, max_version, nonce @ 7 },
    2 => CreateTopic { spec, member },
    3 => DescribeTopic { name, offsets },
    4 => ListTopics,
    5 => DeleteTopic { name },
    6 => CompleteTopic { name },
    7 => RegisterProducer { topic },
    8 => CloseProducer { topic, producer },
    9 => Produce { topic, partition, count, acks_all @ 4; @rest meta },
    10 => Subscribe { stream, topic, partition, consumer, start, prefetch },
    11 => Credit { stream, events },
    12 => Unsubscribe { stream },
    13 => FetchData { topic, partition, items },
    14 => Commit { topic, partition, consumer, offset },
    15 => Offsets { topic, partition },
    16 => Join { member, addr, addrs @ 3, restarted @ 5 },
    17 => Heartbeat { member, addr, addrs @ 3 },
    18 => HostPartitions { topic_id, spec, partitions, sealed },
    19 => SealPartitions { topic },
    20 => DropPartitions { topic },
    21 => AddPartitions { topic, count, member },
    22 => Members,
    23 => PartitionStats { topic, partitions },
    24 => Limits,
    25 => Scrub { topic, partition },
    26 => OpenProducer { topic, lease_ms },
    27 => RenewLeases { producers },
    28 => JoinConsumerGroup { stream, spec, consumer, label },
    29 => ConsumerHeartbeat { group, consumer, owned, done },
    30 => LeaveConsumerGroup { group, consumer },
    31 => DescribeConsumerGroup { group },
    32 => ListConsumerGroups,
    33 => DeleteConsumerGroup { group },
    34 => GroupSubscribe { stream, spec, partition, consumer, epoch, prefetch },
    35 => GroupAck { topic, partition, group, acks, nacks },
    36 => GroupCommit { topic, partition, group, consumer, epoch, offset },
    37 => FenceGroupPartition { topic, partition, group, consumer, epoch },
    38 => ConsumerGroupStats { spec, partitions },
    39 => DropConsumerGroup { topic, group },
    40 => ServerSnapshot,
    41 => KafkaGroupView { spec, generation, consumers },
    42 => MetaRpc { rpc },
    43 => SetReplicaRoles { topic, roles },
    44 => ReplicaFetch { topic, partition, epoch, follower, from, last_epoch, max_bytes },
    45 => ReportIsr { topic, partition, epoch, isr },
    46 => ReleasePartitions { topic, topic_id, partitions },
    47 => MovePartition { topic, partition, replicas },
    48 => DrainMember { member, dead },
    49 => ProveMember { member, proof },
    50 => Authenticate { token },
    51 => SecurityTable { have },
    52 => AlterAcls { add, json },
    53 => RevokeToken { id },
    54 => SetScramUser { user, json },
    55 => AlterQuotas { json },
    56 => QuotaTable { have },
});

messages!(Response {
    1 => Error { code, message },
    2 => Done,
    3 => Hello { member, master, members, version, nonce @ 7 },
    4 => Topic(info),
    5 => Topics(infos),
    6 => Producer { id },
    7 => Produced { base_offset, count, timestamp_us },
    8 => Subscribed { start_offset },
    9 => Data { total },
    10 => Offsets(offsets),
    11 => Joined { member, members },
    12 => Members(members),
    13 => Stats(stats),
    14 => Limits { max_frame_bytes, max_batch_bytes, meta_voters @ 8, security @ 9 },
    15 => Scrubbed { segments, batches, bytes, damaged, quarantined },
    16 => ProducerLease { id, lease_ms },
    17 => Leases { lost },
    18 => ConsumerJoined { consumer, spec, generation },
    19 => ConsumerAssignment { generation, assigned, ended, heartbeat_ms },
    20 => ConsumerGroup(info),
    21 => ConsumerGroups(infos),
    22 => GroupStats(stats),
    23 => Acked { floor },
    24 => ServerSnapshot { json },
    25 => MetaRpc { rpc },
    26 => ReplicaBatches { hwm, truncate_to, epochs, batches, bytes, offsets },
    27 => MemberProven { member, proof },
    28 => Authenticated { principal },
    29 => SecurityTable { version, json },
    30 => QuotaTable { version, json },
});

messages!(Push {
    1 => Events { partition, base_offset, count, timestamp_us; @rest meta },
    2 => EndOfStream { partition, end_offset },
    3 => StreamError { code, message },
    4 => Gap { partition, first, last, code },
    5 => Deliver { partition, runs; @rest meta },
    6 => ConsumerAssignment { generation, assigned, ended, heartbeat_ms },
});

impl Response {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Response::Error {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests;
