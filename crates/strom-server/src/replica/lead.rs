//! The leader's side of a replicated partition: where each follower got
//! to, the high watermark, the `acks=all` appends waiting for it, the
//! in-sync replicas (kept with the registry's consent) and the answers to
//! followers' fetches.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strom_proto::{ErrorCode, ReplicaBatchHead, ReplicaRole, Request, Response};
use strom_storage::Appended;

use super::{refusal, Replica, State, LAG};
use crate::error::ServerError;
use crate::health::FollowerSnapshot;
use crate::partition::{AppendReply, PartitionManager};

/// How long a fetch that finds nothing new waits for the next batch.
const LONG_POLL: Duration = Duration::from_millis(500);

/// The most named consumers' offsets one fetch answer copies.
const MAX_OFFSETS: usize = 10_000;

/// How often the leader checks its followers against [`LAG`].
const KEEP_EVERY: Duration = Duration::from_millis(250);

/// One follower, as its fetches show it.
struct Peer {
    /// Everything below it is durable on the follower.
    end: u64,
    /// The leader's durable end when it last answered this follower
    /// (`u64::MAX` before the first answer).
    answered_to: u64,
    /// When it last fetched from at least `answered_to`: it had copied
    /// everything the leader held when it asked before (Kafka's rule, so a
    /// follower under steady load counts as caught up).
    caught_up: Option<Instant>,
}

pub(super) struct Leading {
    pub epoch: u64,
    /// In-sync replicas as the registry recorded them (this member too).
    pub isr: BTreeSet<u32>,
    followers: BTreeMap<u32, Peer>,
    pub hwm: u64,
    /// `acks=all` appends: (end offset, what was appended, reply).
    pub pending: Vec<(u64, Appended, AppendReply)>,
    /// Whether an ISR change is on its way to the registry.
    reporting: bool,
    /// Members of ISRs reported but not (known to be) recorded: the
    /// registry may have recorded any of them, and may elect any of them
    /// (a failover, a move's leadership transfer), so until it answers the
    /// high watermark waits for them too (Kafka's "maximal ISR").
    in_doubt: BTreeSet<u32>,
}

pub(super) fn lost_leadership(topic: &str, partition: u32) -> ServerError {
    refusal(
        ErrorCode::NOT_PARTITION_LEADER,
        format!(
            "partition {topic}/{partition}: this member stopped leading it before every in-sync replica had the batch; it may or may not be kept"
        ),
    )
}

/// The answer to an `acks=all` append the high watermark passed while
/// fewer than `min_in_sync` replicas are in sync (`isr`).
pub(super) fn too_few_after_append(
    topic: &str,
    partition: u32,
    isr: &BTreeSet<u32>,
    min_in_sync: u32,
) -> ServerError {
    refusal(
        ErrorCode::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        format!(
            "partition {topic}/{partition}: the in-sync replicas fell to {isr:?}, below min_in_sync = {min_in_sync}, before the batch was acknowledged; the leader holds it and it may or may not be kept (an idempotent producer resends it)"
        ),
    )
}

impl Leading {
    /// Whether an `acks=all` append the high watermark passed may be
    /// acknowledged now: only while at least `min_in_sync` replicas are in
    /// sync. The ISR can shrink after the append was admitted (a follower
    /// whose disk filled up), and the high watermark then covers what only
    /// this member holds (Kafka's `NOT_ENOUGH_REPLICAS_AFTER_APPEND`).
    pub fn completion(
        &self,
        min_in_sync: u32,
        topic: &str,
        partition: u32,
    ) -> Result<(), ServerError> {
        if (self.isr.len() as u32) < min_in_sync {
            return Err(too_few_after_append(
                topic,
                partition,
                &self.isr,
                min_in_sync,
            ));
        }
        Ok(())
    }

    pub fn new(role: &ReplicaRole, me: u32, _end: u64, hwm: u64) -> Leading {
        let now = Instant::now();
        let followers = role
            .followers
            .iter()
            .filter(|f| **f != me)
            .map(|f| {
                // Those in sync get a full lag to show it.
                let caught_up = role.isr.contains(f).then_some(now);
                let peer = Peer {
                    end: 0,
                    answered_to: u64::MAX,
                    caught_up,
                };
                (*f, peer)
            })
            .collect();
        let mut isr: BTreeSet<u32> = role.isr.iter().copied().collect();
        isr.insert(me);
        Leading {
            epoch: role.epoch,
            isr,
            followers,
            hwm,
            pending: Vec::new(),
            reporting: false,
            in_doubt: BTreeSet::new(),
        }
    }

