//! Control requests of the native protocol: decode, call the
//! [`ControlService`] and the registry's typed operations, encode. Requests
//! the master sends to members about their partitions go to the local
//! [`crate::members::MemberLink`].

use strom_proto::{Request, Response};

use crate::error::ServerError;
use crate::service::ControlService;

/// Answers one control request; `member` is the member the connection
/// proved, if any (`trust::admit` has checked the request may come from it).
pub async fn handle(
    svc: &ControlService,
    member: Option<u32>,
    req: Request,
) -> Result<Response, ServerError> {
    match req {
        Request::Limits => {
            let (max_frame_bytes, max_batch_bytes) = svc.limits();
            Ok(Response::Limits {
                max_frame_bytes,
                max_batch_bytes,
            })
        }
        req @ (Request::HostPartitions { .. }
        | Request::SealPartitions { .. }
        | Request::DropPartitions { .. }
        | Request::PartitionStats { .. }
        | Request::ConsumerGroupStats { .. }
        | Request::DropConsumerGroup { .. }
        | Request::FenceGroupPartition { .. }
        | Request::SetReplicaRoles { .. }
        | Request::ReleasePartitions { .. }) => svc.link().local(req).await,
        Request::MetaRpc { rpc } => Ok(Response::MetaRpc {
            rpc: svc.meta_rpc(&rpc).await?.into(),
        }),
        req => registry_op(svc, member, req).await,
    }
}

async fn registry_op(
    svc: &ControlService,
    member: Option<u32>,
    req: Request,
) -> Result<Response, ServerError> {
    let r = svc.registry()?;
    Ok(match req {
        Request::CreateTopic { spec, member } => Response::Topic(r.create(spec, member).await?),
        Request::DescribeTopic { name, offsets } => {
            Response::Topic(r.describe(&name, offsets).await?)
        }
        Request::ListTopics => Response::Topics(r.list().await),
        Request::DeleteTopic { name } => {
            r.delete(&name).await?;
            Response::Done
        }
        Request::CompleteTopic { name } => {
            r.complete(&name).await?;
            Response::Done
        }
        Request::RegisterProducer { topic } => Response::Producer {
            id: r.register_producer(&topic).await?,
        },
        Request::OpenProducer { topic, lease_ms } => {
            let (id, lease_ms) = r.open_producer(&topic, lease_ms).await?;
            Response::ProducerLease { id, lease_ms }
        }
        Request::RenewLeases { producers } => Response::Leases {
            lost: r.renew(producers).await,
        },
        Request::CloseProducer { topic, producer } => {
            r.close_producer(&topic, producer).await?;
            Response::Done
        }
        Request::AddPartitions {
            topic,
            count,
            member,
        } => Response::Topic(r.add_partitions(&topic, count, member).await?),
        Request::Join {
            member,
            addr,
            addrs,
            restarted,
        } => Response::Joined {
            member: r.join(member, addr, addrs, restarted).await?,
            members: r.members().await,
        },
        Request::Heartbeat {
            member,
            addr,
            addrs,
        } => {
            r.heartbeat(member, addr, addrs).await?;
            Response::Done
        }
        Request::Members => Response::Members(r.members().await),
        Request::JoinConsumerGroup {
            spec,
            consumer,
            label,
            ..
        } => {
            let j = r.join_group(spec, consumer, label).await?;
            Response::ConsumerJoined {
                consumer: j.consumer,
                spec: j.spec,
                generation: j.generation,
            }
        }
        Request::ConsumerHeartbeat {
            group,
            consumer,
            owned,
            done,
        } => r.consumer_heartbeat(&group, consumer, owned, done).await?,
        Request::LeaveConsumerGroup { group, consumer } => {
            r.leave_group(&group, consumer).await?;
            Response::Done
        }
        Request::DescribeConsumerGroup { group } => {
            Response::ConsumerGroup(r.describe_group(&group).await?)
        }
        Request::ListConsumerGroups => Response::ConsumerGroups(r.list_groups().await),
        Request::DeleteConsumerGroup { group } => {
            r.delete_group(&group).await?;
            Response::Done
        }
        Request::ReportIsr {
            topic,
            partition,
            epoch,
            isr,
        } => {
            let reporter = member.unwrap_or(crate::member_auth::NO_ID);
            r.report_isr(reporter, &topic, partition, epoch, isr)
                .await?;
            Response::Done
        }
        Request::MovePartition {
            topic,
            partition,
            replicas,
        } => {
            r.move_partition(&topic, partition, replicas).await?;
            Response::Done
        }
        Request::DrainMember { member, dead } => {
            r.drain_member(member, dead).await?;
            Response::Done
        }
        Request::KafkaGroupView {
            spec,
            generation,
            consumers,
        } => {
            r.kafka_group_view(spec, generation, consumers).await?;
            Response::Done
        }
        other => {
            return Err(ServerError::coded(
                strom_proto::ErrorCode::UNKNOWN_OPCODE,
                format!("opcode {} is not a control request", other.opcode()),
            ))
        }
    })
}
