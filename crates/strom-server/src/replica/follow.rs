//! A follower's copy loop: fetch from the leader what comes after the local
//! log, store it at the same offsets (`append_replica`), make it durable,
//! record the leader's epochs, publish the leader's high watermark, and ask
//! again from the new durable end (never past it: the leader takes `from`
//! as what this copy holds durably). A cut the leader asks for
//! (`truncate_to`) comes first. Errors and a leader that is not (yet) one are retried after a
//! short pause, until the role changes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strom_proto::{ErrorCode, ReplicaBatchHead, Request, Response};
use strom_storage::ReplicaBatch;

use super::{refusal, Replica, FETCH_BYTES};
use crate::error::ServerError;
use crate::partition::PartitionManager;

/// The pause before a failed fetch is tried again.
const RETRY: Duration = Duration::from_millis(200);

/// A test hook: a follower pauses this many milliseconds after each fetch
/// it stored, so that it stays a fetch round behind its leader for that
/// long (`move_safety` uses it to make the moment a move hands over the
/// leadership land while the new copy is behind). Unset in production.
pub const FETCH_DELAY_VAR: &str = "STROM_TEST_REPLICA_FETCH_DELAY_MS";

fn fetch_delay() -> Option<Duration> {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms: u64 = std::env::var(FETCH_DELAY_VAR).ok()?.parse().ok()?;
        tracing::warn!(
            ms,
            "{FETCH_DELAY_VAR} is set: followers pause after every fetch"
        );
        Some(Duration::from_millis(ms))
    })
}

pub(super) async fn run(r: Arc<Replica>, epoch: u64, leader: String, stop: Arc<AtomicBool>) {
    let mut failures = 0u32;
    while !stop.load(Ordering::Acquire) {
        let Some(pm) = r.pm.upgrade() else { return };
        if pm.is_deleted() {
            return;
        }
        let got = match fetch(&r, &pm, epoch, &leader).await {
            Ok(f) => {
                let (r2, pm2) = (r.clone(), pm.clone());
                tokio::task::spawn_blocking(move || apply(&r2, &pm2, f))
                    .await
                    .unwrap_or_else(|e| Err(refusal(ErrorCode::INTERNAL, e.to_string())))
            }
            Err(e) => Err(e),
        };
        match got {
            Ok(()) => {
                failures = 0;
                if let Some(d) = fetch_delay() {
                    tokio::time::sleep(d).await;
                }
            }
            Err(e) => {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(topic = %r.topic, partition = r.partition, leader = %leader, epoch, failures, error = %e, "replica fetch failed; retrying");
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn fetch(
    r: &Arc<Replica>,
    pm: &Arc<PartitionManager>,
    epoch: u64,
    leader: &str,
) -> Result<Response, ServerError> {
    let from = durable_from(r, pm).await?;
    let req = Request::ReplicaFetch {
        topic: r.topic.clone(),
        partition: r.partition,
        epoch,
        follower: r.me,
        from,
        last_epoch: r.epochs.latest().map_or(0, |e| e.epoch),
        max_bytes: FETCH_BYTES,
    };
    r.peers.call(leader, &req).await
}

/// Where the next fetch asks from: this replica's durable end, since the
/// leader takes `from` as what this copy holds durably. A tail past it
/// (the log wrote it, but its sync failed, or the disk filled up before
/// the answer was stored) is cut first, so the copy holds nothing it has
/// not made durable; a log a failed fdatasync stopped cannot be cut, and
/// does not fetch again until it is reopened (the leader drops it from the
/// in-sync replicas meanwhile).
async fn durable_from(r: &Arc<Replica>, pm: &Arc<PartitionManager>) -> Result<u64, ServerError> {
    let durable = *r.durable_end.borrow();
    if pm.next_offset() <= durable {
        return Ok(pm.next_offset());
    }
    let (r2, pm2) = (r.clone(), pm.clone());
    let end = tokio::task::spawn_blocking(move || cut(&r2, &pm2, durable))
        .await
        .unwrap_or_else(|e| Err(refusal(ErrorCode::INTERNAL, e.to_string())))?;
    tracing::warn!(topic = %r.topic, partition = r.partition, durable, end, "cut this replica's tail that was written but never made durable");
    Ok(end)
}

/// Cuts the log and the epoch history from `at`; returns the new end.
fn cut(r: &Replica, pm: &PartitionManager, at: u64) -> Result<u64, ServerError> {
    let end = pm.cut_from(at)?;
    r.epochs.truncate_from(end)?;
    Ok(end)
}

/// Stores one answer (blocking: writes and syncs).
fn apply(r: &Replica, pm: &PartitionManager, answer: Response) -> Result<(), ServerError> {
    let Response::ReplicaBatches {
        hwm,
        truncate_to,
        epochs,
        batches,
        bytes,
        offsets,
    } = answer
    else {
        return Err(refusal(
            ErrorCode::INTERNAL,
            format!("unexpected answer {} to ReplicaFetch", answer.opcode()),
        ));
    };
    // Named consumers resume where they committed after a failover.
    for (name, offset) in &offsets {
        if pm.committed(name) != Some(*offset) {
            pm.commit_offset(name, *offset)?;
        }
    }
    if let Some(at) = truncate_to {
        let end = cut(r, pm, at)?;
        r.durable_end.send_replace(end);
        tracing::warn!(topic = %r.topic, partition = r.partition, cut = at, end, "cut this replica's log where the leader's history ends (a deposed leader's unreplicated tail)");
        return Ok(());
    }
    let parts = split(&batches, &bytes)?;
    let copies: Vec<ReplicaBatch> = parts
        .iter()
        .map(|(h, meta, data)| ReplicaBatch {
            base_offset: h.base_offset,
            count: h.count,
            timestamp_us: h.timestamp_us,
            meta,
            data: std::slice::from_ref(data),
        })
        .collect();
    let end = pm.copy_in(&copies)?;
    let known = r.epochs.latest().map_or(0, |e| e.epoch);
    for (epoch, start) in epochs {
        if epoch > known && start < end {
            r.epochs.assign(epoch, start)?;
        }
    }
    r.durable_end.send_replace(end);
    pm.publish_hwm(hwm.min(end));
    Ok(())
}

/// The meta and data of each batch, cut from `bytes` as the heads say;
/// lengths that do not add up are the leader's (or the wire's) fault.
fn split<'a>(
    heads: &'a [ReplicaBatchHead],
    bytes: &Bytes,
) -> Result<Vec<(&'a ReplicaBatchHead, Bytes, Bytes)>, ServerError> {
    let bad = |why: String| refusal(ErrorCode::MALFORMED_FRAME, format!("ReplicaBatches: {why}"));
    let mut at = 0usize;
    let mut out = Vec::with_capacity(heads.len().min(4096));
    for h in heads {
        let meta_len = h.meta_len as usize;
        let data_len = usize::try_from(h.data_len).map_err(|_| bad("data too long".into()))?;
        let meta_end = at
            .checked_add(meta_len)
            .filter(|e| *e <= bytes.len())
            .ok_or_else(|| bad(format!("batch {} runs past the bytes sent", h.base_offset)))?;
        let data_end = meta_end
            .checked_add(data_len)
            .filter(|e| *e <= bytes.len())
            .ok_or_else(|| bad(format!("batch {} runs past the bytes sent", h.base_offset)))?;
        out.push((
            h,
            bytes.slice(at..meta_end),
            bytes.slice(meta_end..data_end),
        ));
        at = data_end;
    }
    if at != bytes.len() {
        return Err(bad(format!(
            "{} bytes sent beyond the batches",
            bytes.len() - at
        )));
    }
    Ok(out)
}
