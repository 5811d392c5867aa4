//! `Metadata`, `CreateTopics`, `DeleteTopics` and `InitProducerId` over
//! the registry, through `ControlService::ask_registry`: here on the
//! master, else forwarded to it (or to the metadata quorum's leader), so
//! every broker answers them.
//!
//! The broker list holds every member that serves Kafka (each publishes its
//! `kafka://host:port` among its addresses; node id = member id). A
//! partition is led by its owner; one whose owner serves no Kafka (or is
//! down) is listed with `LEADER_NOT_AVAILABLE` (docs/kafka.md).

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest,
    MetadataResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use strom_proto::{PartitionStatus, Request, Response, TopicInfo, TopicSpec};

use strom_auth::{Operation, Resource};

use crate::error::{kafka_code, kcode, FrameError};
use crate::guard;
use crate::request::{decode, ready, Ctx, Reply};

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn str_of(s: &StrBytes) -> String {
    s.as_str().to_string()
}

/// Asks the registry (here, or at the master: `ask_registry`) for topics.
async fn ask_registry(ctx: &Ctx, req: Request) -> Result<Vec<TopicInfo>, i16> {
    match ctx.services.control.ask_registry(req).await {
        Ok(Response::Topics(t)) => Ok(t),
        Ok(Response::Topic(t)) => Ok(vec![t]),
        Ok(_) => Err(kcode::UNKNOWN_SERVER_ERROR),
        Err(e) => {
            tracing::debug!(error = %e, "Kafka Metadata: the registry refused or is unreachable");
            Err(match kafka_code(&e) {
                kcode::UNKNOWN_SERVER_ERROR => kcode::LEADER_NOT_AVAILABLE,
                code => code,
            })
        }
    }
}

/// Every member serving Kafka: (member id, host, port). This server is
/// always in it (its listener answers this very request).
pub(crate) async fn brokers(ctx: &Ctx) -> Vec<(u32, String, i32)> {
    let me = ctx.node_id() as u32;
    let members: Vec<(u32, Vec<String>)> =
        match ctx.services.control.ask_registry(Request::Members).await {
            Ok(Response::Members(m)) => m
                .into_iter()
                .filter(|m| m.alive)
                .map(|m| (m.id, m.addrs))
                .collect(),
            _ => Vec::new(),
        };
    let mut out: Vec<(u32, String, i32)> = members
        .into_iter()
        .filter(|(id, _)| *id != me)
        .filter_map(|(id, addrs)| {
            let (host, port) = addrs.iter().find_map(|a| crate::parse_url(a))?;
            Some((id, host, port))
        })
        .collect();
    out.push((me, ctx.host.clone(), ctx.port));
    out.sort_by_key(|b| b.0);
    out
}

/// The topics a `Metadata` request may see: all of them, or those named.
pub(crate) async fn topics(
    ctx: &Ctx,
    wanted: &Option<Vec<String>>,
) -> Vec<Result<TopicInfo, (String, i16)>> {
    match wanted {
        None => match ask_registry(ctx, Request::ListTopics).await {
            Ok(t) => t.into_iter().map(Ok).collect(),
            Err(_) => Vec::new(),
        },
        Some(names) => {
            let mut out = Vec::with_capacity(names.len());
            for n in names {
                let req = Request::DescribeTopic {
                    name: n.clone(),
                    offsets: false,
                };
                out.push(match ask_registry(ctx, req).await {
                    Ok(mut t) if !t.is_empty() => Ok(t.swap_remove(0)),
                    Ok(_) => Err((n.clone(), kcode::UNKNOWN_TOPIC_OR_PARTITION)),
                    Err(code) => Err((n.clone(), code)),
                });
            }
            out
        }
    }
}

