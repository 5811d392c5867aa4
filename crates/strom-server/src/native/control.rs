//! Control requests of the native protocol: decode, call the
//! [`ControlService`] (the registry's operations among them), encode. Requests
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
        req => svc.registry_call(member, req).await,
    }
}
