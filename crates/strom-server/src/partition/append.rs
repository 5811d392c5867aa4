//! The append path of a partition: appends under the append lock, the
//! idempotent producers' sequence check, `block` overflow (appends held
//! until consumers free room, in order), and admission through the
//! partition's replication (`replication.rs`). Durability is `sync.rs`'s; visibility is the
//! core's (`mod.rs`).

use std::collections::VecDeque;
use std::sync::mpsc;

use strom_proto::ErrorCode;
use strom_storage::{AppendBatch, Appended};

use super::sync::Unsynced;
use super::{AppendReply, PartitionManager};
use crate::batch::ValidBatch;
use crate::error::ServerError;
use crate::producers::Check;

/// An append waiting for room in a full `block` partition.
pub(super) struct Held {
    batch: ValidBatch,
    reply: AppendReply,
}

impl Held {
    fn size(&self) -> u64 {
        self.batch.size()
    }
}

/// The append side of a partition, behind its append lock.
pub(super) struct Appender {
    /// The group-commit syncer (`always` durability).
    pub(super) syncer: Option<mpsc::Sender<Unsynced>>,
    /// Appends held until consumers free room (`block` overflow), in order.
    pub(super) held: VecDeque<Held>,
}

/// A reply to run once the append lock is released.
type Answer = (AppendReply, Result<Appended, ServerError>);

impl PartitionManager {
    /// Appends a batch; calls order the offsets. `reply` runs once the
    /// batch is appended (and durable, with `always`). A full `block`
    /// partition holds the batch (and `reply`) until consumers free room.
    /// Blocking file I/O: call it off the async workers for large batches.
    pub fn append(&self, batch: ValidBatch, reply: AppendReply) {
        // Whatever path it came by, an append to a replica that does not
        // lead goes nowhere: its log is the leader's copy.
        if !self.leads() {
            return reply(Err(ServerError::coded(
                ErrorCode::NOT_PARTITION_LEADER,
                format!(
                    "partition {}/{} takes appends only on its leader",
                    self.topic, self.id
                ),
            )));
        }
        let mut guard = self.appender.lock();
        let Some(ap) = guard.as_mut() else {
            drop(guard);
            return reply(Err(self.closed_error()));
        };
        let held = Held { batch, reply };
        if let Some(bound) = self.block_bound {
            if !self.is_sealed() && (!ap.held.is_empty() || !self.has_room(held.size(), bound)) {
                ap.held.push_back(held);
                tracing::debug!(topic = %self.topic, partition = self.id, held = ap.held.len(), bound, "partition full; append held until its consumers ack");
                return;
            }
        }
        let answer = self.append_locked(ap, held);
        drop(guard);
        if let Some((reply, r)) = answer {
            reply(r);
        }
    }

    /// Appends under the append lock; returns the reply to run after it is
    /// released, unless the syncer took it.
    fn append_locked(&self, ap: &Appender, h: Held) -> Option<Answer> {
        let stamp = h.batch.stamp();
        if let Some(s) = stamp {
            match self.producers().check(s) {
                Check::Fresh => {}
                Check::AfterGap { skipped } => {
                    self.stats.sequence_gap();
                    tracing::warn!(topic = %self.topic, partition = self.id, producer = s.producer, sequence = s.sequence, skipped, "a producer's resend skips batches this partition never got: a leader that acknowledged them alone lost them");
                }
                Check::Duplicate(first) => return self.answer_resent(ap, first, h),
                Check::OutOfOrder(why) => {
                    let e = ServerError::coded(ErrorCode::OUT_OF_ORDER_SEQUENCE, why);
                    return Some((h.reply, Err(e)));
                }
                Check::StaleEpoch(why) => {
                    let e = ServerError::coded(ErrorCode::STALE_PRODUCER_EPOCH, why);
                    return Some((h.reply, Err(e)));
                }
            }
        }
        let appended = match self.append_now(&h.batch) {
            Ok(a) => a,
            Err(e) => return Some((h.reply, Err(e))),
        };
        if let Some(s) = stamp {
            self.producers().appended(s, &appended);
        }
        self.answer_appended(ap, appended, h, false)
    }

    /// A resent batch: answered with its first append's outcome, once that
    /// is durable (after the first answer, through the same syncer).
    fn answer_resent(&self, ap: &Appender, first: Appended, h: Held) -> Option<Answer> {
        tracing::debug!(topic = %self.topic, partition = self.id, base_offset = first.base_offset, "a resent batch answered with its first append");
        self.answer_appended(ap, first, h, true)
    }

