//! The guard's request layouts agree with kafka-protocol: for every API key
//! and version served, a request with non-empty arrays, encoded by
//! kafka-protocol's client side, passes the guard and is walked to its
//! last byte.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use strom_kafka::guard::{layout_of, unwalked};
use strom_kafka::SUPPORTED;

fn st(s: &'static str) -> StrBytes {
    StrBytes::from_static_str(s)
}

fn enc<R: Encodable>(r: &R, v: i16) -> Bytes {
    let mut b = BytesMut::new();
    r.encode(&mut b, v)
        .unwrap_or_else(|e| panic!("encoding v{v}: {e}"));
    b.freeze()
}

fn sample(key: ApiKey, v: i16) -> Bytes {
    let t = || TopicName(st("topic"));
    let g = || GroupId(st("group"));
    match key {
        ApiKey::ApiVersions => enc(&ApiVersionsRequest::default(), v),
        ApiKey::Metadata => enc(
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(t())),
                MetadataRequestTopic::default().with_name(Some(TopicName(st("b")))),
            ])),
            v,
        ),
        ApiKey::CreateTopics => enc(
            &CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
                .with_name(t())
                .with_num_partitions(2)
                .with_assignments(vec![CreatableReplicaAssignment::default()
                    .with_broker_ids(vec![BrokerId(1), BrokerId(2)])])
                .with_configs(vec![CreatableTopicConfig::default()
                    .with_name(st("retention.ms"))
                    .with_value(Some(st("1")))])]),
            v,
        ),
        ApiKey::DeleteTopics => enc(
            &DeleteTopicsRequest::default().with_topic_names(vec![t(), TopicName(st("x"))]),
            v,
        ),
        ApiKey::InitProducerId => enc(&InitProducerIdRequest::default(), v),
        ApiKey::Produce => enc(
            &ProduceRequest::default().with_topic_data(vec![TopicProduceData::default()
                .with_name(t())
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(Bytes::from_static(b"0123456789"))),
                    PartitionProduceData::default().with_index(1),
                ])]),
            v,
        ),
        ApiKey::Fetch => {
            let mut r = FetchRequest::default().with_topics(vec![FetchTopic::default()
                .with_topic(t())
                .with_partitions(vec![
                    FetchPartition::default().with_partition(0),
                    FetchPartition::default().with_partition(1),
                ])]);
            if v >= 7 {
                r = r.with_forgotten_topics_data(vec![ForgottenTopic::default()
                    .with_topic(t())
                    .with_partitions(vec![3, 4])]);
            }
            if v >= 11 {
                r = r.with_rack_id(st("rack"));
            }
            enc(&r, v)
        }
        ApiKey::ListOffsets => enc(
            &ListOffsetsRequest::default().with_topics(vec![ListOffsetsTopic::default()
                .with_name(t())
                .with_partitions(vec![
                    ListOffsetsPartition::default().with_timestamp(-1),
                    ListOffsetsPartition::default().with_partition_index(1),
                ])]),
            v,
        ),
        ApiKey::FindCoordinator => enc(&FindCoordinatorRequest::default().with_key(st("g")), v),
        ApiKey::JoinGroup => enc(
            &JoinGroupRequest::default()
                .with_group_id(g())
                .with_protocol_type(st("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(st("range"))
                    .with_metadata(Bytes::from_static(b"meta"))]),
            v,
        ),
        ApiKey::SyncGroup => enc(
            &SyncGroupRequest::default()
                .with_group_id(g())
                .with_member_id(st("m"))
                .with_assignments(vec![SyncGroupRequestAssignment::default()
                    .with_member_id(st("m"))
                    .with_assignment(Bytes::from_static(b"a"))]),
            v,
        ),
        ApiKey::Heartbeat => enc(&HeartbeatRequest::default().with_group_id(g()), v),
        ApiKey::LeaveGroup => enc(
            &LeaveGroupRequest::default()
                .with_group_id(g())
                .with_member_id(st("m")),
            v,
        ),
        ApiKey::OffsetCommit => enc(
            &OffsetCommitRequest::default()
                .with_group_id(g())
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(t())
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_committed_offset(5)
                            .with_committed_metadata(Some(st("md"))),
                        OffsetCommitRequestPartition::default().with_partition_index(1),
                    ])]),
            v,
        ),
        ApiKey::OffsetFetch => enc(
            &OffsetFetchRequest::default()
                .with_group_id(g())
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(t())
                    .with_partition_indexes(vec![0, 1, 2])])),
            v,
        ),
        ApiKey::ListGroups => enc(&ListGroupsRequest::default(), v),
        ApiKey::DescribeGroups => enc(
            &DescribeGroupsRequest::default().with_groups(vec![g(), GroupId(st("h"))]),
            v,
        ),
        ApiKey::CreateAcls => enc(
            &kafka_protocol::messages::CreateAclsRequest::default().with_creations(vec![
                kafka_protocol::messages::create_acls_request::AclCreation::default()
                    .with_resource_type(2)
                    .with_resource_name(st("t"))
                    .with_resource_pattern_type(3)
                    .with_principal(st("User:a"))
                    .with_host(st("*"))
                    .with_operation(3)
                    .with_permission_type(3),
            ]),
            v,
        ),
        ApiKey::DescribeAcls => enc(
            &kafka_protocol::messages::DescribeAclsRequest::default()
                .with_resource_type_filter(2)
                .with_resource_name_filter(Some(st("t")))
                .with_pattern_type_filter(3)
                .with_principal_filter(Some(st("User:a")))
                .with_host_filter(None)
                .with_operation(1)
                .with_permission_type(1),
            v,
        ),
        ApiKey::DeleteAcls => enc(
            &kafka_protocol::messages::DeleteAclsRequest::default().with_filters(vec![
                kafka_protocol::messages::delete_acls_request::DeleteAclsFilter::default()
                    .with_resource_type_filter(1)
                    .with_resource_name_filter(None)
                    .with_pattern_type_filter(1)
                    .with_principal_filter(Some(st("User:a")))
                    .with_host_filter(Some(st("*")))
                    .with_operation(1)
                    .with_permission_type(1),
            ]),
            v,
        ),
        ApiKey::SaslHandshake => enc(
            &kafka_protocol::messages::SaslHandshakeRequest::default().with_mechanism(st("PLAIN")),
            v,
        ),
        ApiKey::SaslAuthenticate => enc(
            &kafka_protocol::messages::SaslAuthenticateRequest::default()
                .with_auth_bytes(Bytes::from_static(b"\0alice\0token")),
            v,
        ),
        ApiKey::DescribeUserScramCredentials => enc(
            &DescribeUserScramCredentialsRequest::default().with_users(Some(vec![
                describe_user_scram_credentials_request::UserName::default().with_name(st("alice")),
                describe_user_scram_credentials_request::UserName::default().with_name(st("bob")),
            ])),
            v,
        ),
        ApiKey::AlterUserScramCredentials => enc(
            &AlterUserScramCredentialsRequest::default()
                .with_deletions(vec![
                    alter_user_scram_credentials_request::ScramCredentialDeletion::default()
                        .with_name(st("bob"))
                        .with_mechanism(2),
                ])
                .with_upsertions(vec![
                    alter_user_scram_credentials_request::ScramCredentialUpsertion::default()
                        .with_name(st("alice"))
                        .with_mechanism(1)
                        .with_iterations(4096)
                        .with_salt(Bytes::from_static(b"salt"))
                        .with_salted_password(Bytes::from_static(&[7; 32])),
                ]),
            v,
        ),
        other => panic!("no sample for {other:?}"),
    }
}

#[test]
fn every_served_version_is_walked_to_its_last_byte() {
    let mut checked = 0;
    for (key, lo, hi) in SUPPORTED {
        for v in *lo..=*hi {
            let body = sample(*key, v);
            let (layout, flexible) = layout_of(*key, v).expect("a layout");
            let left = unwalked(&body, layout, v, flexible)
                .unwrap_or_else(|e| panic!("{key:?} v{v}: the guard refuses a valid body: {e}"));
            assert_eq!(
                left, 0,
                "{key:?} v{v}: {left} bytes not covered by the layout"
            );
            // One byte short is refused.
            if !body.is_empty() {
                assert!(
                    unwalked(&body[..body.len() - 1], layout, v, flexible).is_err(),
                    "{key:?} v{v}: a truncated body passes"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked} versions checked");
}
