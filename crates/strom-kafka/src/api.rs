//! Dispatch by API key and version, `ApiVersions`, and the answer to
//! anything unsupported. Every body is checked by [`crate::guard`] before
//! `kafka-protocol` decodes it.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

use crate::error::{kcode, FrameError};
use crate::guard;
use crate::request::{api_name, decode, ready, respond, supported, Ctx, Header, Reply, SUPPORTED};

/// Handles one request: decode, act, and a future of the answer.
pub fn handle(ctx: &Arc<Ctx>, h: Header, body: Bytes) -> Result<Reply, FrameError> {
    let kafka = &ctx.services.stats.kafka;
    let key = match ApiKey::try_from(h.key) {
        Ok(k) if supported(k, h.version) => k,
        Ok(ApiKey::ApiVersions) => {
            kafka.request("ApiVersions");
            kafka.error("ApiVersions", "UNSUPPORTED_VERSION");
            return Ok(ready(api_versions(
                h.correlation,
                0,
                kcode::UNSUPPORTED_VERSION,
            )));
        }
        other => {
            let api = other.map_or("Unsupported", api_name);
            kafka.request(api);
            kafka.error(api, "UNSUPPORTED_VERSION");
            tracing::info!(api_key = h.key, version = h.version, known = other.is_ok(), client = ?h.client_id, "unsupported Kafka API key or version");
            return Ok(ready(unsupported(h.correlation)));
        }
    };
    kafka.request(api_name(key));
    let v = h.version;
    let c = h.correlation;
    match key {
        ApiKey::ApiVersions => {
            decode::<kafka_protocol::messages::ApiVersionsRequest>(
                "ApiVersions",
                guard::API_VERSIONS,
                v,
                v >= 3,
                body,
            )?;
            Ok(ready(api_versions(c, v, kcode::NONE)))
        }
        ApiKey::Metadata => crate::admin::metadata(ctx, v, c, body),
        ApiKey::CreateTopics => crate::admin::create_topics(ctx, v, c, body),
        ApiKey::DeleteTopics => crate::admin::delete_topics(ctx, v, c, body),
        ApiKey::InitProducerId => crate::admin::init_producer_id(ctx, v, c, body),
        ApiKey::Produce => crate::produce::produce(ctx, v, c, body),
        ApiKey::ListOffsets => crate::fetch::list_offsets(ctx, v, c, body),
        ApiKey::Fetch => crate::fetch::fetch(ctx, v, c, body),
        ApiKey::FindCoordinator => crate::group_api::find_coordinator(ctx, v, c, body),
        ApiKey::JoinGroup => crate::group_api::join_group(ctx, v, c, h.client_id, body),
        ApiKey::SyncGroup => crate::group_api::sync_group(ctx, v, c, body),
        ApiKey::Heartbeat => crate::group_api::heartbeat(ctx, v, c, body),
        ApiKey::LeaveGroup => crate::group_api::leave_group(ctx, v, c, body),
        ApiKey::OffsetCommit => crate::group_api::offset_commit(ctx, v, c, body),
        ApiKey::OffsetFetch => crate::group_api::offset_fetch(ctx, v, c, body),
        ApiKey::ListGroups => crate::group_api::list_groups(ctx, v, c, body),
        ApiKey::DescribeGroups => crate::group_api::describe_groups(ctx, v, c, body),
        ApiKey::CreateAcls => crate::acls::create_acls(ctx, v, c, body),
        ApiKey::DescribeAcls => crate::acls::describe_acls(ctx, v, c, body),
        ApiKey::DeleteAcls => crate::acls::delete_acls(ctx, v, c, body),
        ApiKey::DescribeUserScramCredentials => crate::scram_admin::describe(ctx, v, c, body),
        ApiKey::AlterUserScramCredentials => crate::scram_admin::alter(ctx, v, c, body),
        _ => Ok(ready(unsupported(c))),
    }
}

