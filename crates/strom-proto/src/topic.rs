//! Topic descriptions exchanged between clients and servers: the topic spec
//! (with its three policies, kept as their textual specs), partition
//! placement, stream state and consumer start positions.

use bytes::{BufMut, BytesMut};

use crate::codec::{Reader, Wire};
use crate::error::ProtoError;
use crate::wire_struct;

/// Where a partition keeps its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PartitionType {
    /// Ephemeral, in server memory: fastest, lost when the server stops.
    Memory,
    /// Persistent segment files under the server's data directory.
    #[default]
    File,
}

impl PartitionType {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "memory" => Ok(PartitionType::Memory),
            "file" => Ok(PartitionType::File),
            _ => Err(format!(
                "unknown partition type '{s}'; expected 'memory' or 'file'"
            )),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionType::Memory => "memory",
            PartitionType::File => "file",
        }
    }
}

/// When appended events are made durable before the producer is acknowledged.
/// The default is `Always`: an acknowledged event survives power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Durability {
    /// fdatasync before acknowledging (group commit across concurrent batches).
    #[default]
    Always,
    /// fdatasync every N milliseconds in the background; acks do not wait.
    Interval(u32),
    /// Never fsync explicitly; survives a process crash, not a power loss.
    Never,
}

impl Durability {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Durability::Always),
            "never" => Ok(Durability::Never),
            _ => match s.strip_prefix("interval:").map(str::parse::<u32>) {
                Some(Ok(ms)) if ms > 0 => Ok(Durability::Interval(ms)),
                _ => Err(format!(
                    "unknown durability '{s}'; expected 'always', 'never' or 'interval:<ms>' (ms > 0)"
                )),
            },
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durability::Always => f.write_str("always"),
            Durability::Never => f.write_str("never"),
            Durability::Interval(ms) => write!(f, "interval:{ms}"),
        }
    }
}

impl Wire for PartitionType {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(*self as u8)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match r.u8("partition type")? {
            0 => Ok(PartitionType::Memory),
            1 => Ok(PartitionType::File),
            v => Err(ProtoError::Unknown {
                what: "partition type",
                value: v as u64,
            }),
        }
    }
}

impl Wire for Durability {
    const MIN_SIZE: usize = 5;
    fn put(&self, out: &mut BytesMut) {
        let (tag, ms) = match self {
            Durability::Always => (0, 0),
            Durability::Interval(ms) => (1, *ms),
            Durability::Never => (2, 0),
        };
        out.put_u8(tag);
        out.put_u32_le(ms);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let tag = r.u8("durability")?;
        let ms = r.u32("durability interval")?;
        match tag {
            0 => Ok(Durability::Always),
            1 if ms > 0 => Ok(Durability::Interval(ms)),
            2 => Ok(Durability::Never),
            v => Err(ProtoError::Unknown {
                what: "durability",
                value: v as u64,
            }),
        }
    }
}

/// What a `memory` partition does when it reaches its size bound
/// (`retention_bytes`, or the server's `memory_retention_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Overflow {
    /// Hold appends (and their acknowledgements) until every known consumer
    /// has acked past the oldest batches: producers get backpressure.
    #[default]
    Block,
    /// Drop the oldest batches; a reader that fell behind gets an explicit
    /// `DATA_EXPIRED` gap naming the lost offsets, then reads on.
    DropOldest,
}

impl Overflow {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "block" => Ok(Overflow::Block),
            "drop-oldest" => Ok(Overflow::DropOldest),
            _ => Err(format!(
                "unknown overflow policy '{s}'; expected 'block' or 'drop-oldest'"
            )),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::Block => "block",
            Overflow::DropOldest => "drop-oldest",
        }
    }
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Wire for Overflow {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(match self {
            Overflow::Block => 0,
            Overflow::DropOldest => 1,
        })
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match r.u8("overflow policy")? {
            0 => Ok(Overflow::Block),
            1 => Ok(Overflow::DropOldest),
            v => Err(ProtoError::Unknown {
                what: "overflow policy",
                value: v as u64,
            }),
        }
    }
}

