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
    /// Whether its latest fetch was caught up (at most one round behind).
    current: bool,
    /// The registry dropped it from the replicas, but it may still be in
    /// the registry's ISR until this leader's own report is recorded: it
    /// is waited for until then, and never proposed again.
    leaving: bool,
}

impl Peer {
    fn new(caught_up: Option<Instant>) -> Peer {
        Peer {
            end: 0,
            answered_to: u64::MAX,
            caught_up,
            current: false,
            leaving: false,
        }
    }

    /// Caught up within [`LAG`].
    fn lagging_less_than_lag(&self) -> bool {
        self.caught_up.is_some_and(|t| t.elapsed() < LAG)
    }

    /// Joining: its latest fetch was at most a round behind, within
    /// [`LAG`], and the registry has not dropped it.
    fn joining(&self) -> bool {
        self.current && !self.leaving && self.lagging_less_than_lag()
    }

    /// Out of sync until it proves otherwise again.
    fn forget_progress(&mut self) {
        self.caught_up = None;
        self.current = false;
        self.answered_to = u64::MAX;
    }
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
    /// Members the registry may hold in the ISR although this leader's
    /// `isr` does not: those of ISRs reported but not (known to be)
    /// recorded, and those a role message dropped. The registry may elect
    /// any of them (a failover, a move's leadership transfer), so until it
    /// answers this leader's own report the high watermark waits for them
    /// too (Kafka's "maximal ISR"). Role messages travel after the
    /// registry's lock is released and can arrive stale, so they never make
    /// this leader wait for fewer members; only a recorded report does.
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
                (*f, Peer::new(role.isr.contains(f).then_some(now)))
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

    /// Whether the high watermark waits for follower `id`: an in-sync
    /// replica, one that may be in the registry's ISR, or one *joining*
    /// (its latest fetch was at most a round behind). A joiner holds the
    /// watermark where it is until it reaches it, so that it can be
    /// proposed for the ISR with everything acknowledged already copied,
    /// even under a steady stream of appends.
    fn waits_for(&self, id: u32, p: &Peer) -> bool {
        self.isr.contains(&id) || self.in_doubt.contains(&id) || p.joining()
    }

