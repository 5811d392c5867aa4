//! Round trips and decoding checks of every message.

use super::*;
use crate::topic::{MemberInfo, TopicState};
use crate::MIN_PROTOCOL_VERSION;

fn round_trip_req(m: Request) {
    let mut b = BytesMut::new();
    m.encode(PROTOCOL_VERSION, &mut b);
    assert_eq!(
        Request::decode(PROTOCOL_VERSION, m.opcode(), &b.freeze()).unwrap(),
        m
    );
}

#[test]
fn requests_round_trip() {
    round_trip_req(Request::Hello {
        client: "x".into(),
        max_version: 3,
        nonce: Bytes::from_static(b"0123456789abcdef0123456789abcdef"),
    });
    round_trip_req(Request::ProveMember {
        member: u32::MAX,
        proof: Bytes::from_static(&[7; 32]),
    });
    round_trip_req(Request::Authenticate {
        token: "strom1.a.b".into(),
    });
    round_trip_req(Request::SecurityTable { have: 7 });
    round_trip_req(Request::QuotaTable { have: 3 });
    round_trip_req(Request::AlterQuotas { json: "{}".into() });
    round_trip_req(Request::AlterAcls {
        add: true,
        json: "[]".into(),
    });
    round_trip_req(Request::RevokeToken { id: "ab12".into() });
    round_trip_req(Request::SetScramUser {
        user: "u".into(),
        json: "[]".into(),
    });
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
    round_trip_req(Request::MetaRpc {
        rpc: Bytes::from_static(b"\x01{}"),
    });
    round_trip_req(Request::KafkaGroupView {
        spec: ConsumerGroupSpec::new("g", "t", crate::ConsumerGroupMode::Kafka),
        generation: 4,
        consumers: vec![GroupConsumerInfo {
            id: 1,
            label: "rdkafka-0".into(),
            alive: true,
            last_seen_ms: 12,
            partitions: vec![0, 3],
        }],
    });
    let mut spec = TopicSpec::new("t", 3);
    spec.overflow = Some(crate::topic::Overflow::DropOldest);
    round_trip_req(Request::CreateTopic { spec, member: None });
    round_trip_req(Request::ListTopics);
    round_trip_req(Request::Produce {
        topic: "t".into(),
        partition: 2,
        count: 3,
        acks_all: true,
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
            addrs: vec!["h:1".into(), "shm:///s".into()],
            role: "voter".into(),
            draining: true,
        }]),
        Response::Done,
        Response::Limits {
            max_frame_bytes: 1 << 28,
            max_batch_bytes: 1 << 27,
            meta_voters: 3,
            security: 2,
        },
        Response::ServerSnapshot {
            json: "{\"member\":1}".into(),
        },
        Response::MetaRpc {
            rpc: Bytes::from_static(b"\x01[]"),
        },
        Response::Authenticated {
            principal: "User:alice".into(),
        },
        Response::SecurityTable {
            version: 3,
            json: "{}".into(),
        },
        Response::QuotaTable {
            version: 4,
            json: "{}".into(),
        },
    ] {
        let mut b = BytesMut::new();
        m.encode(PROTOCOL_VERSION, &mut b);
        assert_eq!(
            Response::decode(PROTOCOL_VERSION, m.opcode(), &b.freeze()).unwrap(),
            m
        );
    }
    let p = Push::Events {
        partition: 1,
        base_offset: 2,
        count: 3,
        timestamp_us: 4,
        meta: Bytes::from_static(b"zz"),
    };
    let mut b = BytesMut::new();
    p.encode(PROTOCOL_VERSION, &mut b);
    assert_eq!(
        Push::decode(PROTOCOL_VERSION, p.opcode(), &b.freeze()).unwrap(),
        p
    );
}

#[test]
fn an_unknown_overflow_tag_is_a_clear_decode_error() {
    let mut spec = TopicSpec::new("t", 1);
    spec.overflow = Some(crate::topic::Overflow::Block);
    let m = Request::CreateTopic { spec, member: None };
    let mut b = BytesMut::new();
    // At version 3 the layout ends with: overflow option tag (1),
    // overflow tag (0), member option (0).
    m.encode(3, &mut b);
    let n = b.len();
    assert_eq!(&b[n - 3..], &[1, 0, 0]);
    b[n - 2] = 7;
    match Request::decode(3, m.opcode(), &b.freeze()) {
        Err(e @ ProtoError::Unknown { .. }) => {
            assert!(e.to_string().contains("overflow policy"), "{e}")
        }
        other => panic!("expected an unknown overflow policy error, got {other:?}"),
    }
}

