//! Control operations for the native protocol: the server's limits,
//! topics, producers and the group, answered by the registry's typed operations (decode, call,
//! encode). Every one needs the registry, so a server that is not the
//! master answers them all with `NOT_MASTER`, in one place. Requests the
//! master sends to members about their partitions go to the local
//! [`crate::members::MemberLink`].

use strom_proto::{GroupMember, Request, Response};

use crate::error::ServerError;
use crate::state::State;

/// Answers one control request.
pub async fn handle(st: &State, req: Request) -> Result<Response, ServerError> {
    match req {
        Request::Hello { .. } => Ok(hello(st).await),
        Request::Limits => Ok(Response::Limits {
            max_frame_bytes: u64::from(st.config.max_frame_bytes),
            max_batch_bytes: st.config.max_batch_bytes,
        }),
        req @ (Request::HostPartitions { .. }
        | Request::SealPartitions { .. }
        | Request::DropPartitions { .. }
        | Request::PartitionStats { .. }) => st.link.local(req).await,
        req => registry_op(st, req).await,
    }
}

async fn hello(st: &State) -> Response {
    let members = match &st.registry {
        Some(r) => r
            .members()
            .await
            .into_iter()
            .map(|m| GroupMember {
                id: m.id,
                addr: m.addr,
            })
            .collect(),
        None => st.link.brief(),
    };
    Response::Hello {
        member: st.member(),
        master: 0,
        members,
    }
}

async fn registry_op(st: &State, req: Request) -> Result<Response, ServerError> {
    let r = st.registry()?;
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
        Request::CloseProducer { topic, producer } => {
            r.close_producer(&topic, producer).await?;
            Response::Done
        }
        Request::AddPartitions {
            topic,
            count,
            member,
        } => Response::Topic(r.add_partitions(&topic, count, member).await?),
        Request::Join { member, addr } => Response::Joined {
            member: r.join(member, addr).await?,
            members: r.members().await,
        },
        Request::Heartbeat { member, addr } => {
            r.heartbeat(member, addr).await?;
            Response::Done
        }
        Request::Members => Response::Members(r.members().await),
        other => {
            return Err(ServerError::coded(
                strom_proto::ErrorCode::UNKNOWN_OPCODE,
                format!("opcode {} is not a control request", other.opcode()),
            ))
        }
    })
}