/// How a topic's producers compress data parts: a topic option stored in
/// [`TopicSpec::compression`] as text. Servers never compress or
/// decompress; clients frame each data part (docs/compression.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// Data parts are stored as pushed.
    #[default]
    None,
    /// zstd at a level in [`ZSTD_LEVELS`].
    Zstd(i32),
    /// LZ4: level 0 is the fast mode, 1..=12 the high-compression mode at
    /// that level.
    Lz4(u32),
}

/// The zstd levels a topic may ask for (3 when none is given).
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=22;
/// The LZ4 levels a topic may ask for (0, the fast mode, when none is given).
pub const LZ4_LEVELS: std::ops::RangeInclusive<u32> = 0..=12;

impl Compression {
    /// Parses a topic's compression option: `none` (or empty), `zstd`,
    /// `zstd:<1..=22>`, `lz4`, `lz4:<0..=12>`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (codec, level) = match s.split_once(':') {
            Some((c, l)) => (c, Some(l)),
            None => (s, None),
        };
        let bad = || {
            format!(
                "unknown compression '{s}'; expected 'none', 'zstd', 'zstd:<level 1..=22>', \
                 'lz4' or 'lz4:<level 0..=12>'"
            )
        };
        match (codec, level) {
            ("" | "none", None) => Ok(Compression::None),
            ("zstd", None) => Ok(Compression::Zstd(3)),
            ("lz4", None) => Ok(Compression::Lz4(0)),
            ("zstd", Some(l)) => match l.parse::<i32>() {
                Ok(l) if ZSTD_LEVELS.contains(&l) => Ok(Compression::Zstd(l)),
                _ => Err(bad()),
            },
            ("lz4", Some(l)) => match l.parse::<u32>() {
                Ok(l) if LZ4_LEVELS.contains(&l) => Ok(Compression::Lz4(l)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }

    pub fn is_none(self) -> bool {
        self == Compression::None
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
            Compression::Lz4(l) => write!(f, "lz4:{l}"),
        }
    }
}

/// Everything needed to create a topic. Policies are stored as their specs
/// (`"json-schema"`, `"hash:run_id"`, ...) so every client builds the same ones.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub partition_type: PartitionType,
    pub durability: Durability,
    /// `none` | `json` | `json-schema`
    pub validator: String,
    /// Inline JSON schema for `json-schema` validation and the `binary` serializer.
    pub schema: Option<String>,
    /// `round-robin` | `hash:<field>` | `explicit`
    pub selector: String,
    /// `json` | `binary`
    pub serializer: String,
    pub retention_bytes: Option<u64>,
    pub retention_ms: Option<u64>,
    pub segment_bytes: Option<u64>,
    /// What a full `memory` partition does; `None` is the default for the
    /// partition type (`block` for memory). File partitions refuse `Some`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub overflow: Option<Overflow>,
    /// Copies of each partition on distinct members, the leader included
    /// (protocol version 4; 0 and 1 both mean one copy, no replication).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_zero"))]
    pub replication_factor: u32,
    /// In-sync replicas (the leader included) an `acks=all` append needs
    /// (protocol version 4; 0: a majority of `replication_factor`).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_zero"))]
    pub min_in_sync: u32,
    /// Tiered storage of `file` partitions (protocol version 6,
    /// docs/tiering.md): `None` follows the server (tiered when it has a
    /// tier), `Some(false)` keeps the topic local only, `Some(true)` asks
    /// for the server's tier.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub tier: Option<bool>,
    /// Bytes of segments kept locally once verified in the tier (protocol
    /// version 6); `None`: the server's `tier_local_retention_bytes`.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub local_retention_bytes: Option<u64>,
    /// Age (ms) past which segments verified in the tier are dropped
    /// locally (protocol version 6); `None`: the server's
    /// `tier_local_retention_ms`.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub local_retention_ms: Option<u64>,
    /// How producers compress each event's data part (protocol version 6):
    /// `none` (or empty), `zstd`, `zstd:<level>`, `lz4`, `lz4:<level>`;
    /// see [`Compression::parse`]. Servers store what producers send.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "String::is_empty")
    )]
    pub compression: String,
}

