//! Consumer groups on the wire: the group's spec, the runs of a shared
//! delivery, and what `describe` reports (docs/consumer-groups.md).
//!
//! "Group" alone means the *server* group elsewhere in Strom; these types
//! always say "consumer group". A consumer group is bound to one topic and
//! is either *partitioned* (members split the partitions, Kafka's model) or
//! *shared* (any member may get any event, each event to one member at a
//! time, acked one by one: a work queue).

use bytes::{BufMut, BytesMut};

use crate::codec::{Reader, Wire};
use crate::error::ProtoError;
use crate::topic::{PartitionStatus, StartPos};
use crate::wire_struct;

/// How a consumer group shares its topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum ConsumerGroupMode {
    /// Members split the partitions; each partition is read by one member.
    #[default]
    Partitioned,
    /// Every member may receive any event; each event is acked on its own.
    Shared,
    /// A Kafka consumer group on a Kafka listener (docs/kafka.md): its
    /// members and their partitions come from the Kafka group protocol, its
    /// committed offsets are consumer offsets under the group's name. Not
    /// joinable through the native protocol.
    Kafka,
}

impl ConsumerGroupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ConsumerGroupMode::Partitioned => "partitioned",
            ConsumerGroupMode::Shared => "shared",
            ConsumerGroupMode::Kafka => "kafka",
        }
    }
}

impl std::str::FromStr for ConsumerGroupMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "partitioned" => Ok(ConsumerGroupMode::Partitioned),
            "shared" => Ok(ConsumerGroupMode::Shared),
            "kafka" => Ok(ConsumerGroupMode::Kafka),
            other => Err(format!(
                "unknown consumer group mode '{other}' (use 'partitioned' or 'shared')"
            )),
        }
    }
}

impl Wire for ConsumerGroupMode {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(match self {
            ConsumerGroupMode::Partitioned => 0,
            ConsumerGroupMode::Shared => 1,
            ConsumerGroupMode::Kafka => 2,
        });
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match r.u8("consumer group mode")? {
            0 => Ok(ConsumerGroupMode::Partitioned),
            1 => Ok(ConsumerGroupMode::Shared),
            2 => Ok(ConsumerGroupMode::Kafka),
            t => Err(ProtoError::Unknown {
                what: "consumer group mode",
                value: t as u64,
            }),
        }
    }
}

/// A consumer group's settings, fixed when the group is created.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConsumerGroupSpec {
    /// Global name; the topic-name alphabet (it names files).
    pub name: String,
    pub topic: String,
    pub mode: ConsumerGroupMode,
    /// Where a new group begins (`Beginning`, `End`, `Timestamp`).
    pub start: StartPos,
    /// Partitioned: a member silent this long leaves the group.
    pub session_ms: u32,
    /// Shared: an event not acked this long after its delivery is
    /// delivered again to another member.
    pub visibility_ms: u32,
    /// Shared: deliveries before an event goes to `dead_letter`; 0 means
    /// unlimited.
    pub max_deliveries: u32,
    /// Shared: the dead-letter topic (set whenever `max_deliveries > 0`).
    pub dead_letter: Option<String>,
}
wire_struct!(ConsumerGroupSpec {
    name,
    topic,
    mode,
    start,
    session_ms,
    visibility_ms,
    max_deliveries,
    dead_letter
});

impl ConsumerGroupSpec {
    /// A spec with the defaults: start at the beginning, 10 s sessions, 30 s
    /// visibility, unlimited deliveries.
    pub fn new(name: impl Into<String>, topic: impl Into<String>, mode: ConsumerGroupMode) -> Self {
        ConsumerGroupSpec {
            name: name.into(),
            topic: topic.into(),
            mode,
            start: StartPos::Beginning,
            session_ms: 10_000,
            visibility_ms: 30_000,
            max_deliveries: 0,
            dead_letter: None,
        }
    }

    /// The dead-letter topic's name when none is given: `<topic>.<group>.dlq`.
    pub fn default_dead_letter(&self) -> String {
        format!("{}.{}.dlq", self.topic, self.name)
    }
}

/// A contiguous run of events of one stored batch, delivered to one member
/// of a shared group. The `Deliver` push's metadata section holds exactly
/// the runs' events, in run order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Run {
    /// The stored batch's base offset (what `FetchData` items name).
    pub batch_base: u64,
    /// Index of the run's first event in the stored batch.
    pub first: u32,
    pub count: u32,
    /// Position of the run's first event's data in the stored batch's data
    /// section.
    pub data_pos: u64,
    pub timestamp_us: u64,
    /// How many times these events have been delivered, this time included.
    pub deliveries: u32,
}
wire_struct!(Run {
    batch_base,
    first,
    count,
    data_pos,
    timestamp_us,
    deliveries
});

