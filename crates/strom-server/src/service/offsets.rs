//! Consumer offsets of any partition of the group, for front ends that
//! may be asked about a partition another member hosts (a Kafka group's
//! coordinator commits and fetches offsets for every partition): done here
//! when this server hosts the partition, else at the member that does,
//! found through the registry ([`ControlService::ask_registry`]).

use strom_proto::{ErrorCode, Request, Response};

use super::{ControlService, Services};
use crate::error::ServerError;

impl Services {
    /// The offset `name` committed on the partition, if any.
    pub async fn committed_offset(
        &self,
        topic: &str,
        partition: u32,
        name: &str,
    ) -> Result<Option<u64>, ServerError> {
        if let Ok(p) = self.data.partition(topic, partition) {
            return Ok(p.committed(name));
        }
        let req = Request::Offsets {
            topic: topic.to_string(),
            partition,
        };
        match self.control.ask_owner(topic, partition, req).await? {
            Response::Offsets(all) => Ok(all.into_iter().find(|(n, _)| n == name).map(|(_, o)| o)),
            other => Err(unexpected("Offsets", &other)),
        }
    }

    /// Durably records `offset` for `name` on the partition.
    pub async fn commit_offset(
        &self,
        topic: &str,
        partition: u32,
        name: &str,
        offset: u64,
    ) -> Result<(), ServerError> {
        if let Ok(p) = self.data.partition(topic, partition) {
            return self.data.commit(p, name.to_string(), offset).await;
        }
        let req = Request::Commit {
            topic: topic.to_string(),
            partition,
            consumer: name.to_string(),
            offset,
        };
        match self.control.ask_owner(topic, partition, req).await? {
            Response::Done => Ok(()),
            other => Err(unexpected("Commit", &other)),
        }
    }
}

impl ControlService {
    /// Runs a data request at the member that hosts the partition (its
    /// leader, for a replicated topic), as the registry describes it.
    pub async fn ask_owner(
        &self,
        topic: &str,
        partition: u32,
        req: Request,
    ) -> Result<Response, ServerError> {
        let described = Request::DescribeTopic {
            name: topic.to_string(),
            offsets: false,
        };
        let info = match self.ask_registry(described).await? {
            Response::Topic(t) => t,
            other => return Err(unexpected("DescribeTopic", &other)),
        };
        let owner = info.partitions.get(partition as usize).ok_or_else(|| {
            ServerError::coded(
                ErrorCode::PARTITION_NOT_FOUND,
                format!("topic '{topic}' has no partition {partition}"),
            )
        })?;
        if owner.member == self.member() {
            return Err(ServerError::coded(
                ErrorCode::PARTITION_UNAVAILABLE,
                format!("partition {partition} of topic '{topic}' is assigned here but not open"),
            ));
        }
        match self.link().peers().call(&owner.addr, &req).await? {
            Response::Error { code, message } => Err(ServerError::coded(code, message)),
            r => Ok(r),
        }
    }
}

fn unexpected(asked: &str, got: &Response) -> ServerError {
    ServerError::coded(
        ErrorCode::INTERNAL,
        format!("a member answered {asked} with opcode {}", got.opcode()),
    )
}