#[cfg(feature = "serde")]
fn is_zero(v: &u32) -> bool {
    *v == 0
}

wire_struct!(TopicSpec {
    name,
    partitions,
    partition_type,
    durability,
    validator,
    schema,
    selector,
    serializer,
    retention_bytes,
    retention_ms,
    segment_bytes,
    overflow,
    replication_factor @ 4,
    min_in_sync @ 4,
    tier @ 6,
    local_retention_bytes @ 6,
    local_retention_ms @ 6,
    compression @ 6
});

impl TopicSpec {
    /// A spec with the defaults: file partitions, `always` durability, no
    /// validation, round-robin, JSON.
    pub fn new(name: impl Into<String>, partitions: u32) -> Self {
        TopicSpec {
            name: name.into(),
            partitions,
            partition_type: PartitionType::File,
            durability: Durability::Always,
            validator: "none".into(),
            schema: None,
            selector: "round-robin".into(),
            serializer: "json".into(),
            retention_bytes: None,
            retention_ms: None,
            segment_bytes: None,
            overflow: None,
            replication_factor: 0,
            min_in_sync: 0,
            tier: None,
            local_retention_bytes: None,
            local_retention_ms: None,
            compression: String::new(),
        }
    }

    /// The same spec with data parts compressed by `compression`
    /// (`"zstd:3"`, `"lz4"`, ...; checked when the topic is created).
    pub fn with_compression(self, compression: impl Into<String>) -> Self {
        TopicSpec {
            compression: compression.into(),
            ..self
        }
    }

    /// Copies of each partition (at least 1).
    pub fn replicas(&self) -> u32 {
        self.replication_factor.max(1)
    }

    /// In-sync replicas an `acks=all` append needs: the spec's, or a
    /// majority of the replicas.
    pub fn min_in_sync_replicas(&self) -> u32 {
        match self.min_in_sync {
            0 => self.replicas() / 2 + 1,
            n => n,
        }
    }

    /// The overflow policy in force: the spec's, or `block` for memory
    /// partitions; `None` for file partitions (they keep their retention).
    pub fn effective_overflow(&self) -> Option<Overflow> {
        match self.partition_type {
            PartitionType::Memory => Some(self.overflow.unwrap_or_default()),
            PartitionType::File => None,
        }
    }
}

/// One server process of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupMember {
    pub id: u32,
    /// The member's primary address (TCP): what peers and every client
    /// can use.
    pub addr: String,
    /// Every address the member listens on, `addr` first (protocol
    /// version 3; empty from older peers and in older group files).
    /// Clients pick the best one they can reach (shared memory on the same
    /// node, then RDMA, then TCP).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub addrs: Vec<String>,
}
wire_struct!(GroupMember { id, addr, addrs @ 3 });

impl GroupMember {
    /// A member with only its primary address.
    pub fn new(id: u32, addr: impl Into<String>) -> Self {
        GroupMember {
            id,
            addr: addr.into(),
            addrs: Vec::new(),
        }
    }
}

/// Whether a partition can serve reads and writes right now.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum PartitionStatus {
    /// Serving.
    #[default]
    Ok,
    /// Its member is down or unreachable, or its files could not be opened;
    /// the text says which.
    Unavailable(String),
    /// Stopped by a storage failure (failed fsync or write); it refuses
    /// appends until it is reopened. The text says why.
    Failed(String),
}

impl PartitionStatus {
    /// `"ok"`, `"unavailable"` or `"failed"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PartitionStatus::Ok => "ok",
            PartitionStatus::Unavailable(_) => "unavailable",
            PartitionStatus::Failed(_) => "failed",
        }
    }

    /// The reason, empty when the partition is serving.
    pub fn reason(&self) -> &str {
        match self {
            PartitionStatus::Ok => "",
            PartitionStatus::Unavailable(r) | PartitionStatus::Failed(r) => r,
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, PartitionStatus::Ok)
    }
}

