//! The group APIs: `FindCoordinator` (always this server), `JoinGroup`,
//! `SyncGroup`, `Heartbeat` and `LeaveGroup` over [`crate::groups`], and
//! `OffsetCommit` / `OffsetFetch` over Strom's consumer offsets: a Kafka
//! group's committed offset on a partition is the Strom consumer offset
//! under the group's name (`DataService::commit`, durable like any ack), so
//! `strom topic describe` shows the group and its lag.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest,
    HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::messages::{
    DescribeGroupsRequest, DescribeGroupsResponse, GroupId, ListGroupsRequest, ListGroupsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_proto::{Request, Response};
use strom_server::ServerError;

use strom_auth::Operation;

use crate::error::{kafka_code, kcode, FrameError};
use crate::groups::JoinRequest;
use crate::guard;
use crate::request::{decode, ready, Ctx, Reply};

fn s(x: &StrBytes) -> String {
    x.as_str().to_string()
}

fn sb(x: String) -> StrBytes {
    StrBytes::from_string(x)
}

pub fn find_coordinator(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: FindCoordinatorRequest =
        decode("FindCoordinator", guard::FIND_COORDINATOR, v, false, body)?;
    if req.key_type != 0 {
        // Transaction coordinators are not served.
        let resp = FindCoordinatorResponse::default()
            .with_error_code(15) // COORDINATOR_NOT_AVAILABLE
            .with_node_id(BrokerId(-1));
        return Ok(ready(ctx.respond(ApiKey::FindCoordinator, v, c, &resp)));
    }
    let refused = ctx.group_code(Operation::Describe, req.key.as_str());
    if refused != kcode::NONE {
        let resp = FindCoordinatorResponse::default()
            .with_error_code(refused)
            .with_node_id(BrokerId(-1));
        return Ok(ready(ctx.respond(ApiKey::FindCoordinator, v, c, &resp)));
    }
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let (id, host, port) = coordinator(&ctx).await;
        let resp = FindCoordinatorResponse::default()
            .with_node_id(BrokerId(id as i32))
            .with_host(sb(host))
            .with_port(port);
        Some(ctx.respond(ApiKey::FindCoordinator, v, c, &resp))
    }))
}

/// The broker that coordinates every Kafka group: the registry master
/// (member 0) when it serves Kafka, so that all members of a group meet in
/// one coordinator whichever broker they ask; otherwise this broker.
async fn coordinator(ctx: &Ctx) -> (u32, String, i32) {
    let me = (ctx.node_id() as u32, ctx.host.clone(), ctx.port);
    if me.0 == 0 {
        return me;
    }
    crate::admin::brokers(ctx)
        .await
        .into_iter()
        .find(|b| b.0 == 0)
        .unwrap_or(me)
}

/// The native address of the member hosting `topic`'s partition `index`,
/// for a partition this server does not host.
async fn owner_of(ctx: &Ctx, topic: &str, index: u32) -> Option<String> {
    let wanted = Some(vec![topic.to_string()]);
    let info = crate::admin::topics(ctx, &wanted).await.pop()?.ok()?;
    let p = info.partitions.get(index as usize)?;
    (p.member != ctx.services.control.member()).then(|| p.addr.clone())
}

/// Runs a native request at the partition's owner; the Kafka error code of
/// a failure.
async fn at_owner(ctx: &Ctx, topic: &str, index: u32, req: Request) -> Result<Response, i16> {
    let addr = owner_of(ctx, topic, index)
        .await
        .ok_or(kcode::UNKNOWN_TOPIC_OR_PARTITION)?;
    match ctx.services.control.link().peers().call(&addr, &req).await {
        Ok(Response::Error { code, message }) => {
            Err(kafka_code(&ServerError::coded(code, message)))
        }
        Ok(r) => Ok(r),
        Err(e) => {
            tracing::info!(topic = %topic, partition = index, owner = %addr, error = %e, "Kafka group offsets: the partition's owner is unreachable");
            Err(kcode::COORDINATOR_NOT_AVAILABLE)
        }
    }
}