    /// The high watermark for a durable end of `durable` here, and the
    /// `acks=all` appends it now covers.
    pub fn advance(&mut self, durable: u64) -> (u64, Vec<(u64, Appended, AppendReply)>) {
        let hwm = self
            .followers
            .iter()
            .filter(|(id, _)| self.isr.contains(id) || self.in_doubt.contains(id))
            .map(|(_, p)| p.end)
            .fold(durable, u64::min);
        self.hwm = self.hwm.max(hwm);
        let (ready, waiting) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(end, _, _)| *end <= self.hwm);
        self.pending = waiting;
        (self.hwm, ready)
    }

    /// Answers every waiting `acks=all` append with the loss of leadership.
    pub fn fail_pending(self, topic: &str, partition: u32) {
        for (_, _, reply) in self.pending {
            reply(Err(lost_leadership(topic, partition)));
        }
    }

    /// The registry took members out of the ISR (a member that restarted):
    /// they leave this leader's ISR too, and count as caught up only once
    /// they prove it again.
    pub fn drop_out_of_sync(&mut self, registry_isr: &[u32], me: u32) {
        let gone: Vec<u32> = self
            .isr
            .iter()
            .copied()
            .filter(|m| *m != me && !registry_isr.contains(m))
            .collect();
        for m in gone {
            self.isr.remove(&m);
            if let Some(p) = self.followers.get_mut(&m) {
                p.caught_up = None;
                p.answered_to = u64::MAX;
            }
        }
    }

    /// The registry changed the replicas within this epoch (a move added
    /// or dropped some): a new follower starts out of sync, a dropped one
    /// leaves the ISR and is no longer waited for.
    pub fn set_followers(&mut self, followers: &[u32], me: u32) {
        self.followers
            .retain(|id, _| followers.contains(id) && *id != me);
        self.isr.retain(|id| *id == me || followers.contains(id));
        for f in followers.iter().filter(|f| **f != me) {
            self.followers.entry(*f).or_insert(Peer {
                end: 0,
                answered_to: u64::MAX,
                caught_up: None,
            });
        }
    }

    /// The ISR is on its way to the registry as `wanted`: its members are
    /// waited for from now on, until the registry's answer is known.
    pub fn propose(&mut self, wanted: &BTreeSet<u32>) {
        self.reporting = true;
        self.in_doubt.extend(wanted);
    }

    /// The registry did not answer: it may or may not have recorded what
    /// was reported, so its members stay waited for.
    pub fn report_failed(&mut self) {
        self.reporting = false;
    }

    /// The registry recorded `isr`, which is now the whole truth.
    pub fn recorded(&mut self, isr: BTreeSet<u32>) {
        self.reporting = false;
        self.isr = isr;
        self.in_doubt.clear();
    }

    /// Each follower's progress against `durable`, the leader's durable end.
    pub fn follower_snapshots(&self, durable: u64) -> Vec<FollowerSnapshot> {
        self.followers
            .iter()
            .map(|(id, p)| FollowerSnapshot {
                member: *id,
                in_sync: self.isr.contains(id),
                lag_events: durable.saturating_sub(p.end),
                lag_seconds: p.caught_up.map(|t| t.elapsed().as_secs_f64()),
            })
            .collect()
    }

    /// The ISR the followers' progress asks for: this member, and every
    /// follower that caught up within [`LAG`].
    fn wanted_isr(&self, me: u32) -> BTreeSet<u32> {
        let mut isr: BTreeSet<u32> = self
            .followers
            .iter()
            .filter(|(_, p)| p.caught_up.is_some_and(|t| t.elapsed() < LAG))
            .map(|(id, _)| *id)
            .collect();
        isr.insert(me);
        isr
    }
}

impl Replica {
    /// Keeps the ISR while this member leads in `epoch`.
    pub(super) fn spawn_isr_keeper(self: Arc<Self>, epoch: u64) {
        tokio::runtime::Handle::current().spawn(async move {
            loop {
                tokio::time::sleep(KEEP_EVERY).await;
                let wanted = {
                    let mut st = self.state.lock();
                    let State::Leading(l) = &mut *st else { return };
                    if l.epoch != epoch {
                        return;
                    }
                    let wanted = l.wanted_isr(self.me);
                    // An ISR in doubt is reported again until the registry
                    // answers, so that what is waited for settles.
                    if (wanted == l.isr && l.in_doubt.is_empty()) || l.reporting {
                        continue;
                    }
                    l.propose(&wanted);
                    wanted
                };
                self.report_isr(epoch, wanted).await;
            }
        });
    }