impl Wire for PartitionStatus {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        match self {
            PartitionStatus::Ok => out.put_u8(0),
            PartitionStatus::Unavailable(r) => {
                out.put_u8(1);
                r.put(out);
            }
            PartitionStatus::Failed(r) => {
                out.put_u8(2);
                r.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match r.u8("partition status")? {
            0 => Ok(PartitionStatus::Ok),
            1 => Ok(PartitionStatus::Unavailable(String::get(r)?)),
            2 => Ok(PartitionStatus::Failed(String::get(r)?)),
            v => Err(ProtoError::Unknown {
                what: "partition status",
                value: v as u64,
            }),
        }
    }
}

/// Where a partition lives and how far its log reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    pub id: u32,
    /// The group member that owns the partition.
    pub member: u32,
    /// The owner's address (`host:port`), so clients route without a lookup.
    pub addr: String,
    pub first_offset: u64,
    pub next_offset: u64,
    /// Serving, unavailable or failed, with the reason.
    pub status: PartitionStatus,
    /// Events dropped by the overflow policy (`drop-oldest`) since the
    /// partition was opened.
    pub dropped_events: u64,
    /// Replicated partitions (protocol version 4): every replica's member,
    /// the leader (`member`) first; empty without replication.
    pub replicas: Vec<u32>,
    /// The replicas in sync with the leader, as the registry has them.
    pub isr: Vec<u32>,
    /// The leader's epoch (0 without replication).
    pub epoch: u64,
    /// The replicas the partition is moving to, the wanted leader first;
    /// empty when it is not moving (protocol version 6).
    pub moving_to: Vec<u32>,
}
wire_struct!(PartitionInfo {
    id,
    member,
    addr,
    first_offset,
    next_offset,
    status,
    dropped_events,
    replicas @ 4,
    isr @ 4,
    epoch @ 4,
    moving_to @ 6
});

/// What one member does with one replicated partition, from the registry
/// (`SetReplicaRoles`): lead it in `epoch` (when `leader` is the member
/// itself) with `followers` copying it, or copy it from `leader`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReplicaRole {
    pub partition: u32,
    pub epoch: u64,
    pub leader: u32,
    pub leader_addr: String,
    /// The other replicas, by member id.
    pub followers: Vec<u32>,
    /// The in-sync replicas the registry recorded, the leader included.
    pub isr: Vec<u32>,
}
wire_struct!(ReplicaRole {
    partition,
    epoch,
    leader,
    leader_addr,
    followers,
    isr
});

/// One batch of a `ReplicaBatches` answer: its place, and the lengths of
/// its meta and data sections in the answer's `bytes`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReplicaBatchHead {
    pub base_offset: u64,
    pub count: u32,
    pub timestamp_us: u64,
    pub meta_len: u32,
    pub data_len: u64,
}
wire_struct!(ReplicaBatchHead {
    base_offset,
    count,
    timestamp_us,
    meta_len,
    data_len
});

/// End-of-stream bookkeeping of a topic.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TopicState {
    /// Producers registered and not yet closed.
    pub open_producers: u32,
    /// Producers that closed their part of the stream.
    pub closed_producers: u32,
    /// The stream has ended: every producer closed or expired, or the topic
    /// was completed.
    pub ended: bool,
    /// Producers whose lease ran out; their part of the stream is closed
    /// (not counted in `closed_producers`). Protocol version 2; 0 from a
    /// version-1 peer.
    pub expired_producers: u32,
}
wire_struct!(TopicState {
    open_producers,
    closed_producers,
    ended,
    expired_producers @ 2
});

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    pub spec: TopicSpec,
    pub partitions: Vec<PartitionInfo>,
    pub state: TopicState,
}
wire_struct!(TopicInfo {
    spec,
    partitions,
    state
});

