//! Writes queued audit records into this member's own partition of
//! `strom.audit`: one partition per member, placed on it, so that no
//! record crosses the network and a member's records keep their order.
//!
//! The topic is created by the first member with a record to write; a
//! member that hosts none of its partitions asks the registry for one
//! placed on itself (`AddPartitions { member: Some(me) }`). Records are
//! appended as dead letters are (`share/dlq.rs`): a checked batch straight
//! into the partition, with no registered producer, so the stream never
//! ends. A batch that cannot be written yet (no registry, the member not
//! joined) is tried again after a pause while the queue keeps filling; it
//! drops and counts what does not fit.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use strom_proto::{BatchBuilder, ErrorCode, Request, TopicSpec};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::{Record, AUDIT_TOPIC};
use crate::batch::ValidBatch;
use crate::error::ServerError;
use crate::partition::{AppendReply, PartitionManager};
use crate::service::Services;

/// Records appended in one batch, at most.
const PER_BATCH: usize = 256;
/// The pause before trying a batch again.
const RETRY: Duration = Duration::from_millis(500);

/// Starts the writer, if records go to the topic.
pub fn spawn(state: Arc<Services>, mut stopped: watch::Receiver<bool>) -> Option<JoinHandle<()>> {
    if !state.audit.to_topic() {
        return None;
    }
    let mut rx = state.audit.take_queue()?;
    Some(tokio::spawn(async move {
        let mut target: Option<Arc<PartitionManager>> = None;
        loop {
            let batch = tokio::select! {
                b = next_batch(&mut rx) => match b { Some(b) => b, None => return },
                _ = stopped.changed() => return,
            };
            while let Err(e) = write(&state, &mut target, &batch).await {
                target = None;
                tracing::debug!(error = %e, records = batch.len(), "could not write audit records yet; trying again");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => {}
                    _ = stopped.changed() => return,
                }
            }
            state.audit.written.fetch_add(batch.len() as u64, Relaxed);
        }
    }))
}

/// The next records: waits for one, then takes what else is queued.
async fn next_batch(rx: &mut mpsc::Receiver<Record>) -> Option<Vec<Record>> {
    let first = rx.recv().await?;
    let mut batch = vec![first];
    while batch.len() < PER_BATCH {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
    Some(batch)
}

async fn write(
    state: &Services,
    target: &mut Option<Arc<PartitionManager>>,
    records: &[Record],
) -> Result<(), ServerError> {
    let pm = match target {
        Some(pm) => pm.clone(),
        None => own_partition(state).await?,
    };
    let mut builder = BatchBuilder::new();
    for r in records {
        let json = serde_json::to_vec(r)
            .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?;
        builder.push(&json, &[], 0);
    }
    let batch = ValidBatch::check(records.len() as u32, builder.finish(), Vec::new())
        .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?;
    let (tx, rx) = oneshot::channel();
    let reply: AppendReply = Box::new(move |r| {
        let _ = tx.send(r);
    });
    pm.append(batch, reply);
    rx.await.map_err(|_| {
        ServerError::coded(ErrorCode::SHUTTING_DOWN, "the audit partition closed")
    })??;
    *target = Some(pm);
    Ok(())
}

/// This member's partition of `strom.audit` (the lowest it hosts),
/// creating the topic or adding a partition placed here if need be.
async fn own_partition(state: &Services) -> Result<Arc<PartitionManager>, ServerError> {
    if let Some(pm) = hosted(state) {
        return Ok(pm);
    }
    let me = state.control.member();
    if me == crate::member_auth::NO_ID {
        return Err(ServerError::coded(
            ErrorCode::NOT_MASTER,
            "this member has no id yet",
        ));
    }
    let create = Request::CreateTopic {
        spec: TopicSpec::new(AUDIT_TOPIC, 1),
        member: Some(me),
    };
    match state.control.ask_registry(create).await {
        Err(e) if e.code() == ErrorCode::TOPIC_EXISTS => {
            if hosted(state).is_none() {
                let add = Request::AddPartitions {
                    topic: AUDIT_TOPIC.into(),
                    count: 1,
                    member: Some(me),
                };
                state.control.ask_registry(add).await?;
            }
        }
        r => {
            r?;
        }
    }
    tracing::info!(
        member = me,
        topic = AUDIT_TOPIC,
        "audit records go to this member's partition"
    );
    hosted(state).ok_or_else(|| {
        ServerError::coded(
            ErrorCode::PARTITION_UNAVAILABLE,
            format!("member {me} does not host a partition of {AUDIT_TOPIC} yet"),
        )
    })
}

fn hosted(state: &Services) -> Option<Arc<PartitionManager>> {
    state
        .data
        .host()
        .partitions_of(AUDIT_TOPIC)
        .into_iter()
        .filter(|p| p.leads())
        .min_by_key(|p| p.id)
}
