//! Consumer-group operations of the service layer, for every front end:
//! join a shared group's partition (only a group the registry created, with
//! the registry's options), ack its events; subscribe a partitioned group's
//! fenced holder at its committed offset, commit for it. The state they
//! touch lives beside each partition (`hosted_groups.rs`).

use std::sync::Arc;

use strom_proto::{ConsumerGroupSpec, ErrorCode, Request, Response, StartPos};
use tokio::sync::watch;

use super::Services;
use crate::error::ServerError;
use crate::hosted_groups::{self, Claim};
use crate::names::check_name;
use crate::partition::PartitionManager;
use crate::share::{Cursors, ShareCursor};

// What a front end holds of a group stream: its place among a shared
// group's members, where its pushes go, and the fence it reads under.
pub use crate::fence::Holder;
pub use crate::share::{MemberGuard, MemberOut};

use super::ControlService;

/// A partitioned group's holder, subscribed: where it reads from, and the
/// fence to watch (a newer holder ends its stream).
pub struct FencedStart {
    pub partition: Arc<PartitionManager>,
    pub pos: u64,
    pub fence: watch::Receiver<Holder>,
}

impl Services {
    /// The shared cursor a member of the shared group `spec` joins on
    /// `partition`: the registry must have created the group; its options
    /// win over the member's.
    pub async fn shared_group(
        &self,
        spec: &ConsumerGroupSpec,
        partition: u32,
    ) -> Result<Arc<ShareCursor>, ServerError> {
        let host = self.data.host();
        let slot = host.slot(&spec.topic, partition)?;
        let spec = registered(&self.control, &slot.shares, spec).await?;
        hosted_groups::cursor(host, partition, &spec)
    }

    /// A partitioned group's holder `(consumer, epoch)` starts reading
    /// `partition`: `FENCED` unless it holds the fence; it reads from the
    /// group's committed offset, or where the group starts.
    pub fn partitioned_group(
        &self,
        spec: &ConsumerGroupSpec,
        partition: u32,
        consumer: u64,
        epoch: u64,
    ) -> Result<FencedStart, ServerError> {
        let host = self.data.host();
        let claim = Claim {
            topic: &spec.topic,
            partition,
            group: &spec.name,
            consumer,
            epoch,
        };
        let f = hosted_groups::check_fence(host, &claim)?;
        let p = host.get(&spec.topic, partition)?;
        let start = match p.committed(&spec.name) {
            Some(_) => StartPos::Committed,
            None => spec.start,
        };
        let pos = self.data.subscribe_at(&p, &spec.name, start);
        Ok(FencedStart {
            partition: p,
            pos,
            fence: f.watch(),
        })
    }

    /// Commits a partitioned group's offset for its fenced holder.
    #[allow(clippy::too_many_arguments)]
    pub async fn group_commit(
        &self,
        topic: String,
        partition: u32,
        group: String,
        consumer: u64,
        epoch: u64,
        offset: u64,
    ) -> Result<(), ServerError> {
        let host = self.data.host().clone();
        tokio::task::spawn_blocking(move || {
            let claim = Claim {
                topic: &topic,
                partition,
                group: &group,
                consumer,
                epoch,
            };
            hosted_groups::commit(&host, &claim, offset)
        })
        .await
        .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?
    }

    /// Resolves (`acks`) or gives back (`nacks`) a shared group's events;
    /// returns the group's new floor on the partition.
    pub async fn group_ack(
        &self,
        topic: &str,
        partition: u32,
        group: &str,
        acks: Vec<(u64, u32)>,
        nacks: Vec<(u64, u32)>,
    ) -> Result<u64, ServerError> {
        let cursor = hosted_groups::open_cursor(self.data.host(), topic, partition, group)?;
        cursor.ack(acks, nacks).await
    }
}

/// The registry's spec of the group a member stream names, before this
/// server opens the group's state on a partition for it: a group the
/// registry never created is refused (`CONSUMER_GROUP_NOT_FOUND`), as is a
/// spec that names another topic or mode (`CONSUMER_GROUP_MISMATCH`); the
/// registry's options win over the stream's. The registry is asked once
/// per (group, partition) and process: after that the open cursor answers.
async fn registered(
    control: &ControlService,
    shares: &Cursors,
    spec: &ConsumerGroupSpec,
) -> Result<ConsumerGroupSpec, ServerError> {
    check_name("consumer group", &spec.name, ErrorCode::INVALID_ARGUMENT)?;
    if let Some(c) = shares.get(&spec.name) {
        return same_group(spec, c.spec.clone());
    }
    if let Some(r) = control.master_registry() {
        return match r.group_spec(&spec.name).await {
            Some(k) => same_group(spec, k),
            None => Err(not_created(&spec.name)),
        };
    }
    let req = Request::DescribeConsumerGroup {
        group: spec.name.clone(),
    };
    let known = match control.ask_registry(req).await {
        Ok(Response::ConsumerGroup(info)) => Some(info.spec),
        Ok(other) => {
            return Err(ServerError::coded(
                ErrorCode::INTERNAL,
                format!("the registry answered a group lookup with {other:?}"),
            ))
        }
        Err(e) if e.code() == ErrorCode::CONSUMER_GROUP_NOT_FOUND => None,
        Err(e) => return Err(e),
    };
    match known {
        Some(k) => same_group(spec, k),
        None => Err(not_created(&spec.name)),
    }
}

fn not_created(group: &str) -> ServerError {
    ServerError::coded(
        ErrorCode::CONSUMER_GROUP_NOT_FOUND,
        format!("no consumer group named '{group}': the registry did not create it (join the group first)"),
    )
}

/// `known` (the registry's spec) if `asked` names the same topic and mode.
fn same_group(
    asked: &ConsumerGroupSpec,
    known: ConsumerGroupSpec,
) -> Result<ConsumerGroupSpec, ServerError> {
    if known.topic != asked.topic || known.mode != asked.mode {
        return Err(ServerError::coded(
            ErrorCode::CONSUMER_GROUP_MISMATCH,
            format!(
                "consumer group '{}' is a {} group of topic '{}', not a {} group of topic '{}'",
                known.name,
                known.mode.as_str(),
                known.topic,
                asked.mode.as_str(),
                asked.topic
            ),
        ));
    }
    Ok(known)
}