    /// Asks the registry to record `isr`; applies it once recorded, steps
    /// down if the registry says the epoch is over.
    async fn report_isr(&self, epoch: u64, isr: BTreeSet<u32>) {
        let req = Request::ReportIsr {
            topic: self.topic.clone(),
            partition: self.partition,
            epoch,
            isr: isr.iter().copied().collect(),
        };
        let master = self.master.read().clone();
        let answer = match master {
            Some(addr) => self.peers.call(&addr, &req).await,
            None => Err(refusal(
                ErrorCode::NOT_MASTER,
                "no registry master known".into(),
            )),
        };
        let Some(pm) = self.pm.upgrade() else { return };
        let mut st = self.state.lock();
        let State::Leading(l) = &mut *st else { return };
        match answer {
            Ok(_) => {
                tracing::info!(topic = %self.topic, partition = self.partition, epoch, from = ?l.isr, to = ?isr, "in-sync replicas changed");
                l.recorded(isr);
                drop(st);
                self.recompute(&pm);
            }
            Err(e) if e.code() == ErrorCode::FENCED => {
                tracing::warn!(topic = %self.topic, partition = self.partition, epoch, error = %e, "deposed: the registry has a newer leader epoch; taking no more appends");
                let State::Leading(l) = std::mem::replace(&mut *st, State::Idle { epoch }) else {
                    return;
                };
                drop(st);
                l.fail_pending(&self.topic, self.partition);
            }
            Err(e) => {
                l.report_failed();
                tracing::debug!(topic = %self.topic, partition = self.partition, error = %e, "could not report the in-sync replicas; retrying");
            }
        }
    }

    /// Answers a follower's fetch: where to cut its log, or the batches
    /// after `from` (waiting up to [`LONG_POLL`] for one).
    pub async fn serve_fetch(
        self: &Arc<Self>,
        epoch: u64,
        follower: u32,
        from: u64,
        last_epoch: u64,
        max_bytes: u32,
    ) -> Result<Response, ServerError> {
        let pm = self
            .pm
            .upgrade()
            .ok_or_else(|| refusal(ErrorCode::SHUTTING_DOWN, "the partition is closed".into()))?;
        self.note_fetch(&pm, epoch, follower, from)?;
        let log_end = pm.next_offset();
        if let Some(cut) = self.divergence(from, last_epoch, log_end) {
            return Ok(self.batches(&pm, Some(cut), Vec::new(), Bytes::new()));
        }
        let mut durable = self.durable_end.subscribe();
        if *durable.borrow_and_update() <= from {
            let _ = tokio::time::timeout(LONG_POLL, durable.changed()).await;
        }
        let until = *durable.borrow();
        self.answered(epoch, follower, until);
        if until <= from {
            return Ok(self.batches(&pm, None, Vec::new(), Bytes::new()));
        }
        let p = pm.clone();
        let (heads, bytes) =
            tokio::task::spawn_blocking(move || read_batches(&p, from, until, max_bytes))
                .await
                .map_err(|e| refusal(ErrorCode::INTERNAL, e.to_string()))??;
        Ok(self.batches(&pm, None, heads, bytes))
    }

    fn batches(
        &self,
        pm: &PartitionManager,
        truncate_to: Option<u64>,
        batches: Vec<ReplicaBatchHead>,
        bytes: Bytes,
    ) -> Response {
        let mut offsets = pm.committed_all();
        offsets.truncate(MAX_OFFSETS);
        Response::ReplicaBatches {
            hwm: pm.visible(),
            truncate_to,
            epochs: self.epoch_list(),
            batches,
            bytes,
            offsets,
        }
    }

    /// Records the durable end this leader is answering `follower` with.
    fn answered(&self, epoch: u64, follower: u32, until: u64) {
        let mut st = self.state.lock();
        if let State::Leading(l) = &mut *st {
            if l.epoch == epoch {
                if let Some(peer) = l.followers.get_mut(&follower) {
                    peer.answered_to = until;
                }
            }
        }
    }

    /// Checks the fetch's epoch and records how far the follower got.
    fn note_fetch(
        &self,
        pm: &PartitionManager,
        epoch: u64,
        follower: u32,
        from: u64,
    ) -> Result<(), ServerError> {
        let durable = *self.durable_end.borrow();
        {
            let mut st = self.state.lock();
            let l = match &mut *st {
                State::Leading(l) => l,
                other => {
                    return Err(refusal(
                        ErrorCode::NOT_PARTITION_LEADER,
                        format!(
                            "member {} does not lead partition {}/{} (epoch {})",
                            self.me,
                            self.topic,
                            self.partition,
                            other.epoch()
                        ),
                    ))
                }
            };
            if l.epoch != epoch {
                return Err(refusal(
                    ErrorCode::FENCED,
                    format!(
                        "partition {}/{}: the fetch is for epoch {epoch}, this leader's is {}",
                        self.topic, self.partition, l.epoch
                    ),
                ));
            }
            let Some(peer) = l.followers.get_mut(&follower) else {
                return Err(refusal(
                    ErrorCode::INVALID_ARGUMENT,
                    format!(
                        "member {follower} is not a replica of partition {}/{}",
                        self.topic, self.partition
                    ),
                ));
            };
            peer.end = from;
            if from >= durable || from >= peer.answered_to {
                peer.caught_up = Some(Instant::now());
            }
        }
        self.recompute(pm);
        Ok(())
    }