    fn answer_appended(
        &self,
        ap: &Appender,
        appended: Appended,
        h: Held,
        resent: bool,
    ) -> Option<Answer> {
        match &ap.syncer {
            Some(s) => {
                let job = Unsynced {
                    appended,
                    meta: h.batch.meta().clone(),
                    reply: h.reply,
                    resent,
                };
                match s.send(job) {
                    Ok(()) => None,
                    Err(mpsc::SendError(job)) => Some((
                        job.reply,
                        Err(ServerError::coded(
                            ErrorCode::SHUTTING_DOWN,
                            "partition syncer stopped",
                        )),
                    )),
                }
            }
            None => {
                if !resent {
                    self.make_visible(&appended, h.batch.meta());
                }
                Some((h.reply, Ok(appended)))
            }
        }
    }

    /// Whether a batch of `size` bytes fits in a `block` partition now,
    /// freeing batches every known consumer acked as far as needed.
    fn has_room(&self, size: u64, bound: u64) -> bool {
        let Some(mem) = &self.mem else { return true };
        let floor = self.floors.lock().values().copied().min();
        mem.make_room(size, bound, floor)
    }

    /// A consumer name subscribed at, or committed, `offset`: it may still
    /// read from there. Frees room in a `block` partition and lets held
    /// appends in. Cheap for memory partitions; call it off the async
    /// workers otherwise (held appends may write).
    pub fn consumer_at(&self, consumer: &str, offset: u64) {
        if self.block_bound.is_none() {
            return;
        }
        self.floors.lock().insert(consumer.to_string(), offset);
        self.release_held();
    }

    /// Appends the held batches that fit now, in order.
    pub(super) fn release_held(&self) {
        let Some(bound) = self.block_bound else {
            return;
        };
        let mut answers = Vec::new();
        {
            let mut guard = self.appender.lock();
            let Some(ap) = guard.as_mut() else { return };
            while ap
                .held
                .front()
                .is_some_and(|h| self.has_room(h.size(), bound))
            {
                let Some(h) = ap.held.pop_front() else { break };
                answers.extend(self.append_locked(ap, h));
            }
            if !answers.is_empty() {
                tracing::debug!(topic = %self.topic, partition = self.id, released = answers.len(), still_held = ap.held.len(), "consumers freed room; held appends stored");
            }
        }
        for (reply, r) in answers {
            reply(r);
        }
    }

    /// The periodic pass: seals the segments the log rolled away from (off
    /// the append path), then applies retention; room it frees in a
    pub(super) fn closed_error(&self) -> ServerError {
        if self.is_deleted() {
            let (code, message) = self.gone_error();
            ServerError::coded(code, message)
        } else {
            ServerError::coded(
                ErrorCode::SHUTTING_DOWN,
                format!("partition {}/{} is closed", self.topic, self.id),
            )
        }
    }

    /// Answers held appends with `error` (they were never stored).
    pub(super) fn refuse_held(&self, held: VecDeque<Held>, error: impl Fn() -> ServerError) {
        if held.is_empty() {
            return;
        }
        tracing::info!(topic = %self.topic, partition = self.id, refused = held.len(), "held appends refused");
        for h in held {
            (h.reply)(Err(error()));
        }
    }

    /// Ends the stream: every append before this is kept, later ones are
    /// The sequence table, read from the log's tail the first time.
    fn producers(&self) -> parking_lot::MappedMutexGuard<'_, crate::producers::Producers> {
        parking_lot::MutexGuard::map(self.producers.lock(), |t| {
            t.get_or_insert_with(|| crate::producers::Producers::rebuild(&*self.log))
        })
    }

    /// A follower copied the batch `meta` as `a`: its stamp, if any, is
    /// known here now (so this replica answers its resend as a leader).
    /// (A table not read yet will find it in the log.)
    pub(super) fn copied(&self, meta: &[u8], a: &Appended) {
        if let (Some(s), Some(t)) = (strom_proto::stamp_of(meta), self.producers.lock().as_mut()) {
            t.appended(s, a);
        }
    }

    fn append_now(&self, batch: &ValidBatch) -> Result<Appended, ServerError> {
        if self.is_sealed() {
            return Err(ServerError::coded(
                ErrorCode::TOPIC_CLOSED,
                format!(
                    "topic '{}' has ended; it accepts no more events",
                    self.topic
                ),
            ));
        }
        let started = std::time::Instant::now();
        let appended = self
            .log
            .append(AppendBatch {
                count: batch.count(),
                meta: batch.meta(),
                data: batch.data(),
            })
            .inspect_err(|_| self.stats.append_failed())?;
        self.stats
            .appended(batch.count(), batch.size(), started.elapsed());
        if self.retain_on_append {
            self.log.enforce_retention(appended.timestamp_us)?;
        }
        Ok(appended)
    }
}