pub fn metadata(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: MetadataRequest = decode("Metadata", guard::METADATA, v, false, body)?;
    // Version 0 uses an empty list, not null, for "all topics".
    let wanted: Option<Vec<String>> = match req.topics {
        Some(t) if !(v == 0 && t.is_empty()) => Some(
            t.iter()
                .filter_map(|t| t.name.as_ref().map(|n| str_of(&n.0)))
                .collect(),
        ),
        _ => None,
    };
    // Before version 4 a Metadata request always allowed creation.
    let auto_create =
        ctx.services.config.kafka_auto_create_topics && (v < 4 || req.allow_auto_topic_creation);
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let me = ctx.node_id();
        let brokers = brokers(&ctx).await;
        let serves = |member: u32| brokers.iter().any(|b| b.0 == member);
        let mut out = Vec::new();
        let mut found = topics(&ctx, &wanted).await;
        // Topics the principal may not describe: refused when named,
        // left out of "all topics" (as Kafka).
        found.retain_mut(|t| match t {
            Ok(info) if !describable(&ctx, wanted.is_some(), &info.spec.name) => {
                *t = Err((info.spec.name.clone(), kcode::TOPIC_AUTHORIZATION_FAILED));
                wanted.is_some()
            }
            _ => true,
        });
        if auto_create {
            for t in found.iter_mut() {
                if let Err((n, kcode::UNKNOWN_TOPIC_OR_PARTITION)) = t {
                    if ctx.topic_code(Operation::Create, n) != kcode::NONE {
                        *t = Err((n.clone(), kcode::TOPIC_AUTHORIZATION_FAILED));
                        continue;
                    }
                    if let Some(info) = create_on_first_use(&ctx, n).await {
                        *t = Ok(info);
                    }
                }
            }
        }
        for t in found {
            let topic = match t {
                Err((n, code)) => MetadataResponseTopic::default()
                    .with_name(Some(name(&n)))
                    .with_error_code(code),
                Ok(info) => {
                    let partitions = info
                        .partitions
                        .iter()
                        .map(|p| {
                            let led = matches!(p.status, PartitionStatus::Ok) && serves(p.member);
                            let mut mp = MetadataResponsePartition::default()
                                .with_partition_index(p.id as i32);
                            if led {
                                let id = BrokerId(p.member as i32);
                                mp = mp
                                    .with_leader_id(id)
                                    .with_replica_nodes(vec![id])
                                    .with_isr_nodes(vec![id]);
                            } else {
                                mp = mp
                                    .with_error_code(kcode::LEADER_NOT_AVAILABLE)
                                    .with_leader_id(BrokerId(-1));
                            }
                            if v >= 7 {
                                mp = mp.with_leader_epoch(0);
                            }
                            mp
                        })
                        .collect();
                    MetadataResponseTopic::default()
                        .with_name(Some(name(&info.spec.name)))
                        .with_partitions(partitions)
                }
            };
            out.push(topic);
        }
        // The registry master coordinates (it is member 0) when it serves
        // Kafka; otherwise this broker.
        let controller = if serves(0) { 0 } else { me };
        let brokers = brokers
            .into_iter()
            .map(|(id, host, port)| {
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(id as i32))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port)
            })
            .collect();
        let mut resp = MetadataResponse::default()
            .with_brokers(brokers)
            .with_topics(out);
        if v >= 1 {
            resp = resp.with_controller_id(BrokerId(controller));
        }
        if v >= 2 {
            resp = resp.with_cluster_id(Some(StrBytes::from_static_str("strom")));
        }
        Some(ctx.respond(ApiKey::Metadata, v, c, &resp))
    }))
}

/// Whether the connection may describe topic `name`: a refusal (audited)
/// when it `named` the topic, else a listing that leaves it out.
fn describable(ctx: &Ctx, named: bool, name: &str) -> bool {
    let res = Resource::topic(name);
    match named {
        true => ctx.may(Operation::Describe, &res),
        false => ctx.sees(&res),
    }
}

/// Creates `name` with `kafka_auto_create_partitions` partitions (on the
/// registry master; elsewhere `None`: the client is told the topic is
/// unknown, and asks again); its description, or `None` if it could not.
async fn create_on_first_use(ctx: &Ctx, name: &str) -> Option<TopicInfo> {
    let reg = ctx.services.control.registry().ok()?;
    let partitions = ctx.services.config.kafka_auto_create_partitions;
    match reg.create(TopicSpec::new(name, partitions), None).await {
        Ok(_) => {
            let created = [(Operation::Create, Resource::topic(name))];
            ctx.audited(&created, "Metadata (kafka_auto_create_topics)");
            tracing::info!(topic = %name, partitions, "Kafka: topic created on first use (kafka_auto_create_topics)")
        }
        Err(e) if e.code() == strom_proto::ErrorCode::TOPIC_EXISTS => {}
        Err(e) => {
            tracing::info!(topic = %name, error = %e, "Kafka: could not create a topic on first use");
            return None;
        }
    }
    reg.describe(name, false).await.ok()
}