pub fn join_group(
    ctx: &Arc<Ctx>,
    v: i16,
    c: i32,
    client_id: Option<String>,
    body: Bytes,
) -> Result<Reply, FrameError> {
    let req: JoinGroupRequest = decode("JoinGroup", guard::JOIN_GROUP, v, false, body)?;
    let refused = ctx.group_code(Operation::Read, req.group_id.0.as_str());
    if refused != kcode::NONE {
        let resp = JoinGroupResponse::default()
            .with_error_code(refused)
            .with_generation_id(-1)
            .with_member_id(req.member_id.clone());
        return Ok(ready(ctx.respond(ApiKey::JoinGroup, v, c, &resp)));
    }
    let session = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
    let rebalance = if v >= 1 {
        Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64)
    } else {
        session
    };
    let rx = ctx.groups.join(JoinRequest {
        group: s(&req.group_id.0),
        member_id: s(&req.member_id),
        instance: req.group_instance_id.as_ref().map(s),
        client_id: client_id.unwrap_or_else(|| "kafka".into()),
        session,
        rebalance,
        protocol_type: s(&req.protocol_type),
        protocols: req
            .protocols
            .iter()
            .map(|p| (s(&p.name), p.metadata.clone()))
            .collect(),
    });
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let j = rx.await.ok()?;
        let members = j
            .members
            .into_iter()
            .map(|(id, meta)| {
                JoinGroupResponseMember::default()
                    .with_member_id(sb(id))
                    .with_metadata(meta)
            })
            .collect();
        let resp = JoinGroupResponse::default()
            .with_error_code(j.error)
            .with_generation_id(j.generation)
            .with_protocol_name(Some(sb(j.protocol)))
            .with_leader(sb(j.leader))
            .with_member_id(sb(j.member_id))
            .with_members(members);
        Some(ctx.respond(ApiKey::JoinGroup, v, c, &resp))
    }))
}

pub fn sync_group(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: SyncGroupRequest = decode("SyncGroup", guard::SYNC_GROUP, v, false, body)?;
    let refused = ctx.group_code(Operation::Read, req.group_id.0.as_str());
    if refused != kcode::NONE {
        let resp = SyncGroupResponse::default().with_error_code(refused);
        return Ok(ready(ctx.respond(ApiKey::SyncGroup, v, c, &resp)));
    }
    let assignments = req
        .assignments
        .iter()
        .map(|a| (s(&a.member_id), a.assignment.clone()))
        .collect();
    let rx = ctx.groups.sync(
        req.group_id.0.as_str(),
        req.generation_id,
        req.member_id.as_str(),
        assignments,
    );
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let (error, assignment) = rx.await.ok()?;
        let resp = SyncGroupResponse::default()
            .with_error_code(error)
            .with_assignment(assignment);
        Some(ctx.respond(ApiKey::SyncGroup, v, c, &resp))
    }))
}

pub fn heartbeat(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: HeartbeatRequest = decode("Heartbeat", guard::HEARTBEAT, v, false, body)?;
    let refused = ctx.group_code(Operation::Read, req.group_id.0.as_str());
    let error = if refused != kcode::NONE {
        refused
    } else {
        ctx.groups.heartbeat(
            req.group_id.0.as_str(),
            req.generation_id,
            req.member_id.as_str(),
        )
    };
    let resp = HeartbeatResponse::default().with_error_code(error);
    Ok(ready(ctx.respond(ApiKey::Heartbeat, v, c, &resp)))
}

pub fn leave_group(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: LeaveGroupRequest = decode("LeaveGroup", guard::LEAVE_GROUP, v, false, body)?;
    let error = match ctx.group_code(Operation::Read, req.group_id.0.as_str()) {
        kcode::NONE => ctx
            .groups
            .leave(req.group_id.0.as_str(), req.member_id.as_str()),
        refused => refused,
    };
    let resp = LeaveGroupResponse::default().with_error_code(error);
    Ok(ready(ctx.respond(ApiKey::LeaveGroup, v, c, &resp)))
}