/// Where a subscription starts reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum StartPos {
    /// After the consumer name's last committed ack; the beginning if none.
    Committed,
    Beginning,
    End,
    Offset(u64),
    /// First event with a timestamp (µs since the UNIX epoch) at or after this.
    Timestamp(u64),
}

impl Wire for StartPos {
    const MIN_SIZE: usize = 9;
    fn put(&self, out: &mut BytesMut) {
        let (tag, v) = match *self {
            StartPos::Committed => (0, 0),
            StartPos::Beginning => (1, 0),
            StartPos::End => (2, 0),
            StartPos::Offset(o) => (3, o),
            StartPos::Timestamp(t) => (4, t),
        };
        out.put_u8(tag);
        out.put_u64_le(v);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let tag = r.u8("start position")?;
        let v = r.u64("start position value")?;
        Ok(match tag {
            0 => StartPos::Committed,
            1 => StartPos::Beginning,
            2 => StartPos::End,
            3 => StartPos::Offset(v),
            4 => StartPos::Timestamp(v),
            t => {
                return Err(ProtoError::Unknown {
                    what: "start position",
                    value: t as u64,
                })
            }
        })
    }
}

/// The group file that servers write and clients bootstrap from (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupFile {
    pub members: Vec<GroupMember>,
    /// Id of the member holding the topic registry.
    pub master: u32,
    /// Random id of the group, fixed when its master first starts; a server
    /// of another group never overwrites a live group's file. 0 in files
    /// written before group ids existed.
    #[cfg_attr(feature = "serde", serde(default))]
    pub group_id: u64,
}

/// A group member as the registry master sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberInfo {
    pub id: u32,
    pub addr: String,
    /// Heard from within the heartbeat timeout (the master is always alive).
    pub alive: bool,
    /// Milliseconds since the master last heard from it.
    pub last_seen_ms: u64,
    /// Every address it listens on, `addr` first, when it has more than
    /// one (protocol version 3).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub addrs: Vec<String>,
    /// Its part in keeping the registry (protocol version 4): `master`
    /// (the registry without a quorum), `leader`, `voter` or `learner` of
    /// the metadata quorum, or empty.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "String::is_empty")
    )]
    pub role: String,
    /// Its partitions are moving off it (`strom member drain` or
    /// `remove`); it leaves the group once they have (protocol version 6).
    #[cfg_attr(feature = "serde", serde(default))]
    pub draining: bool,
}
wire_struct!(MemberInfo {
    id,
    addr,
    alive,
    last_seen_ms,
    addrs @ 3,
    role @ 4,
    draining @ 6
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_options_parse_with_their_levels_and_bad_ones_are_named() {
        assert_eq!(Compression::parse(""), Ok(Compression::None));
        assert_eq!(Compression::parse("none"), Ok(Compression::None));
        assert_eq!(Compression::parse("zstd"), Ok(Compression::Zstd(3)));
        assert_eq!(Compression::parse("zstd:19"), Ok(Compression::Zstd(19)));
        assert_eq!(Compression::parse("lz4"), Ok(Compression::Lz4(0)));
        assert_eq!(Compression::parse("lz4:9"), Ok(Compression::Lz4(9)));
        for bad in [
            "gzip", "zstd:0", "zstd:23", "zstd:x", "lz4:13", "none:1", "zstd:",
        ] {
            let e = Compression::parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert_eq!(Compression::Zstd(3).to_string(), "zstd:3");
    }

    #[test]
    fn compression_travels_from_version_6_and_is_empty_before() {
        let spec = TopicSpec::new("t", 1).with_compression("zstd:3");
        let mut b = BytesMut::new();
        spec.put_v(6, &mut b);
        let b6 = b.split().freeze();
        assert_eq!(TopicSpec::get(&mut Reader::at(&b6, 6)).unwrap(), spec);
        spec.put_v(5, &mut b);
        let b5 = b.freeze();
        let old = TopicSpec::get(&mut Reader::at(&b5, 5)).unwrap();
        assert_eq!(old.compression, "");
    }
}
