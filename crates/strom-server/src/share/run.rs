//! The task of one shared cursor: push events to member streams ahead of
//! demand, within their credit; redeliver what expired, was nacked, or was
//! held by a member that left; dead-letter what reached `max_deliveries`;
//! end every member's stream once the partition is sealed and everything
//! in it is resolved.
//!
//! Each `Deliver` push carries contiguous runs of one stored batch: the
//! stored metadata section as is (zero copy) when one run covers the whole
//! batch, else one section built for the runs. Runs name positions in the
//! stored batch's data section, so members fetch data with `FetchData`
//! exactly as plain consumers do.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_proto::{BatchBuilder, BatchView, ErrorCode, Push, Run};
use strom_storage::{StorageError, StoredBatch};

use super::dispatch::Planned;
use super::ShareCursor;
use crate::partition::PartitionManager;

/// Most metadata bytes read from the log per step.
const READ_BYTES: usize = 1 << 20;
/// Most events between the floor and the dispatch position: bounds the
/// state kept when an event at the floor is never resolved.
const MAX_UNRESOLVED: u64 = 1_000_000;
/// How often the task looks around when nothing wakes it.
const IDLE: Duration = Duration::from_secs(1);

pub(super) async fn run(c: Arc<ShareCursor>) {
    let Some(pm) = c.pm.upgrade() else { return };
    let mut visible = pm.watch_visible();
    let mut sealed = pm.watch_sealed();
    drop(pm);
    loop {
        let Some(pm) = c.pm.upgrade() else { return };
        if pm.is_deleted() {
            let msg = format!("topic '{}' was deleted", pm.topic);
            c.fail_all(ErrorCode::TOPIC_NOT_FOUND, msg);
            return;
        }
        if c.stopped.load(Ordering::Acquire) {
            let msg = format!("consumer group '{}' was deleted", c.spec.name);
            c.fail_all(ErrorCode::CONSUMER_GROUP_NOT_FOUND, msg);
            return;
        }
        if c.closed.load(Ordering::Acquire) {
            return;
        }
        let vis = *visible.borrow_and_update();
        let is_sealed = *sealed.borrow_and_update();
        c.step(&pm, vis, is_sealed).await;
        let deadline = c.state.lock().next_deadline();
        drop(pm);
        let nap = deadline.map_or(IDLE, |d| {
            d.saturating_duration_since(Instant::now()).min(IDLE)
        });
        tokio::select! {
            _ = c.wake.notified() => {}
            r = visible.changed() => if r.is_err() { return },
            r = sealed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

impl ShareCursor {
    /// One round: expire, dead-letter, redeliver, deliver fresh, end.
    async fn step(self: &Arc<Self>, pm: &Arc<PartitionManager>, visible: u64, sealed: bool) {
        self.skip_dropped(pm);
        let expired = self
            .state
            .lock()
            .expire(Instant::now(), self.spec.max_deliveries);
        if expired > 0 {
            tracing::debug!(group = %self.spec.name, partition = pm.id, expired, "visibility timeout passed; redelivering");
        }
        self.dead_letter_due(pm).await;
        self.serve_retries(pm);
        self.serve_fresh(pm, visible);
        if sealed {
            self.maybe_end(pm);
        }
    }

    /// Events retention dropped can never be delivered: move past them.
    fn skip_dropped(&self, pm: &PartitionManager) {
        let first = pm.first_offset();
        let mut st = self.state.lock();
        let mut ledger = self.ledger.lock();
        if ledger.floor() >= first {
            return;
        }
        let skipped = ledger.raise_floor(first);
        let gone: Vec<u64> = st
            .pending
            .range(..first)
            .map(|(o, _)| *o)
            .chain(st.retry.range(..first).map(|(o, _)| *o))
            .chain(st.dead_due.range(..first).map(|(o, _)| *o))
            .collect();
        st.resolved(gone);
        st.next = st.next.max(first);
        tracing::warn!(group = %self.spec.name, partition = pm.id, skipped, "retention dropped events the group had not resolved");
    }

    /// Redeliveries first, lowest offset first, a stored batch at a time.
    fn serve_retries(&self, pm: &PartitionManager) {
        loop {
            let o = {
                let st = self.state.lock();
                if st.credit() == 0 {
                    return;
                }
                match st.retry.keys().next() {
                    Some(o) => *o,
                    None => return,
                }
            };
            let b = match pm.read(o, 1) {
                Ok(v) => match v.into_iter().next() {
                    Some(b) => b,
                    None => return,
                },
                Err(e) => {
                    self.read_failed(pm, o, e);
                    return;
                }
            };
            let end = b.base_offset + u64::from(b.count);
            let deadline = self.deadline();
            let plans = {
                let mut st = self.state.lock();
                let ledger = self.ledger.lock();
                let due: Vec<(u64, u32)> = st
                    .retry
                    .range(b.base_offset..end)
                    .map(|(o, d)| (*o, *d))
                    .collect();
                let mut cands = Vec::with_capacity(due.len());
                for (o, d) in due {
                    st.retry.remove(&o);
                    if !ledger.is_resolved(o) {
                        cands.push(((o - b.base_offset) as u32, d));
                    }
                }
                let (plans, taken) = st.split(b.base_offset, &cands, deadline);
                for (i, d) in &cands[taken..] {
                    st.retry.insert(b.base_offset + u64::from(*i), *d);
                }
                plans
            };
            self.send(pm, &b, plans);
        }
    }

    /// Fresh events from the dispatch position up to `visible`.
    fn serve_fresh(&self, pm: &PartitionManager, visible: u64) {
        loop {
            let next = {
                let st = self.state.lock();
                let floor = self.ledger.lock().floor();
                if st.next >= visible
                    || st.credit() == 0
                    || st.next.saturating_sub(floor) >= MAX_UNRESOLVED
                {
                    return;
                }
                st.next
            };
            let batches = match pm.read_visible_log(next, READ_BYTES) {
                Ok(b) => b,
                Err(e) => {
                    self.read_failed(pm, next, e);
                    return;
                }
            };
            if batches.is_empty() {
                return;
            }
            for b in batches {
                if b.base_offset >= visible {
                    return;
                }
                if !self.serve_batch(pm, &b) {
                    return;
                }
            }
        }
    }

    /// Splits one fresh batch among the members; false once credit ran out.
    fn serve_batch(&self, pm: &PartitionManager, b: &StoredBatch) -> bool {
        let end = b.base_offset + u64::from(b.count);
        let deadline = self.deadline();
        let (plans, all) = {
            let mut st = self.state.lock();
            let ledger = self.ledger.lock();
            let mut cands = Vec::new();
            for o in st.next.max(b.base_offset)..end {
                if ledger.is_resolved(o) || st.is_held(o) {
                    continue;
                }
                let before = if o < self.opened_dispatched {
                    ledger.deliveries(o).max(1)
                } else {
                    ledger.deliveries(o)
                };
                cands.push(((o - b.base_offset) as u32, before));
            }
            let (plans, taken) = st.split(b.base_offset, &cands, deadline);
            st.next = match cands.get(taken) {
                Some((i, _)) => b.base_offset + u64::from(*i),
                None => end,
            };
            (plans, taken == cands.len())
        };
        self.send(pm, b, plans);
        all
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_millis(u64::from(self.spec.visibility_ms))
    }

    /// A read failed: damaged ranges are resolved (they can never be
    /// delivered), anything else is logged and retried on the next round.
    fn read_failed(&self, pm: &PartitionManager, at: u64, e: StorageError) {
        match e {
            StorageError::DataCorrupt { first, last } => {
                tracing::warn!(group = %self.spec.name, partition = pm.id, first, last, "the group skips a quarantined range");
                let count = (last.saturating_sub(first) + 1).min(u64::from(u32::MAX)) as u32;
                let me = self.me.upgrade();
                if let Some(me) = me {
                    tokio::spawn(async move {
                        if let Err(e) = me.ack(vec![(first, count)], Vec::new()).await {
                            tracing::warn!(error = %e, "could not resolve a quarantined range");
                        }
                    });
                }
                let mut st = self.state.lock();
                st.next = st.next.max(last.saturating_add(1));
            }
            StorageError::OffsetOutOfRange { .. } => {}
            e => {
                tracing::warn!(group = %self.spec.name, partition = pm.id, offset = at, error = %e, "read for a shared group failed; retrying")
            }
        }
    }

    /// Pushes the planned runs of batch `b` to their members.
    fn send(&self, pm: &PartitionManager, b: &StoredBatch, plans: Vec<Planned>) {
        if plans.is_empty() {
            return;
        }
        let view = match BatchView::parse(b.meta.clone()) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(group = %self.spec.name, partition = pm.id, offset = b.base_offset, error = %e, "a stored batch does not parse; its events wait for their visibility timeout");
                return;
            }
        };
        let entries: Vec<_> = view.iter().collect();
        for plan in plans {
            let out = self.outs.lock().get(&plan.member).cloned();
            let Some(out) = out else {
                self.unsend(b.base_offset, &plan);
                continue;
            };
            let whole = plan.runs.len() == 1 && plan.runs[0].0 == 0 && plan.runs[0].1 == b.count;
            let meta = if whole {
                b.meta.clone()
            } else {
                let mut builder = BatchBuilder::new();
                for &(first, count, _) in &plan.runs {
                    for e in &entries[first as usize..(first + count) as usize] {
                        builder.push(&e.metadata, &e.descriptor, e.data_len);
                    }
                }
                builder.finish()
            };
            let runs: Vec<Run> = plan
                .runs
                .iter()
                .map(|&(first, count, deliveries)| Run {
                    batch_base: b.base_offset,
                    first,
                    count,
                    data_pos: entries[first as usize].data_pos,
                    timestamp_us: b.timestamp_us,
                    deliveries,
                })
                .collect();
            let events: u64 = runs.iter().map(|r| u64::from(r.count)).sum();
            pm.stats.delivered(events, meta.len() as u64);
            for r in runs.iter().filter(|r| r.deliveries >= 2) {
                for o in r.offset()..r.offset() + u64::from(r.count) {
                    self.note_redelivered(o, r.deliveries);
                }
            }
            out.push(&Push::Deliver {
                partition: pm.id,
                runs,
                meta,
            });
        }
    }

    /// A plan whose member left before it was sent: back in line, as if
    /// never delivered.
    fn unsend(&self, base: u64, plan: &Planned) {
        let mut st = self.state.lock();
        for &(first, count, deliveries) in &plan.runs {
            for o in base + u64::from(first)..base + u64::from(first + count) {
                st.pending.remove(&o);
                st.retry.insert(o, deliveries - 1);
            }
        }
        // The member is gone: no credit to give back.
    }

    /// Ends every member's stream once the partition is sealed and every
    /// event in it is resolved.
    fn maybe_end(&self, pm: &PartitionManager) {
        let floor = self.floor();
        if floor < pm.next_offset() {
            return;
        }
        let mut st = self.state.lock();
        let outs = self.outs.lock();
        for (key, m) in st.members.iter_mut().filter(|(_, m)| !m.ended) {
            m.ended = true;
            if let Some(out) = outs.get(key) {
                out.push(&Push::EndOfStream {
                    partition: pm.id,
                    end_offset: floor,
                });
            }
        }
    }

    fn fail_all(&self, code: ErrorCode, message: String) {
        for out in self.outs.lock().values() {
            out.push(&Push::StreamError {
                code,
                message: message.clone(),
            });
        }
    }
}