pub fn offset_commit(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: OffsetCommitRequest = decode("OffsetCommit", guard::OFFSET_COMMIT, v, false, body)?;
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let group = s(&req.group_id.0);
        let allowed = match ctx.group_code(Operation::Read, &group) {
            kcode::NONE => ctx.groups.check_commit(
                &group,
                req.generation_id_or_member_epoch,
                req.member_id.as_str(),
            ),
            refused => refused,
        };
        let mut topics = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let name = s(&t.name.0);
            let mut parts = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let code = if allowed != kcode::NONE {
                    allowed
                } else if ctx.topic_code(Operation::Read, &name) != kcode::NONE {
                    kcode::TOPIC_AUTHORIZATION_FAILED
                } else {
                    commit(&ctx, &name, p.partition_index, &group, p.committed_offset).await
                };
                parts.push(
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code),
                );
            }
            topics.push(
                OffsetCommitResponseTopic::default()
                    .with_name(TopicName(sb(name)))
                    .with_partitions(parts),
            );
        }
        let resp = OffsetCommitResponse::default().with_topics(topics);
        Some(ctx.respond(ApiKey::OffsetCommit, v, c, &resp))
    }))
}

/// Records `offset` as `group`'s position on a partition (a Strom ack).
async fn commit(ctx: &Ctx, topic: &str, index: i32, group: &str, offset: i64) -> i16 {
    let (Ok(index), Ok(offset)) = (u32::try_from(index), u64::try_from(offset)) else {
        return kcode::OFFSET_OUT_OF_RANGE;
    };
    let data = &ctx.services.data;
    let p = match data.partition(topic, index) {
        Ok(p) => p,
        Err(e) => {
            // Hosted by another member: commit there.
            let req = Request::Commit {
                topic: topic.to_string(),
                partition: index,
                consumer: group.to_string(),
                offset,
            };
            return match at_owner(ctx, topic, index, req).await {
                Ok(_) => kcode::NONE,
                Err(kcode::UNKNOWN_TOPIC_OR_PARTITION) => kafka_code(&e),
                Err(code) => code,
            };
        }
    };
    match data.commit(p, group.to_string(), offset).await {
        Ok(()) => kcode::NONE,
        Err(e) => {
            tracing::info!(group = %group, topic = %topic, partition = index, error = %e, "Kafka OffsetCommit refused");
            kafka_code(&e)
        }
    }
}

pub fn offset_fetch(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: OffsetFetchRequest = decode("OffsetFetch", guard::OFFSET_FETCH, v, false, body)?;
    let group = s(&req.group_id.0);
    // (topic, [partition]). No topic list (v2+) asks for every partition
    // the group committed on.
    let named: Option<Vec<(String, Vec<i32>)>> = req.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (s(&t.name.0), t.partition_indexes.clone()))
            .collect()
    });
    let refused = ctx.group_code(Operation::Describe, &group);
    if refused != kcode::NONE {
        let resp = OffsetFetchResponse::default().with_error_code(refused);
        return Ok(ready(ctx.respond(ApiKey::OffsetFetch, v, c, &resp)));
    }
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let all = named.is_none();
        let wanted = match named {
            Some(w) => w,
            None => every_partition(&ctx).await,
        };
        let mut topics = Vec::with_capacity(wanted.len());
        for (name, parts) in wanted {
            // Every topic: what it may not describe is left out; a named
            // one: refused.
            if all && !ctx.sees(&strom_auth::Resource::topic(&name)) {
                continue;
            }
            let hidden = ctx.topic_code(Operation::Describe, &name);
            let mut partitions = Vec::with_capacity(parts.len());
            for i in parts {
                if hidden != kcode::NONE {
                    let r = OffsetFetchResponsePartition::default().with_partition_index(i);
                    partitions.push(r.with_committed_offset(-1).with_error_code(hidden));
                    continue;
                }
                let r = OffsetFetchResponsePartition::default().with_partition_index(i);
                partitions.push(match committed(&ctx, &name, i, &group).await {
                    Ok(o) if all && o < 0 => continue,
                    Ok(o) => r
                        .with_committed_offset(o)
                        .with_metadata(Some(sb(String::new()))),
                    Err(_) if all => continue,
                    Err(code) => r.with_committed_offset(-1).with_error_code(code),
                });
            }
            if all && partitions.is_empty() {
                continue;
            }
            topics.push(
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(sb(name)))
                    .with_partitions(partitions),
            );
        }
        let resp = OffsetFetchResponse::default().with_topics(topics);
        Some(ctx.respond(ApiKey::OffsetFetch, v, c, &resp))
    }))
}