/// Parses and decodes one request frame (after its size prefix) as
/// [`handle`] would, without acting on it: the header, then the guard and
/// the decoder of a supported key and version. For fuzzing the decoders.
pub fn check_request(mut frame: Bytes) -> Result<(), FrameError> {
    use kafka_protocol::messages as m;
    let h = crate::request::header(&mut frame)?;
    let Ok(key) = ApiKey::try_from(h.key) else {
        return Ok(());
    };
    if !supported(key, h.version) {
        return Ok(());
    }
    let v = h.version;
    match key {
        ApiKey::ApiVersions => {
            decode::<m::ApiVersionsRequest>("ApiVersions", guard::API_VERSIONS, v, v >= 3, frame)
                .map(drop)
        }
        ApiKey::Metadata => {
            decode::<m::MetadataRequest>("Metadata", guard::METADATA, v, false, frame).map(drop)
        }
        ApiKey::CreateTopics => {
            decode::<m::CreateTopicsRequest>("CreateTopics", guard::CREATE_TOPICS, v, false, frame)
                .map(drop)
        }
        ApiKey::DeleteTopics => {
            decode::<m::DeleteTopicsRequest>("DeleteTopics", guard::DELETE_TOPICS, v, false, frame)
                .map(drop)
        }
        ApiKey::InitProducerId => decode::<m::InitProducerIdRequest>(
            "InitProducerId",
            guard::INIT_PRODUCER_ID,
            v,
            false,
            frame,
        )
        .map(drop),
        ApiKey::Produce => {
            let req: m::ProduceRequest = decode("Produce", guard::PRODUCE, v, false, frame)?;
            for pd in req.topic_data.iter().flat_map(|t| &t.partition_data) {
                if let Some(r) = &pd.records {
                    let _ = crate::records::parse(r.clone(), 1 << 20);
                }
            }
            Ok(())
        }
        ApiKey::ListOffsets => {
            decode::<m::ListOffsetsRequest>("ListOffsets", guard::LIST_OFFSETS, v, false, frame)
                .map(drop)
        }
        ApiKey::Fetch => {
            decode::<m::FetchRequest>("Fetch", guard::FETCH, v, false, frame).map(drop)
        }
        ApiKey::FindCoordinator => decode::<m::FindCoordinatorRequest>(
            "FindCoordinator",
            guard::FIND_COORDINATOR,
            v,
            false,
            frame,
        )
        .map(drop),
        ApiKey::JoinGroup => {
            decode::<m::JoinGroupRequest>("JoinGroup", guard::JOIN_GROUP, v, false, frame).map(drop)
        }
        ApiKey::SyncGroup => {
            decode::<m::SyncGroupRequest>("SyncGroup", guard::SYNC_GROUP, v, false, frame).map(drop)
        }
        ApiKey::Heartbeat => {
            decode::<m::HeartbeatRequest>("Heartbeat", guard::HEARTBEAT, v, false, frame).map(drop)
        }
        ApiKey::LeaveGroup => {
            decode::<m::LeaveGroupRequest>("LeaveGroup", guard::LEAVE_GROUP, v, false, frame)
                .map(drop)
        }
        ApiKey::OffsetCommit => {
            decode::<m::OffsetCommitRequest>("OffsetCommit", guard::OFFSET_COMMIT, v, false, frame)
                .map(drop)
        }
        ApiKey::OffsetFetch => {
            decode::<m::OffsetFetchRequest>("OffsetFetch", guard::OFFSET_FETCH, v, false, frame)
                .map(drop)
        }
        ApiKey::ListGroups => {
            decode::<m::ListGroupsRequest>("ListGroups", guard::LIST_GROUPS, v, false, frame)
                .map(drop)
        }
        ApiKey::DescribeGroups => decode::<m::DescribeGroupsRequest>(
            "DescribeGroups",
            guard::DESCRIBE_GROUPS,
            v,
            false,
            frame,
        )
        .map(drop),
        ApiKey::CreateAcls => {
            decode::<m::CreateAclsRequest>("CreateAcls", guard::CREATE_ACLS, v, false, frame)
                .map(drop)
        }
        ApiKey::DescribeAcls => {
            decode::<m::DescribeAclsRequest>("DescribeAcls", guard::DESCRIBE_ACLS, v, false, frame)
                .map(drop)
        }
        ApiKey::DeleteAcls => {
            decode::<m::DeleteAclsRequest>("DeleteAcls", guard::DELETE_ACLS, v, false, frame)
                .map(drop)
        }
        ApiKey::SaslHandshake => decode::<m::SaslHandshakeRequest>(
            "SaslHandshake",
            guard::SASL_HANDSHAKE,
            v,
            false,
            frame,
        )
        .map(drop),
        ApiKey::SaslAuthenticate => decode::<m::SaslAuthenticateRequest>(
            "SaslAuthenticate",
            guard::SASL_AUTHENTICATE,
            v,
            false,
            frame,
        )
        .map(drop),
        ApiKey::DescribeUserScramCredentials => decode::<m::DescribeUserScramCredentialsRequest>(
            "DescribeUserScramCredentials",
            guard::DESCRIBE_USER_SCRAM,
            v,
            true,
            frame,
        )
        .map(drop),
        ApiKey::AlterUserScramCredentials => decode::<m::AlterUserScramCredentialsRequest>(
            "AlterUserScramCredentials",
            guard::ALTER_USER_SCRAM,
            v,
            true,
            frame,
        )
        .map(drop),
        _ => Ok(()),
    }
}

/// The `ApiVersions` answer at `version` (0 when the client asked for a
/// version this server does not know, as Kafka does).
fn api_versions(correlation: i32, version: i16, error: i16) -> Bytes {
    let api_keys = SUPPORTED
        .iter()
        .map(|(k, lo, hi)| {
            ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(*lo)
                .with_max_version(*hi)
        })
        .collect();
    let body = ApiVersionsResponse::default()
        .with_error_code(error)
        .with_api_keys(api_keys);
    respond(ApiKey::ApiVersions, version, correlation, &body)
}

/// The answer to an API key or version this server does not serve: the
/// correlation id and `UNSUPPORTED_VERSION`, the shape of an `ApiVersions`
/// v0 error (clients only send what `ApiVersions` advertised).
fn unsupported(correlation: i32) -> Bytes {
    let mut out = BytesMut::with_capacity(6);
    out.put_i32(correlation);
    out.put_i16(kcode::UNSUPPORTED_VERSION);
    out.freeze()
}