#[test]
fn unknown_opcode_and_trailing_bytes_are_errors() {
    assert!(Request::decode(PROTOCOL_VERSION, 999, &Bytes::new()).is_err());
    assert!(matches!(
        Request::decode(PROTOCOL_VERSION, 4, &Bytes::from_static(b"x")),
        Err(ProtoError::Trailing(1))
    ));
}

#[test]
fn lease_messages_round_trip() {
    round_trip_req(Request::OpenProducer {
        topic: "t".into(),
        lease_ms: 1500,
    });
    round_trip_req(Request::RenewLeases {
        producers: vec![("t".into(), 3), ("u".into(), 1)],
    });
    for m in [
        Response::ProducerLease {
            id: 4,
            lease_ms: 1000,
        },
        Response::Leases {
            lost: vec![("t".into(), 3)],
        },
    ] {
        let mut b = BytesMut::new();
        m.encode(PROTOCOL_VERSION, &mut b);
        assert_eq!(
            Response::decode(PROTOCOL_VERSION, m.opcode(), &b.freeze()).unwrap(),
            m
        );
    }
}

#[test]
fn expired_producers_nested_in_a_topic_is_sent_only_at_version_2() {
    let state = TopicState {
        open_producers: 1,
        closed_producers: 2,
        ended: false,
        expired_producers: 3,
    };
    let info = TopicInfo {
        spec: TopicSpec::new("t", 1),
        partitions: vec![],
        state,
    };
    let m = Response::Topics(vec![info.clone()]);
    let (mut v1, mut v2) = (BytesMut::new(), BytesMut::new());
    m.encode(1, &mut v1);
    m.encode(2, &mut v2);
    assert_eq!(v2.len(), v1.len() + 4, "version 1 omits the u32 count");
    let mut old = info.clone();
    old.state.expired_producers = 0;
    assert_eq!(
        Response::decode(1, m.opcode(), &v1.freeze()).unwrap(),
        Response::Topics(vec![old])
    );
    assert_eq!(Response::decode(2, m.opcode(), &v2.freeze()).unwrap(), m);
}

/// A message as it might grow: `added` arrived in protocol version 2.
#[derive(Debug, PartialEq)]
enum Grown {
    Probe { kept: u32, added: u64 },
}

messages!(Grown {
    1 => Probe { kept, added @ 2 },
});

#[test]
fn a_field_added_in_a_later_version_is_neither_sent_to_nor_expected_from_older_peers() {
    let m = Grown::Probe { kept: 7, added: 9 };
    assert_eq!(m.opcode(), 1);
    let (mut v1, mut v2) = (BytesMut::new(), BytesMut::new());
    m.encode(1, &mut v1);
    m.encode(2, &mut v2);
    assert_eq!(v1.len(), 4, "a version-1 peer gets the old layout");
    assert_eq!(v2.len(), 12);
    assert_eq!(
        Grown::decode(1, 1, &v1.freeze()).unwrap(),
        Grown::Probe { kept: 7, added: 0 },
        "a version-1 body decodes with the new field at its default"
    );
    assert_eq!(Grown::decode(2, 1, &v2.clone().freeze()).unwrap(), m);
    // The version in the header decides: a version-2 body read as
    // version 1 has 8 bytes too many, and the reverse is truncated.
    assert!(Grown::decode(1, 1, &v2.freeze()).is_err());
    let mut short = BytesMut::new();
    m.encode(1, &mut short);
    assert!(Grown::decode(2, 1, &short.freeze()).is_err());
}

/// A sender may write a message's head, then its `@rest` field from the
/// sender's own buffers: the bytes are those of `encode`.
#[test]
fn the_head_then_the_rest_is_the_whole_body() {
    let produce = Request::Produce {
        topic: "t".into(),
        partition: 2,
        count: 3,
        acks_all: true,
        meta: Bytes::from_static(b"abcdef"),
    };
    let events = Push::Events {
        partition: 1,
        base_offset: 7,
        count: 2,
        timestamp_us: 9,
        meta: Bytes::from_static(b"xyz"),
    };
    let check = |whole: BytesMut, mut head: BytesMut, rest: Option<&Bytes>| {
        head.extend_from_slice(rest.expect("a rest field"));
        assert_eq!(whole, head);
    };
    for v in [MIN_PROTOCOL_VERSION, PROTOCOL_VERSION] {
        let (mut whole, mut head) = (BytesMut::new(), BytesMut::new());
        produce.encode(v, &mut whole);
        produce.encode_head(v, &mut head);
        assert_eq!(&whole[whole.len() - 6..], b"abcdef");
        check(whole, head, produce.rest());
        let (mut whole, mut head) = (BytesMut::new(), BytesMut::new());
        events.encode(v, &mut whole);
        events.encode_head(v, &mut head);
        check(whole, head, events.rest());
    }
    assert!(Request::ListTopics.rest().is_none());
    assert!(Response::Producer { id: 1 }.rest().is_none());
}