/// Every partition of every topic, as `(topic, [partition])`.
async fn every_partition(ctx: &Ctx) -> Vec<(String, Vec<i32>)> {
    crate::admin::topics(ctx, &None)
        .await
        .into_iter()
        .flatten()
        .map(|t| {
            let n = i32::try_from(t.partitions.len()).unwrap_or(i32::MAX);
            (t.spec.name, (0..n).collect())
        })
        .collect()
}

/// `group`'s committed offset on a partition (-1: none), here or at the
/// member hosting it.
async fn committed(ctx: &Ctx, topic: &str, index: i32, group: &str) -> Result<i64, i16> {
    let index = u32::try_from(index).map_err(|_| kcode::UNKNOWN_TOPIC_OR_PARTITION)?;
    match ctx.services.data.partition(topic, index) {
        Ok(p) => Ok(p.committed(group).map_or(-1, |o| o as i64)),
        Err(e) => {
            let req = Request::Offsets {
                topic: topic.to_string(),
                partition: index,
            };
            match at_owner(ctx, topic, index, req).await {
                Ok(Response::Offsets(all)) => Ok(all
                    .into_iter()
                    .find(|(name, _)| name == group)
                    .map_or(-1, |(_, o)| o as i64)),
                Ok(_) => Err(kcode::UNKNOWN_SERVER_ERROR),
                Err(kcode::UNKNOWN_TOPIC_OR_PARTITION) => Err(kafka_code(&e)),
                Err(code) => Err(code),
            }
        }
    }
}

pub fn list_groups(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let _: ListGroupsRequest = decode("ListGroups", guard::LIST_GROUPS, v, false, body)?;
    let groups = ctx
        .groups
        .list()
        .into_iter()
        .filter(|(name, ..)| ctx.sees(&strom_auth::Resource::group(name)))
        .map(|(name, ptype, _)| {
            ListedGroup::default()
                .with_group_id(GroupId(sb(name)))
                .with_protocol_type(sb(ptype))
        })
        .collect();
    let resp = ListGroupsResponse::default().with_groups(groups);
    Ok(ready(ctx.respond(ApiKey::ListGroups, v, c, &resp)))
}

pub fn describe_groups(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: DescribeGroupsRequest =
        decode("DescribeGroups", guard::DESCRIBE_GROUPS, v, false, body)?;
    let groups = req
        .groups
        .iter()
        .map(|name| {
            let d = DescribedGroup::default().with_group_id(name.clone());
            let refused = ctx.group_code(Operation::Describe, name.0.as_str());
            if refused != kcode::NONE {
                return d.with_error_code(refused);
            }
            match ctx.groups.describe(name.0.as_str()) {
                // Kafka's answer for a group it does not know.
                None => d.with_group_state(StrBytes::from_static_str("Dead")),
                Some(g) => {
                    let members = g
                        .members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(sb(m.id))
                                .with_client_id(sb(m.client_id))
                                .with_member_metadata(m.subscription)
                                .with_member_assignment(m.assignment)
                        })
                        .collect();
                    d.with_group_state(StrBytes::from_static_str(g.state))
                        .with_protocol_type(sb(g.protocol_type))
                        .with_protocol_data(sb(g.protocol))
                        .with_members(members)
                }
            }
        })
        .collect();
    let resp = DescribeGroupsResponse::default().with_groups(groups);
    Ok(ready(ctx.respond(ApiKey::DescribeGroups, v, c, &resp)))
}
