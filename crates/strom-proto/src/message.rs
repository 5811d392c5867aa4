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
use crate::topic::{GroupMember, MemberInfo, PartitionInfo, StartPos, TopicInfo, TopicSpec};

/// A byte range `(position, length)`.
pub type Range = (u64, u64);

/// Data wanted from one stored batch: its base offset and ranges relative to
/// the start of the batch's data section.
pub type DataItem = (u64, Vec<Range>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Hello {
        client: String,
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
    },
    /// A member tells the master it is alive (and where).
    Heartbeat {
        member: u32,
        addr: String,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Error {
        code: ErrorCode,
        message: String,
    },
    Done,
    Hello {
        member: u32,
        master: u32,
        members: Vec<GroupMember>,
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
macro_rules! messages {
    ($ty:ident { $($op:literal => $var:ident $({ $($f:ident),* $(; @rest $rest:ident)? })? $(( $tuple:ident ))?,)* }) => {
        impl $ty {
            pub fn opcode(&self) -> u16 {
                match self { $($ty::$var { .. } => $op,)* }
            }

            /// Encodes the body; the opcode goes in the frame header.
            #[allow(unused_variables)]
            pub fn encode(&self, out: &mut BytesMut) {
                match self {
                    $($ty::$var $({ $($f,)* $($rest)? })? $(( $tuple ))? => {
                        $($( $f.put(out); )* $( out.extend_from_slice($rest); )?)?
                        $( $tuple.put(out); )?
                    })*
                }
            }

            pub fn decode(opcode: u16, body: &Bytes) -> Result<Self, ProtoError> {
                let mut r = Reader::new(body);
                let msg = match opcode {
                    $($op => messages!(@build r, $ty, $var $({ $($f),* $(; @rest $rest)? })? $(( $tuple ))?),)*
                    other => return Err(ProtoError::Unknown { what: "opcode", value: other as u64 }),
                };
                r.finish()?;
                Ok(msg)
            }
        }
    };
    (@build $r:ident, $ty:ident, $var:ident { $($f:ident),* $(; @rest $rest:ident)? }) => {
        $ty::$var { $($f: Wire::get(&mut $r)?,)* $($rest: $r.rest(),)? }
    };
    (@build $r:ident, $ty:ident, $var:ident ( $tuple:ident )) => {
        $ty::$var(Wire::get(&mut $r)?)
    };
    (@build $r:ident, $ty:ident, $var:ident) => {
        $ty::$var
    };
}

messages!(Request {
    1 => Hello { client },
    2 => CreateTopic { spec, member },
    3 => DescribeTopic { name, offsets },
    4 => ListTopics,
    5 => DeleteTopic { name },
    6 => CompleteTopic { name },
    7 => RegisterProducer { topic },
    8 => CloseProducer { topic, producer },
    9 => Produce { topic, partition, count; @rest meta },
    10 => Subscribe { stream, topic, partition, consumer, start, prefetch },
    11 => Credit { stream, events },
    12 => Unsubscribe { stream },
    13 => FetchData { topic, partition, items },
    14 => Commit { topic, partition, consumer, offset },
    15 => Offsets { topic, partition },
    16 => Join { member, addr },
    17 => Heartbeat { member, addr },
    18 => HostPartitions { topic_id, spec, partitions, sealed },
    19 => SealPartitions { topic },
    20 => DropPartitions { topic },
    21 => AddPartitions { topic, count, member },
    22 => Members,
    23 => PartitionStats { topic, partitions },
    24 => Limits,
    25 => Scrub { topic, partition },
});

messages!(Response {
    1 => Error { code, message },
    2 => Done,
    3 => Hello { member, master, members },
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
    14 => Limits { max_frame_bytes, max_batch_bytes },
    15 => Scrubbed { segments, batches, bytes, damaged, quarantined },
});

messages!(Push {
    1 => Events { partition, base_offset, count, timestamp_us; @rest meta },
    2 => EndOfStream { partition, end_offset },
    3 => StreamError { code, message },
    4 => Gap { partition, first, last, code },
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
mod tests {
    use super::*;
    use crate::topic::{MemberInfo, TopicState};

    fn round_trip_req(m: Request) {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        assert_eq!(Request::decode(m.opcode(), &b.freeze()).unwrap(), m);
    }

    #[test]
    fn requests_round_trip() {
        round_trip_req(Request::Hello { client: "x".into() });
        round_trip_req(Request::CreateTopic {
            spec: TopicSpec::new("t", 3),
            member: Some(2),
        });
        round_trip_req(Request::HostPartitions {
            topic_id: 4,
            spec: TopicSpec::new("t", 3),
            partitions: vec![0, 2],
            sealed: false,
        });
        round_trip_req(Request::Members);
        round_trip_req(Request::Limits);
        let mut spec = TopicSpec::new("t", 3);
        spec.overflow = Some(crate::topic::Overflow::DropOldest);
        round_trip_req(Request::CreateTopic { spec, member: None });
        round_trip_req(Request::ListTopics);
        round_trip_req(Request::Produce {
            topic: "t".into(),
            partition: 2,
            count: 3,
            meta: Bytes::from_static(b"abcdef"),
        });
        round_trip_req(Request::Subscribe {
            stream: 9,
            topic: "t".into(),
            partition: 1,
            consumer: "c".into(),
            start: StartPos::Timestamp(5),
            prefetch: 100,
        });
        round_trip_req(Request::FetchData {
            topic: "t".into(),
            partition: 0,
            items: vec![(10, vec![(0, 5), (7, 1)])],
        });
    }

    #[test]
    fn responses_and_pushes_round_trip() {
        let info = TopicInfo {
            spec: TopicSpec::new("t", 1),
            partitions: vec![],
            state: TopicState::default(),
        };
        for m in [
            Response::Topic(info),
            Response::error(ErrorCode::TOPIC_NOT_FOUND, "no"),
            Response::Offsets(vec![("a".into(), 3)]),
            Response::Members(vec![MemberInfo {
                id: 1,
                addr: "h:1".into(),
                alive: true,
                last_seen_ms: 5,
            }]),
            Response::Done,
            Response::Limits {
                max_frame_bytes: 1 << 28,
                max_batch_bytes: 1 << 27,
            },
        ] {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            assert_eq!(Response::decode(m.opcode(), &b.freeze()).unwrap(), m);
        }
        let p = Push::Events {
            partition: 1,
            base_offset: 2,
            count: 3,
            timestamp_us: 4,
            meta: Bytes::from_static(b"zz"),
        };
        let mut b = BytesMut::new();
        p.encode(&mut b);
        assert_eq!(Push::decode(p.opcode(), &b.freeze()).unwrap(), p);
    }

    #[test]
    fn an_unknown_overflow_tag_is_a_clear_decode_error() {
        let mut spec = TopicSpec::new("t", 1);
        spec.overflow = Some(crate::topic::Overflow::Block);
        let m = Request::CreateTopic { spec, member: None };
        let mut b = BytesMut::new();
        m.encode(&mut b);
        // Layout ends with: overflow option tag (1), overflow tag (0), member option (0).
        let n = b.len();
        assert_eq!(&b[n - 3..], &[1, 0, 0]);
        b[n - 2] = 7;
        match Request::decode(m.opcode(), &b.freeze()) {
            Err(e @ ProtoError::Unknown { .. }) => {
                assert!(e.to_string().contains("overflow policy"), "{e}")
            }
            other => panic!("expected an unknown overflow policy error, got {other:?}"),
        }
    }

    #[test]
    fn unknown_opcode_and_trailing_bytes_are_errors() {
        assert!(Request::decode(999, &Bytes::new()).is_err());
        assert!(matches!(
            Request::decode(4, &Bytes::from_static(b"x")),
            Err(ProtoError::Trailing(1))
        ));
    }
}