pub fn create_topics(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: CreateTopicsRequest = decode("CreateTopics", guard::CREATE_TOPICS, v, false, body)?;
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut results = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let n = str_of(&t.name.0);
            let partitions = if t.num_partitions == -1 {
                1
            } else {
                t.num_partitions
            };
            let outcome: Result<(), (i16, String)> =
                if ctx.topic_code(Operation::Create, &n) != kcode::NONE {
                    Err((
                        kcode::TOPIC_AUTHORIZATION_FAILED,
                        format!("{} may not create topic '{n}'", ctx.who),
                    ))
                } else if partitions < 1 {
                    Err((
                        kcode::INVALID_PARTITIONS,
                        "num_partitions must be at least 1".into(),
                    ))
                } else if !(t.replication_factor == -1 || t.replication_factor == 1) {
                    Err((
                        kcode::INVALID_REPLICATION_FACTOR,
                        "Strom partitions are not replicated yet: use replication factor 1 or -1"
                            .into(),
                    ))
                } else if !t.assignments.is_empty() {
                    Err((
                        kcode::INVALID_REQUEST,
                        "manual replica assignment is not supported".into(),
                    ))
                } else if req.validate_only {
                    Ok(())
                } else {
                    let req = Request::CreateTopic {
                        spec: TopicSpec::new(n.clone(), partitions as u32),
                        member: None,
                    };
                    ctx.change(req, "CreateTopics")
                        .await
                        .map(|_| ())
                        .map_err(|e| (kafka_code(&e), e.to_string()))
                };
            let mut r = CreatableTopicResult::default().with_name(name(&n));
            if let Err((code, msg)) = outcome {
                tracing::info!(topic = %n, code, error = %msg, "Kafka CreateTopics refused");
                r = r.with_error_code(code);
                if v >= 1 {
                    r = r.with_error_message(Some(StrBytes::from_string(msg)));
                }
            }
            results.push(r);
        }
        let resp = CreateTopicsResponse::default().with_topics(results);
        Some(ctx.respond(ApiKey::CreateTopics, v, c, &resp))
    }))
}

pub fn delete_topics(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: DeleteTopicsRequest = decode("DeleteTopics", guard::DELETE_TOPICS, v, false, body)?;
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut results = Vec::with_capacity(req.topic_names.len());
        for t in &req.topic_names {
            let n = str_of(&t.0);
            let req = Request::DeleteTopic { name: n.clone() };
            let code = match ctx.topic_code(Operation::Delete, &n) {
                kcode::NONE => ctx.change(req, "DeleteTopics").await,
                refused => {
                    results.push(
                        DeletableTopicResult::default()
                            .with_name(Some(name(&n)))
                            .with_error_code(refused),
                    );
                    continue;
                }
            };
            let code = match code {
                Ok(_) => kcode::NONE,
                Err(e) => {
                    tracing::info!(topic = %n, error = %e, "Kafka DeleteTopics refused");
                    kafka_code(&e)
                }
            };
            results.push(
                DeletableTopicResult::default()
                    .with_name(Some(name(&n)))
                    .with_error_code(code),
            );
        }
        let resp = DeleteTopicsResponse::default().with_responses(results);
        Some(ctx.respond(ApiKey::DeleteTopics, v, c, &resp))
    }))
}

/// Hands out a fresh producer id (epoch 0), unique across the group and
/// restarts (`producer_ids.rs`). Transactional ids are refused.
pub fn init_producer_id(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: InitProducerIdRequest =
        decode("InitProducerId", guard::INIT_PRODUCER_ID, v, false, body)?;
    let resp = if req.transactional_id.is_some() {
        InitProducerIdResponse::default().with_error_code(kcode::UNSUPPORTED_VERSION)
    } else {
        match ctx.producer_ids.next(ctx.services.control.member()) {
            Ok(id) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(id))
                .with_producer_epoch(0),
            Err(e) => {
                tracing::error!(error = %e, "Kafka InitProducerId: no producer id");
                InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(-1))
                    .with_error_code(kcode::UNKNOWN_SERVER_ERROR)
            }
        }
    };
    Ok(ready(ctx.respond(ApiKey::InitProducerId, v, c, &resp)))
}
