//! The registry's operations as one service call, for every front end:
//! [`ControlService::registry_call`] runs a registry request on the master,
//! and [`ControlService::ask_registry`] runs it here or forwards it to the
//! master (with a metadata quorum: its leader), so that no front end
//! finds the master itself or reads the group file to do so.

use strom_proto::{ErrorCode, Request, Response};

use super::ControlService;
use crate::error::ServerError;

impl ControlService {
    /// Runs a registry request here, on the master: `NOT_MASTER` (naming
    /// where to go) elsewhere. `member` is the member the connection proved,
    /// if any (`native/trust.rs` checked the request may come from it).
    pub async fn registry_call(
        &self,
        member: Option<u32>,
        req: Request,
    ) -> Result<Response, ServerError> {
        let r = self.registry()?;
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
            Request::SecurityTable { have } => {
                let mut t = r.security_table().await;
                // SCRAM keys go to members only (they log users in).
                if member.is_none() {
                    t.scram.clear();
                }
                let json = match t.version == have {
                    true => String::new(),
                    false => serde_json::to_string(&t)
                        .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?,
                };
                Response::SecurityTable {
                    version: t.version,
                    json,
                }
            }
            Request::AlterAcls { add, json } => {
                let entries = serde_json::from_str(&json).map_err(|e| {
                    ServerError::coded(
                        ErrorCode::INVALID_ARGUMENT,
                        format!("the ACL entries do not parse: {e}"),
                    )
                })?;
                r.alter_acls(add, entries).await?;
                Response::Done
            }
            Request::SetScramUser { user, json } => {
                let update = serde_json::from_str(&json).map_err(|e| {
                    ServerError::coded(
                        ErrorCode::INVALID_ARGUMENT,
                        format!("the SCRAM credentials do not parse: {e}"),
                    )
                })?;
                r.set_scram(user, update).await?;
                Response::Done
            }
            Request::AlterQuotas { json } => {
                let change = serde_json::from_str(&json).map_err(|e| {
                    ServerError::coded(
                        ErrorCode::INVALID_ARGUMENT,
                        format!("the quota change does not parse: {e}"),
                    )
                })?;
                r.alter_quota(change).await?;
                Response::Done
            }
            Request::QuotaTable { have } => {
                let t = r.quota_table().await;
                let json = match t.version == have {
                    true => String::new(),
                    false => serde_json::to_string(&t)
                        .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?,
                };
                Response::QuotaTable {
                    version: t.version,
                    json,
                }
            }
            Request::RevokeToken { id } => {
                r.revoke_token(id).await?;
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

    /// Runs a registry request here if this server is the master, else at
    /// the master (with a metadata quorum: the leader this member knows;
    /// without one: member 0, as this member last reached it). The
    /// master's refusal comes back as the error it is.
    pub async fn ask_registry(&self, req: Request) -> Result<Response, ServerError> {
        if self.master_registry().is_some() {
            return self.registry_call(None, req).await;
        }
        let Some(addr) = self.registry_addr() else {
            return Err(ServerError::coded(
                ErrorCode::NOT_MASTER,
                format!(
                    "member {} does not know where the registry is yet; retry shortly",
                    self.member()
                ),
            ));
        };
        match self.link().peers().call(&addr, &req).await? {
            Response::Error { code, message } => Err(ServerError::coded(code, message)),
            r => Ok(r),
        }
    }

    /// Where registry requests go from here, if this server is not it.
    fn registry_addr(&self) -> Option<String> {
        match self.leader_hint() {
            Some((id, addr)) if id != self.member() => Some(addr),
            _ => self.link().replica_ctx().master.read().clone(),
        }
    }
}