impl Run {
    /// Offset of the run's first event.
    pub fn offset(&self) -> u64 {
        self.batch_base.saturating_add(self.first as u64)
    }
}

/// One member of a consumer group, as `describe` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupConsumerInfo {
    pub id: u64,
    pub label: String,
    pub alive: bool,
    pub last_seen_ms: u64,
    /// Partitioned: the partitions it holds.
    pub partitions: Vec<u32>,
}
wire_struct!(GroupConsumerInfo {
    id,
    label,
    alive,
    last_seen_ms,
    partitions
});

/// One partition of a consumer group, as its owner reports it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupPartitionInfo {
    pub partition: u32,
    /// The server member that owns the partition.
    pub member: u32,
    /// Partitioned: the consumer holding it and its epoch.
    pub holder: Option<(u64, u64)>,
    /// The committed position: the next offset to read (partitioned), or
    /// the lowest unresolved offset (shared).
    pub committed: u64,
    /// The partition's log end.
    pub next_offset: u64,
    /// Shared: events delivered and not yet acked.
    pub pending: u64,
    /// Shared: events acked above `committed` (out of order).
    pub acked_above: u64,
    /// Shared: deliveries after the first, in total.
    pub redelivered: u64,
    /// Shared: events sent to the dead-letter topic, in total.
    pub dead_lettered: u64,
    /// Shared: pending events per member stream, `(consumer, count)`.
    pub pending_by_consumer: Vec<(u64, u64)>,
    pub status: PartitionStatus,
}
wire_struct!(GroupPartitionInfo {
    partition,
    member,
    holder,
    committed,
    next_offset,
    pending,
    acked_above,
    redelivered,
    dead_lettered,
    pending_by_consumer,
    status
});

impl GroupPartitionInfo {
    /// Events not yet consumed by the group.
    pub fn lag(&self) -> u64 {
        self.next_offset.saturating_sub(self.committed)
    }
}

/// A consumer group as `strom group describe` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupInfo {
    pub spec: ConsumerGroupSpec,
    /// Bumped whenever membership changes.
    pub generation: u64,
    pub consumers: Vec<GroupConsumerInfo>,
    pub partitions: Vec<GroupPartitionInfo>,
    /// Every member has seen the end of the group's stream.
    pub ended: bool,
}
wire_struct!(ConsumerGroupInfo {
    spec,
    generation,
    consumers,
    partitions,
    ended
});

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn round_trip<T: Wire + PartialEq + std::fmt::Debug>(v: T) {
        let mut b = BytesMut::new();
        v.put(&mut b);
        let b: Bytes = b.freeze();
        let mut r = Reader::new(&b);
        assert_eq!(T::get(&mut r).unwrap(), v);
        r.finish().unwrap();
    }

    #[test]
    fn group_types_round_trip() {
        let mut spec = ConsumerGroupSpec::new("g", "t", ConsumerGroupMode::Shared);
        round_trip(ConsumerGroupSpec::new("k", "t", ConsumerGroupMode::Kafka));
        spec.max_deliveries = 3;
        spec.dead_letter = Some(spec.default_dead_letter());
        assert_eq!(spec.dead_letter.as_deref(), Some("t.g.dlq"));
        round_trip(spec.clone());
        round_trip(Run {
            batch_base: 10,
            first: 2,
            count: 3,
            data_pos: 99,
            timestamp_us: 5,
            deliveries: 2,
        });
        round_trip(ConsumerGroupInfo {
            spec,
            generation: 4,
            consumers: vec![GroupConsumerInfo {
                id: 1,
                label: "w".into(),
                alive: true,
                last_seen_ms: 3,
                partitions: vec![0, 2],
            }],
            partitions: vec![GroupPartitionInfo {
                partition: 1,
                holder: Some((1, 7)),
                committed: 5,
                next_offset: 9,
                pending_by_consumer: vec![(1, 2)],
                ..Default::default()
            }],
            ended: false,
        });
    }

    #[test]
    fn an_unknown_mode_is_a_decode_error() {
        let b = Bytes::from_static(&[9]);
        let mut r = Reader::new(&b);
        assert!(ConsumerGroupMode::get(&mut r).is_err());
        assert_eq!("shared".parse(), Ok(ConsumerGroupMode::Shared));
        assert_eq!("kafka".parse(), Ok(ConsumerGroupMode::Kafka));
        assert!("queue".parse::<ConsumerGroupMode>().is_err());
    }
}
