//! Fuzz target bodies for the `strom-proto` decoders, and their seeds.
//!
//! Shared, unchanged, by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`,
//! nightly) and by the stable replay test
//! (`crates/strom-proto/tests/hostile_input.rs`, which includes this file
//! with `#[path]`), so both check the same properties. Each body takes
//! arbitrary bytes and panics only when a decoder breaks a promise: a decoder
//! itself panicking, or accepting something that does not survive a round
//! trip or overruns the bytes it was given.

use bytes::{Bytes, BytesMut};
use strom_proto::topic::{
    Durability, GroupMember, MemberInfo, Overflow, PartitionInfo, PartitionStatus, PartitionType,
    ReplicaBatchHead, ReplicaRole, StartPos, TopicInfo, TopicSpec, TopicState,
};
use strom_proto::{
    BatchBuilder, BatchView, ConsumerGroupInfo, ConsumerGroupMode, ConsumerGroupSpec, ErrorCode,
    FrameHeader, FrameKind, GroupConsumerInfo, GroupPartitionInfo, Push, Request, Response, Run,
    FRAME_HEADER_LEN, PROTOCOL_VERSION,
};

/// The frame cap the `frame` target decodes with (the server default is
/// 256 MiB; a small cap exercises the too-large path with short inputs).
pub const MAX_FRAME: u32 = 1 << 20;

/// Most bytes a decode may hold at once for an input of `len` bytes. A
/// decoded value legitimately takes a few times its encoding (a 4-byte empty
/// string becomes a 24-byte `String`, each vector may be grown to twice its
/// length); an allocation sized by an unchecked length takes up to 4 GiB
/// times the element size, whatever the input, and blows straight past this.
pub fn bound(len: usize) -> usize {
    16 * len + 16 * 1024
}

/// A fuzz target: its directory name under `fuzz/corpus/`, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this module.
pub const TARGETS: &[Target] = &[
    ("frame", frame),
    ("request", request),
    ("response", response),
    ("push", push),
    ("batch", batch),
];

/// Generates `decode → encode → decode` checks for one message enum.
macro_rules! check_message {
    ($name:ident, $ty:ident) => {
        /// Decodes `body` as the message with `opcode`; whatever decodes must
        /// re-encode to a body of the same length that decodes to the same
        /// message. A decoded batch section (`Produce`, `Events`) goes
        /// through [`batch`].
        pub fn $name(version: u8, opcode: u16, body: &[u8]) {
            let body = Bytes::copy_from_slice(body);
            let Ok(msg) = $ty::decode(version, opcode, &body) else {
                return;
            };
            assert_eq!(msg.opcode(), opcode, "{msg:?} decoded from opcode {opcode}");
            let mut out = BytesMut::new();
            msg.encode(version, &mut out);
            assert_eq!(
                out.len(),
                body.len(),
                "{msg:?} re-encodes to another length"
            );
            let again = $ty::decode(version, opcode, &out.freeze());
            assert_eq!(
                again.as_ref(),
                Ok(&msg),
                "re-encoded {msg:?} decodes differently"
            );
            if let Some(meta) = msg.section() {
                batch(meta);
            }
        }
    };
}

check_message!(request_body, Request);
check_message!(response_body, Response);
check_message!(push_body, Push);

/// The batch metadata section a message carries, if any.
trait BatchSection {
    fn section(&self) -> Option<&[u8]>;
}
impl BatchSection for Request {
    fn section(&self) -> Option<&[u8]> {
        match self {
            Request::Produce { meta, .. } => Some(meta),
            _ => None,
        }
    }
}
impl BatchSection for Response {
    fn section(&self) -> Option<&[u8]> {
        None
    }
}
impl BatchSection for Push {
    fn section(&self) -> Option<&[u8]> {
        match self {
            Push::Events { meta, .. } => Some(meta),
            _ => None,
        }
    }
}

/// Input: one opcode byte, then a request body (every opcode is reachable,
/// and opcodes past the last one check the unknown-opcode path).
pub fn request(data: &[u8]) {
    if let Some((&op, body)) = data.split_first() {
        request_body(PROTOCOL_VERSION, op.into(), body);
    }
}

