//! Acks of a shared group, group-committed: acks from every member stream
//! queue up; one flusher on the blocking pool writes them all as one
//! ledger record, applies them, advances the floor, and only then answers
//! every request it covered. The write is fdatasync'ed when the topic's
//! durability is `always`; otherwise acks are as durable as the events
//! (written before the answer, so they survive the server process being
//! killed, not a power loss), which keeps an fsync off every task of a
//! `never` or `interval` work queue. Nacks need no disk: the event goes to
//! another member at once.

use std::sync::Arc;

use strom_proto::ErrorCode;
use strom_storage::LedgerRecord;
use tokio::sync::oneshot;

use super::ShareCursor;
use crate::error::ServerError;

type Waiter = oneshot::Sender<Result<u64, (ErrorCode, String)>>;

/// Acks waiting for the flusher.
#[derive(Default)]
pub struct AckQueue {
    acks: Vec<(u64, u32)>,
    /// Delivery counts of 2 or more to record with the next flush.
    redelivered: Vec<(u64, u32)>,
    waiters: Vec<Waiter>,
    flushing: bool,
}

fn bad_range(first: u64, count: u32, next: u64) -> ServerError {
    ServerError::coded(
        ErrorCode::INVALID_ARGUMENT,
        format!(
            "cannot ack offsets {first}..{} : the partition ends at {next}",
            first.saturating_add(u64::from(count))
        ),
    )
}

impl ShareCursor {
    /// Resolves `acks` durably and redelivers `nacks` now; answers with the
    /// new floor once the acks are on disk.
    pub async fn ack(
        self: &Arc<Self>,
        acks: Vec<(u64, u32)>,
        nacks: Vec<(u64, u32)>,
    ) -> Result<u64, ServerError> {
        let next = self.pm.upgrade().map_or(0, |pm| pm.next_offset());
        for &(first, count) in acks.iter().chain(&nacks) {
            if first.saturating_add(u64::from(count)) > next {
                return Err(bad_range(first, count, next));
            }
        }
        if !nacks.is_empty() {
            let mut st = self.state.lock();
            for (first, count) in nacks {
                for o in first..first + u64::from(count) {
                    st.nack(o, self.spec.max_deliveries);
                }
            }
            drop(st);
            self.wake.notify_one();
        }
        if acks.is_empty() {
            return Ok(self.floor());
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.acks.lock();
            q.acks.extend(acks);
            q.waiters.push(tx);
            !std::mem::replace(&mut q.flushing, true)
        };
        if start {
            let me = self.clone();
            if self.sync_acks {
                tokio::task::spawn_blocking(move || me.flush_loop());
            } else {
                // No fsync: a write to the page cache (or nothing, for a
                // memory partition) is cheaper than a hop to the blocking pool.
                me.flush_loop();
            }
        }
        match rx.await {
            Ok(r) => r.map_err(|(code, message)| ServerError::coded(code, message)),
            Err(_) => Err(ServerError::coded(
                ErrorCode::SHUTTING_DOWN,
                "the ack flusher stopped",
            )),
        }
    }

    /// Records a delivery count of 2 or more with the next flush.
    pub(super) fn note_redelivered(&self, offset: u64, deliveries: u32) {
        self.ledger
            .lock()
            .apply(&LedgerRecord::Redelivered(vec![(offset, deliveries)]));
        self.acks.lock().redelivered.push((offset, deliveries));
    }

    /// Flushes a dead letter's record (durably) and resolves its offset.
    pub(super) fn flush_dead(&self, record: LedgerRecord) -> Result<(), ServerError> {
        let mut file = self.file.lock();
        if let Some(f) = file.as_mut() {
            f.append(std::slice::from_ref(&record), true)?;
        }
        if let LedgerRecord::DeadLettered { offset, .. } = &record {
            self.ledger.lock().apply(&record);
            self.state.lock().resolved([*offset]);
        }
        self.after_resolve();
        Ok(())
    }

    /// Runs on the blocking pool until the queue is empty.
    fn flush_loop(self: Arc<Self>) {
        loop {
            let (acks, redelivered, waiters) = {
                let mut q = self.acks.lock();
                if q.waiters.is_empty() {
                    q.flushing = false;
                    return;
                }
                (
                    std::mem::take(&mut q.acks),
                    std::mem::take(&mut q.redelivered),
                    std::mem::take(&mut q.waiters),
                )
            };
            let result = self
                .flush(acks, redelivered)
                .map_err(|e| (e.code(), e.to_string()));
            for w in waiters {
                let _ = w.send(result.clone());
            }
        }
    }

    fn flush(
        &self,
        acks: Vec<(u64, u32)>,
        redelivered: Vec<(u64, u32)>,
    ) -> Result<u64, ServerError> {
        let dispatched = self.state.lock().next;
        let mut records = Vec::with_capacity(3);
        if !redelivered.is_empty() {
            records.push(LedgerRecord::Redelivered(redelivered));
        }
        records.push(LedgerRecord::Dispatched(dispatched));
        let acked = LedgerRecord::Acked(acks);
        records.push(acked);
        {
            let mut file = self.file.lock();
            if let Some(f) = file.as_mut() {
                if let Err(e) = f.append(&records, self.sync_acks) {
                    tracing::error!(group = %self.spec.name, error = %e, "could not persist acks");
                    return Err(e.into());
                }
            }
            let mut ledger = self.ledger.lock();
            for r in &records {
                ledger.apply(r);
            }
            if let Some(f) = file.as_mut() {
                if let Err(e) = f.maybe_compact(&ledger) {
                    tracing::warn!(group = %self.spec.name, error = %e, "could not compact the group ledger; retried after the next acks");
                }
            }
        }
        if let Some(LedgerRecord::Acked(ranges)) = records.last() {
            let mut st = self.state.lock();
            for (first, count) in ranges {
                st.resolved(*first..first + u64::from(*count));
            }
        }
        Ok(self.after_resolve())
    }

    /// After offsets were resolved: lets a `block` partition free room
    /// below the floor, and wakes the task (the end may have come).
    fn after_resolve(&self) -> u64 {
        let floor = self.floor();
        if let Some(pm) = self.pm.upgrade() {
            pm.consumer_at(&self.spec.name, floor);
        }
        self.wake.notify_one();
        floor
    }
}