    /// Where a follower whose latest epoch is `last_epoch` and whose log
    /// ends at `from` must cut its log, if it holds what this leader does
    /// not (Kafka's OffsetsForLeaderEpoch).
    fn divergence(&self, from: u64, last_epoch: u64, log_end: u64) -> Option<u64> {
        if from == 0 {
            return None;
        }
        let end = match self.epochs.end_offset_for(last_epoch, log_end) {
            Some((_, end)) => end,
            // Older than every epoch this leader knows: keep nothing.
            None => self.epochs.entries().first().map_or(0, |e| e.start_offset),
        };
        (end < from).then_some(end)
    }
}

/// Whole batches in `[from, until)`, at least one, up to `max_bytes`.
fn read_batches(
    pm: &PartitionManager,
    from: u64,
    until: u64,
    max_bytes: u32,
) -> Result<(Vec<ReplicaBatchHead>, Bytes), ServerError> {
    let mut heads = Vec::new();
    let mut out = BytesMut::new();
    let stored = pm.read(from, max_bytes as usize)?;
    for b in stored {
        let end = b.base_offset + u64::from(b.count);
        if end > until || (!heads.is_empty() && out.len() as u64 + b.data_len > max_bytes as u64) {
            break;
        }
        let mut data = Vec::new();
        if b.data_len > 0 {
            pm.read_data(b.base_offset, &[(0, b.data_len)], &mut data)?;
        }
        heads.push(ReplicaBatchHead {
            base_offset: b.base_offset,
            count: b.count,
            timestamp_us: b.timestamp_us,
            meta_len: b.meta.len() as u32,
            data_len: b.data_len,
        });
        out.extend_from_slice(&b.meta);
        for d in data {
            out.extend_from_slice(&d);
        }
    }
    Ok((heads, out.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leader 0 with followers 1 and 2; the registry's ISR is {0, 1}.
    fn leading() -> Leading {
        let role = ReplicaRole {
            partition: 0,
            epoch: 1,
            leader: 0,
            followers: vec![1, 2],
            isr: vec![0, 1],
            ..Default::default()
        };
        Leading::new(&role, 0, 0, 0)
    }

    fn fetched(l: &mut Leading, follower: u32, end: u64) {
        l.followers.get_mut(&follower).unwrap().end = end;
    }

    /// The registry may record an ISR expansion (and elect the new member,
    /// as a move's leadership transfer does) before its answer reaches the
    /// leader: from the moment the leader asks, it waits for the new member
    /// too, or it would acknowledge events the next leader lacks.
    #[test]
    fn an_isr_expansion_on_its_way_to_the_registry_is_waited_for_already() {
        let mut l = leading();
        fetched(&mut l, 1, 10);
        fetched(&mut l, 2, 6);
        assert_eq!(
            l.advance(10).0,
            10,
            "before anything is asked: the recorded ISR {{0, 1}} decides"
        );
        let wanted: BTreeSet<u32> = [0, 1, 2].into_iter().collect();
        l.propose(&wanted);
        fetched(&mut l, 1, 20);
        fetched(&mut l, 2, 12);
        assert_eq!(
            l.advance(20).0,
            12,
            "member 2 is waited for while the expansion is in doubt"
        );
        // The answer is lost: still in doubt, still waited for.
        l.report_failed();
        fetched(&mut l, 2, 14);
        assert_eq!(l.advance(20).0, 14);
        l.recorded(wanted);
        fetched(&mut l, 2, 20);
        assert_eq!(l.advance(20).0, 20);
    }

    /// A shrink in doubt keeps waiting for the member leaving until the
    /// registry has recorded it.
    #[test]
    fn an_isr_shrink_takes_effect_only_once_recorded() {
        let mut l = leading();
        fetched(&mut l, 1, 5);
        let wanted: BTreeSet<u32> = [0].into_iter().collect();
        l.propose(&wanted);
        assert_eq!(l.advance(9).0, 5, "member 1 is still waited for");
        l.recorded(wanted);
        assert_eq!(l.advance(9).0, 9);
    }
}