    /// The high watermark for a durable end of `durable` here, and the
    /// `acks=all` appends it now covers.
    pub fn advance(&mut self, durable: u64) -> (u64, Vec<(u64, Appended, AppendReply)>) {
        let hwm = self
            .followers
            .iter()
            .filter(|(id, p)| self.waits_for(**id, p))
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

    /// A role message leaves members out of the ISR (the registry took out
    /// a member that restarted, or the message is stale): they leave this
    /// leader's ISR and count as caught up only once they prove it again,
    /// but stay waited for until this leader's next report is recorded.
    pub fn drop_out_of_sync(&mut self, registry_isr: &[u32], me: u32) {
        let gone: Vec<u32> = self
            .isr
            .iter()
            .copied()
            .filter(|m| *m != me && !registry_isr.contains(m))
            .collect();
        for m in gone {
            self.isr.remove(&m);
            self.in_doubt.insert(m);
            if let Some(p) = self.followers.get_mut(&m) {
                p.forget_progress();
            }
        }
    }

    /// The registry changed the replicas within this epoch (a move added
    /// or dropped some): a new follower starts out of sync; a dropped one
    /// is never proposed again, and leaves once a report without it is
    /// recorded (waited for until then, as the message may be stale).
    pub fn set_followers(&mut self, followers: &[u32], me: u32) {
        for (id, p) in self.followers.iter_mut() {
            if !followers.contains(id) && !p.leaving {
                p.leaving = true;
                if self.isr.remove(id) {
                    self.in_doubt.insert(*id);
                }
            }
        }
        let (isr, doubt) = (&self.isr, &self.in_doubt);
        self.followers
            .retain(|id, p| !p.leaving || isr.contains(id) || doubt.contains(id));
        for f in followers.iter().filter(|f| **f != me) {
            let p = self.followers.entry(*f).or_insert_with(|| Peer::new(None));
            p.leaving = false;
        }
    }

    /// Records a fetch by `follower` from `from` (everything below it is
    /// durable on the follower), with `durable` the leader's durable end.
    /// A fetch whose log diverges from this leader's (`diverged`: it is
    /// told where to cut) shows nothing about what it holds of this log.
    fn fetched(&mut self, follower: u32, from: u64, durable: u64, diverged: bool) -> bool {
        let Some(peer) = self.followers.get_mut(&follower) else {
            return false;
        };
        if diverged {
            peer.current = false;
            return true;
        }
        peer.end = from;
        peer.current = from >= durable || from >= peer.answered_to;
        if peer.current {
            peer.caught_up = Some(Instant::now());
        }
        true
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

    /// The registry recorded `isr`, which is now the whole truth (the
    /// registry only ever shrinks it by itself): members the registry
    /// dropped from the replicas leave.
    pub fn recorded(&mut self, isr: BTreeSet<u32>) {
        self.reporting = false;
        self.isr = isr;
        self.in_doubt.clear();
        let isr = &self.isr;
        self.followers
            .retain(|id, p| !p.leaving || isr.contains(id));
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

    /// The ISR the followers' progress asks for: this member, every
    /// in-sync follower that caught up within [`LAG`], and every other one
    /// whose latest fetch was caught up and that holds everything below
    /// the high watermark (Kafka's rule: a replica joins the ISR only with
    /// every acknowledged event, since it may be elected at once).
    fn wanted_isr(&self, me: u32) -> BTreeSet<u32> {
        let mut isr: BTreeSet<u32> = self
            .followers
            .iter()
            .filter(|(id, p)| {
                let in_sync = self.isr.contains(id) && !p.leaving && p.lagging_less_than_lag();
                in_sync || (p.joining() && p.end >= self.hwm)
            })
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
        let cut = self.divergence(from, last_epoch, pm.next_offset());
        self.note_fetch(&pm, epoch, follower, from, cut.is_some())?;
        if let Some(cut) = cut {
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

    /// Checks the fetch's epoch and records how far the follower got
    /// (nothing, if its log diverges from this leader's).
    fn note_fetch(
        &self,
        pm: &PartitionManager,
        epoch: u64,
        follower: u32,
        from: u64,
        diverged: bool,
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
            if !l.fetched(follower, from, durable, diverged) {
                return Err(refusal(
                    ErrorCode::INVALID_ARGUMENT,
                    format!(
                        "member {follower} is not a replica of partition {}/{}",
                        self.topic, self.partition
                    ),
                ));
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

    fn at_end(l: &mut Leading, follower: u32, end: u64) {
        l.followers.get_mut(&follower).unwrap().end = end;
    }

    /// The registry may record an ISR expansion (and elect the new member,
    /// as a move's leadership transfer does) before its answer reaches the
    /// leader: from the moment the leader asks, it waits for the new member
    /// too, or it would acknowledge events the next leader lacks.
    #[test]
    fn an_isr_expansion_on_its_way_to_the_registry_is_waited_for_already() {
        let mut l = leading();
        at_end(&mut l, 1, 10);
        at_end(&mut l, 2, 6);
        assert_eq!(
            l.advance(10).0,
            10,
            "before anything is asked: the recorded ISR {{0, 1}} decides"
        );
        let wanted: BTreeSet<u32> = [0, 1, 2].into_iter().collect();
        l.propose(&wanted);
        at_end(&mut l, 1, 20);
        at_end(&mut l, 2, 12);
        assert_eq!(
            l.advance(20).0,
            12,
            "member 2 is waited for while the expansion is in doubt"
        );
        // The answer is lost: still in doubt, still waited for.
        l.report_failed();
        at_end(&mut l, 2, 14);
        assert_eq!(l.advance(20).0, 14);
        l.recorded(wanted);
        at_end(&mut l, 2, 20);
        assert_eq!(l.advance(20).0, 20);
    }

    /// A shrink in doubt keeps waiting for the member leaving until the
    /// registry has recorded it.
    #[test]
    fn an_isr_shrink_takes_effect_only_once_recorded() {
        let mut l = leading();
        at_end(&mut l, 1, 5);
        let wanted: BTreeSet<u32> = [0].into_iter().collect();
        l.propose(&wanted);
        assert_eq!(l.advance(9).0, 5, "member 1 is still waited for");
        l.recorded(wanted);
        assert_eq!(l.advance(9).0, 9);
    }

    /// Leader 0 alone in sync, with a new follower 1 (a move's new copy).
    fn alone() -> Leading {
        let role = ReplicaRole {
            partition: 0,
            epoch: 1,
            leader: 0,
            followers: vec![1],
            isr: vec![0],
            ..Default::default()
        };
        Leading::new(&role, 0, 0, 0)
    }

    /// The leader answered follower 1 with its durable end `until`; the
    /// follower then fetches from `from`.
    fn round(l: &mut Leading, until: u64, from: u64, durable: u64) {
        l.followers.get_mut(&1).unwrap().answered_to = until;
        assert!(l.fetched(1, from, durable, false));
    }

    /// A follower one fetch round behind counts as caught up, but it joins
    /// the ISR only once it holds everything below the high watermark: a
    /// move hands it the leadership as soon as the registry records it in
    /// sync, and what it lacks of the acknowledged events would be lost.
    #[test]
    fn a_follower_behind_the_high_watermark_is_not_proposed_for_the_isr() {
        let mut l = alone();
        assert_eq!(l.advance(20).0, 20, "alone in sync: its own durable end");
        round(&mut l, 15, 15, 20);
        assert!(l.followers[&1].current, "one round behind: caught up");
        assert_eq!(
            l.wanted_isr(0),
            [0].into_iter().collect(),
            "15 < hwm 20: not proposed"
        );
        assert_eq!(
            l.advance(30).0,
            20,
            "the joiner holds the watermark until it reaches it"
        );
        round(&mut l, 30, 30, 40);
        assert_eq!(l.wanted_isr(0), [0, 1].into_iter().collect());
        assert_eq!(l.advance(40).0, 30, "still waited for while it joins");
    }

    /// A follower that falls more than a round behind stops holding the
    /// watermark back (it is not joining any more).
    #[test]
    fn a_follower_that_falls_behind_stops_holding_the_watermark() {
        let mut l = alone();
        l.advance(20);
        round(&mut l, 15, 15, 20);
        round(&mut l, 40, 25, 50);
        assert!(!l.followers[&1].current);
        assert_eq!(l.advance(50).0, 50);
    }

    /// A fetch from a log that diverges from the leader's (a deposed
    /// leader's unreplicated tail) says nothing about what the follower
    /// holds of this log: it must not move the high watermark.
    #[test]
    fn a_diverging_fetch_does_not_count_as_progress() {
        let mut l = leading();
        at_end(&mut l, 1, 5);
        assert!(l.fetched(1, 30, 40, true));
        assert_eq!(l.followers[&1].end, 5);
        assert_eq!(l.advance(40).0, 5);
        assert!(!l.fetched(9, 30, 40, false), "not a replica");
    }

    /// Role messages are sent after the registry's lock is released, so an
    /// old one can arrive after a newer ISR was recorded: a member it
    /// leaves out stays waited for until this leader's own report (which
    /// it then sends) is recorded.
    #[test]
    fn a_role_that_leaves_out_an_in_sync_member_does_not_stop_the_wait_for_it() {
        let mut l = leading();
        at_end(&mut l, 1, 5);
        l.drop_out_of_sync(&[0], 0);
        assert!(!l.isr.contains(&1));
        assert_eq!(l.advance(9).0, 5, "member 1 is still waited for");
        assert!(!l.in_doubt.is_empty(), "so the ISR keeper reports");
        l.recorded([0].into_iter().collect());
        assert_eq!(l.advance(9).0, 9);
    }

    /// The same for a role that leaves out an in-sync follower altogether
    /// (a move's last step, or an old message from before a move added
    /// it): it leaves once a report without it is recorded.
    #[test]
    fn a_role_that_drops_an_in_sync_follower_keeps_it_waited_for_until_recorded() {
        let mut l = leading();
        at_end(&mut l, 1, 5);
        at_end(&mut l, 2, 9);
        l.set_followers(&[2], 0);
        assert_eq!(l.advance(9).0, 5, "member 1 is still waited for");
        assert!(
            !l.wanted_isr(0).contains(&1),
            "a dropped follower is not proposed"
        );
        l.recorded([0].into_iter().collect());
        assert!(!l.followers.contains_key(&1), "it leaves once recorded");
        assert_eq!(l.advance(9).0, 9);
        l.set_followers(&[1, 2], 0);
        assert!(
            l.followers.contains_key(&1),
            "a member added again is a follower again"
        );
    }
}