/// Input: one opcode byte, then a response body.
pub fn response(data: &[u8]) {
    if let Some((&op, body)) = data.split_first() {
        response_body(PROTOCOL_VERSION, op.into(), body);
    }
}

/// Input: one opcode byte, then a push body.
pub fn push(data: &[u8]) {
    if let Some((&op, body)) = data.split_first() {
        push_body(PROTOCOL_VERSION, op.into(), body);
    }
}

/// Input: a batch metadata section. A section that parses must describe
/// exactly the bytes present, iterate without panicking, and rebuild to the
/// same bytes.
pub fn batch(data: &[u8]) {
    let Ok(view) = BatchView::parse(Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut rebuilt = BatchBuilder::new();
    let mut next_pos = 0u64;
    let mut events = 0u32;
    for e in view.iter() {
        assert_eq!(e.data_pos, next_pos, "event {events} data position");
        next_pos += e.data_len;
        rebuilt.push(&e.metadata, &e.descriptor, e.data_len);
        events += 1;
    }
    assert_eq!(events, view.count());
    assert_eq!(next_pos, view.data_len());
    assert_eq!(rebuilt.data_len(), view.data_len());
    assert_eq!(
        &rebuilt.finish_stamped(view.stamp())[..],
        data,
        "batch does not rebuild to its bytes"
    );
}

/// Input: a whole frame as it arrives on a connection: the 24-byte header,
/// then the body (and bulk, which is not decoded). The header must respect
/// the cap and re-encode to itself; a body that is all there is decoded as
/// the message its kind and opcode name.
pub fn frame(data: &[u8]) {
    let Some(raw) = data.get(..FRAME_HEADER_LEN) else {
        return;
    };
    let raw: &[u8; FRAME_HEADER_LEN] = raw.try_into().expect("24 bytes");
    let Ok(h) = FrameHeader::decode(raw, MAX_FRAME) else {
        return;
    };
    assert!(20 + u64::from(h.body_len) + h.bulk_len <= u64::from(MAX_FRAME));
    let mut expected = *raw;
    expected[10..12].fill(0); // reserved flags: ignored on decode, zero on encode
    assert_eq!(h.encode(MAX_FRAME), Ok(expected), "{h:?}");
    let rest = &data[FRAME_HEADER_LEN..];
    let Some(body) = rest.get(..h.body_len as usize) else {
        return;
    };
    match h.kind {
        FrameKind::Request => request_body(h.version, h.opcode, body),
        FrameKind::Response => response_body(h.version, h.opcode, body),
        FrameKind::Push => push_body(h.version, h.opcode, body),
    }
}

fn with_opcode(opcode: u16, body: &BytesMut) -> Vec<u8> {
    let mut v = vec![u8::try_from(opcode).expect("opcodes fit a byte")];
    v.extend_from_slice(body);
    v
}

fn framed(kind: FrameKind, opcode: u16, id: u64, body: &BytesMut, bulk: &[u8]) -> Vec<u8> {
    let h = FrameHeader {
        version: PROTOCOL_VERSION,
        kind,
        opcode,
        id,
        body_len: body.len() as u32,
        bulk_len: bulk.len() as u64,
    };
    let mut v = h.encode(MAX_FRAME).expect("seed frames fit").to_vec();
    v.extend_from_slice(body);
    v.extend_from_slice(bulk);
    v
}

fn spec() -> TopicSpec {
    TopicSpec {
        name: "runs".into(),
        partitions: 4,
        partition_type: PartitionType::Memory,
        durability: Durability::Interval(50),
        validator: "json-schema".into(),
        schema: Some(r#"{"type":"object","required":["id"]}"#.into()),
        selector: "hash:id".into(),
        serializer: "binary".into(),
        retention_bytes: Some(1 << 30),
        retention_ms: None,
        segment_bytes: Some(1 << 26),
        overflow: Some(Overflow::DropOldest),
        replication_factor: 3,
        min_in_sync: 2,
        tier: Some(true),
        local_retention_bytes: Some(1 << 28),
        local_retention_ms: Some(3_600_000),
        compression: "zstd:3".into(),
    }
}

fn batch_seed() -> Bytes {
    let mut b = BatchBuilder::new();
    b.push(br#"{"id":1}"#, b"", 16);
    b.push(br#"{"id":2,"tags":["a"]}"#, b"f32[2,2]", 16);
    b.push(b"", b"", 0);
    b.finish()
}

fn topic_info() -> TopicInfo {
    TopicInfo {
        spec: spec(),
        partitions: vec![
            PartitionInfo {
                id: 0,
                member: 1,
                addr: "127.0.0.1:7400".into(),
                first_offset: 3,
                next_offset: 90,
                status: PartitionStatus::Ok,
                dropped_events: 0,
                replicas: vec![1, 2, 0],
                isr: vec![1, 2],
                epoch: 4,
                moving_to: vec![3, 2, 0],
            },
            PartitionInfo {
                id: 1,
                member: 2,
                addr: "127.0.0.1:7401".into(),
                first_offset: 0,
                next_offset: 0,
                status: PartitionStatus::Failed("fsync failed".into()),
                dropped_events: 7,
                replicas: Vec::new(),
                isr: Vec::new(),
                epoch: 0,
                moving_to: Vec::new(),
            },
        ],
        state: TopicState {
            open_producers: 1,
            closed_producers: 2,
            ended: false,
            expired_producers: 1,
        },
    }
}

/// One example of every request (every opcode).
pub fn sample_requests() -> Vec<Request> {
    let t = || "runs".to_string();
    vec![
        Request::Hello {
            client: "strom-cli 0.1".into(),
            max_version: PROTOCOL_VERSION,
            nonce: Bytes::from_static(&[9; 32]),
        },
        Request::CreateTopic {
            spec: spec(),
            member: Some(1),
        },
        Request::DescribeTopic {
            name: t(),
            offsets: true,
        },
        Request::ListTopics,
        Request::DeleteTopic { name: t() },
        Request::CompleteTopic { name: t() },
        Request::RegisterProducer { topic: t() },
        Request::CloseProducer {
            topic: t(),
            producer: 17,
        },
        Request::Produce {
            topic: t(),
            partition: 2,
            count: 3,
            acks_all: true,
            meta: batch_seed(),
        },
        Request::Subscribe {
            stream: 5,
            topic: t(),
            partition: 1,
            consumer: "analysis".into(),
            start: StartPos::Offset(42),
            prefetch: 1000,
        },
        Request::Credit {
            stream: 5,
            events: 64,
        },
        Request::Unsubscribe { stream: 5 },
        Request::FetchData {
            topic: t(),
            partition: 0,
            items: vec![(0, vec![(0, 16), (20, 4)]), (3, vec![])],
        },
        Request::Commit {
            topic: t(),
            partition: 0,
            consumer: "analysis".into(),
            offset: 9,
        },
        Request::Offsets {
            topic: t(),
            partition: 3,
        },
        Request::Join {
            member: None,
            addr: "127.0.0.1:7401".into(),
            addrs: vec!["127.0.0.1:7401".into(), "shm:///run/strom/a.sock".into()],
            restarted: true,
        },
        Request::Heartbeat {
            member: 2,
            addr: "127.0.0.1:7401".into(),
            addrs: Vec::new(),
        },
        Request::HostPartitions {
            topic_id: 8,
            spec: spec(),
            partitions: vec![0, 3],
            sealed: true,
        },
        Request::SealPartitions { topic: t() },
        Request::DropPartitions { topic: t() },
        Request::AddPartitions {
            topic: t(),
            count: 2,
            member: Some(3),
        },
        Request::Members,
        Request::PartitionStats {
            topic: t(),
            partitions: vec![1, 2, 3],
        },
        Request::Limits,
        Request::Scrub {
            topic: t(),
            partition: 0,
        },
        Request::OpenProducer {
            topic: t(),
            lease_ms: 10_000,
        },
        Request::RenewLeases {
            producers: vec![(t(), 1), (t(), 2)],
        },
        Request::JoinConsumerGroup {
            stream: 4,
            spec: sample_group_spec(),
            consumer: Some(3),
            label: "worker-1".into(),
        },
        Request::ConsumerHeartbeat {
            group: "g".into(),
            consumer: 3,
            owned: vec![(0, 2), (4, 5)],
            done: vec![(4, 100)],
        },
        Request::LeaveConsumerGroup {
            group: "g".into(),
            consumer: 3,
        },
        Request::DescribeConsumerGroup { group: "g".into() },
        Request::ListConsumerGroups,
        Request::DeleteConsumerGroup { group: "g".into() },
        Request::GroupSubscribe {
            stream: 5,
            spec: sample_group_spec(),
            partition: 1,
            consumer: 3,
            epoch: 0,
            prefetch: 64,
        },
        Request::GroupAck {
            topic: t(),
            partition: 1,
            group: "g".into(),
            acks: vec![(10, 3), (20, 1)],
            nacks: vec![(14, 1)],
        },
        Request::GroupCommit {
            topic: t(),
            partition: 1,
            group: "g".into(),
            consumer: 3,
            epoch: 2,
            offset: 40,
        },
        Request::FenceGroupPartition {
            topic: t(),
            partition: 1,
            group: "g".into(),
            consumer: 3,
            epoch: 2,
        },
        Request::ConsumerGroupStats {
            spec: sample_group_spec(),
            partitions: vec![0, 1],
        },
        Request::DropConsumerGroup {
            topic: t(),
            group: "g".into(),
        },
        Request::ServerSnapshot,
        Request::KafkaGroupView {
            spec: ConsumerGroupSpec::new("kg", "runs", ConsumerGroupMode::Kafka),
            generation: 3,
            consumers: vec![GroupConsumerInfo {
                id: 1,
                label: "rdkafka-0".into(),
                alive: true,
                last_seen_ms: 40,
                partitions: vec![0, 1],
            }],
        },
        Request::MetaRpc {
            rpc: Bytes::from_static(b"\x01{\"Vote\":{}}"),
        },
        Request::SetReplicaRoles {
            topic: t(),
            roles: vec![ReplicaRole {
                partition: 1,
                epoch: 3,
                leader: 2,
                leader_addr: "127.0.0.1:7402".into(),
                followers: vec![0, 1],
                isr: vec![2, 0],
            }],
        },
        Request::ReplicaFetch {
            topic: t(),
            partition: 1,
            epoch: 3,
            follower: 0,
            from: 4096,
            last_epoch: 2,
            max_bytes: 4 << 20,
        },
        Request::ReportIsr {
            topic: t(),
            partition: 1,
            epoch: 3,
            isr: vec![2],
        },
        Request::ReleasePartitions {
            topic: t(),
            topic_id: 9,
            partitions: vec![0, 2],
        },
        Request::MovePartition {
            topic: t(),
            partition: 1,
            replicas: vec![3, 1, 2],
        },
        Request::DrainMember {
            member: 2,
            dead: false,
        },
        Request::ProveMember {
            member: 2,
            proof: Bytes::from_static(&[3; 32]),
        },
        Request::Authenticate {
            token: "strom1.e30.AAAA".into(),
        },
        Request::SecurityTable { have: 4 },
        Request::AlterAcls {
            add: true,
            json: "[]".into(),
        },
        Request::RevokeToken { id: "0a1b".into() },
        Request::SetScramUser {
            user: "erin".into(),
            json: "[]".into(),
        },
        Request::AlterQuotas { json: "{}".into() },
        Request::QuotaTable { have: 2 },
    ]
}

fn sample_group_spec() -> ConsumerGroupSpec {
    let mut spec = ConsumerGroupSpec::new("g", "runs", ConsumerGroupMode::Shared);
    spec.max_deliveries = 3;
    spec.dead_letter = Some(spec.default_dead_letter());
    spec
}

/// One example of every response.
pub fn sample_responses() -> Vec<Response> {
    let member = |id: u32| MemberInfo {
        id,
        addr: format!("127.0.0.1:{}", 7400 + id),
        alive: id != 2,
        last_seen_ms: u64::from(id) * 10,
        addrs: match id {
            0 => vec!["127.0.0.1:7400".into(), "shm:///run/strom/m0.sock".into()],
            _ => Vec::new(),
        },
        role: match id {
            0 => "leader".into(),
            _ => String::new(),
        },
        draining: id == 2,
    };
    vec![
        Response::error(ErrorCode::TOPIC_NOT_FOUND, "no topic 'runs'"),
        Response::Done,
        Response::Hello {
            member: 1,
            master: 0,
            members: vec![GroupMember {
                id: 0,
                addr: "127.0.0.1:7400".into(),
                addrs: vec!["127.0.0.1:7400".into(), "shm:///run/strom/m0.sock".into()],
            }],
            version: PROTOCOL_VERSION,
            nonce: Bytes::from_static(&[4; 32]),
        },
        Response::Topic(topic_info()),
        Response::Topics(vec![topic_info(), topic_info()]),
        Response::Producer { id: 3 },
        Response::Produced {
            base_offset: 100,
            count: 3,
            timestamp_us: 1_700_000_000_000_000,
        },
        Response::Subscribed { start_offset: 42 },
        Response::Data { total: 20 },
        Response::Offsets(vec![("analysis".into(), 9), ("ui".into(), 0)]),
        Response::Joined {
            member: 2,
            members: vec![member(0), member(2)],
        },
        Response::Members(vec![member(0), member(1), member(2)]),
        Response::Stats(topic_info().partitions),
        Response::Limits {
            max_frame_bytes: 256 << 20,
            max_batch_bytes: 64 << 20,
            meta_voters: 3,
            security: 2,
        },
        Response::Scrubbed {
            segments: 3,
            batches: 70,
            bytes: 1 << 20,
            damaged: vec![(10, 12)],
            quarantined: vec![(4, 4), (10, 12)],
        },
        Response::ProducerLease {
            id: 4,
            lease_ms: 10_000,
        },
        Response::Leases {
            lost: vec![("runs".into(), 3)],
        },
        Response::ConsumerJoined {
            consumer: 3,
            spec: sample_group_spec(),
            generation: 2,
        },
        Response::ConsumerAssignment {
            generation: 2,
            assigned: vec![(0, 1), (3, 4)],
            ended: false,
            heartbeat_ms: 3000,
        },
        Response::ConsumerGroup(sample_group_info()),
        Response::ConsumerGroups(vec![sample_group_info()]),
        Response::GroupStats(sample_group_info().partitions),
        Response::Acked { floor: 17 },
        Response::ServerSnapshot {
            json: r#"{"member":0,"partitions":[]}"#.into(),
        },
        Response::MetaRpc {
            rpc: Bytes::from_static(b"\x01{\"Vote\":{\"Ok\":{}}}"),
        },
        Response::ReplicaBatches {
            hwm: 10,
            truncate_to: None,
            epochs: vec![(1, 0), (3, 8)],
            batches: vec![ReplicaBatchHead {
                base_offset: 8,
                count: 2,
                timestamp_us: 1_700_000_000_000_000,
                meta_len: 3,
                data_len: 4,
            }],
            bytes: Bytes::from_static(b"abcdefg"),
            offsets: vec![("analysis".into(), 7)],
        },
        Response::MemberProven {
            member: 0,
            proof: Bytes::from_static(&[5; 32]),
        },
        Response::Authenticated {
            principal: "User:alice".into(),
        },
        Response::SecurityTable {
            version: 4,
            json: "{}".into(),
        },
        Response::QuotaTable {
            version: 2,
            json: "{}".into(),
        },
    ]
}

fn sample_group_info() -> ConsumerGroupInfo {
    ConsumerGroupInfo {
        spec: sample_group_spec(),
        generation: 2,
        consumers: vec![GroupConsumerInfo {
            id: 3,
            label: "worker-1".into(),
            alive: true,
            last_seen_ms: 12,
            partitions: vec![1],
        }],
        partitions: vec![GroupPartitionInfo {
            partition: 1,
            member: 0,
            holder: Some((3, 2)),
            committed: 10,
            next_offset: 30,
            pending: 4,
            acked_above: 2,
            redelivered: 1,
            dead_lettered: 0,
            pending_by_consumer: vec![(3, 4)],
            status: PartitionStatus::Ok,
        }],
        ended: false,
    }
}

/// One example of every push.
pub fn sample_pushes() -> Vec<Push> {
    vec![
        Push::Events {
            partition: 1,
            base_offset: 40,
            count: 3,
            timestamp_us: 1_700_000_000_000_000,
            meta: batch_seed(),
        },
        Push::EndOfStream {
            partition: 1,
            end_offset: 43,
        },
        Push::StreamError {
            code: ErrorCode::PARTITION_FAILED,
            message: "fsync failed".into(),
        },
        Push::Gap {
            partition: 1,
            first: 10,
            last: 12,
            code: ErrorCode::DATA_CORRUPT,
        },
        Push::Deliver {
            partition: 1,
            runs: vec![Run {
                batch_base: 10,
                first: 1,
                count: 2,
                data_pos: 8,
                timestamp_us: 1_700_000_000_000_000,
                deliveries: 2,
            }],
            meta: batch_seed(),
        },
        Push::ConsumerAssignment {
            generation: 3,
            assigned: vec![(2, 7)],
            ended: true,
            heartbeat_ms: 3000,
        },
    ]
}

/// The seed corpus: `(target, file name, bytes)`, valid encodings of every
/// message and a few frames and batches. Committed under
/// `fuzz/corpus/<target>/<name>`; the stable test checks the files match.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let enc = |f: &dyn Fn(&mut BytesMut)| {
        let mut b = BytesMut::new();
        f(&mut b);
        b
    };
    for m in sample_requests() {
        let body = enc(&|b| m.encode(PROTOCOL_VERSION, b));
        let op = m.opcode();
        out.push(("request", format!("op{op:02}"), with_opcode(op, &body)));
        let bulk: &[u8] = if op == 9 { &[7; 32] } else { &[] };
        let f = framed(FrameKind::Request, op, u64::from(op), &body, bulk);
        out.push(("frame", format!("request-op{op:02}"), f));
    }
    for m in sample_responses() {
        let body = enc(&|b| m.encode(PROTOCOL_VERSION, b));
        let op = m.opcode();
        out.push(("response", format!("op{op:02}"), with_opcode(op, &body)));
        let bulk: &[u8] = if op == 9 { &[1; 20] } else { &[] };
        let f = framed(FrameKind::Response, op, 1000 + u64::from(op), &body, bulk);
        out.push(("frame", format!("response-op{op:02}"), f));
    }
    for m in sample_pushes() {
        let body = enc(&|b| m.encode(PROTOCOL_VERSION, b));
        let op = m.opcode();
        out.push(("push", format!("op{op:02}"), with_opcode(op, &body)));
        let f = framed(FrameKind::Push, op, 5, &body, &[]);
        out.push(("frame", format!("push-op{op:02}"), f));
    }
    out.push(("batch", "three-events".into(), batch_seed().to_vec()));
    out.push((
        "batch",
        "empty".into(),
        BatchBuilder::new().finish().to_vec(),
    ));
    let mut b = BatchBuilder::new();
    for i in 0..20u64 {
        b.push(format!(r#"{{"i":{i}}}"#).as_bytes(), &[i as u8; 3], i * 100);
    }
    out.push(("batch", "twenty-events".into(), b.finish().to_vec()));
    let mut b = BatchBuilder::new();
    b.push(br#"{"i":1}"#, b"", 8);
    b.push(b"", b"d", 0);
    let stamp = strom_proto::ProducerStamp {
        producer: 7,
        sequence: 3,
        restart: true,
    };
    let stamped = b.finish_stamped(Some(stamp)).to_vec();
    out.push(("batch", "stamped".into(), stamped));
    out
}
