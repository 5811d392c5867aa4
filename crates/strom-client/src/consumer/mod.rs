//! The consumer: named, over some or all partitions of a topic. One
//! subscription task per partition (see `subscription.rs`) queues events
//! whose selected data already landed in the broker's buffers; `pull` takes
//! from that queue and returns credit to the server in chunks, which bounds
//! the prefetch. A partition whose server is unreachable reports one error
//! and keeps retrying, while the other partitions carry on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use strom_policy::TopicPolicy;
use strom_proto::{Compression, Request, StartPos};
use tokio::task::JoinHandle;

use crate::backend::Feed;
use crate::conn::ClientConn;
use crate::data::DataBudget;
use crate::error::{Error, Result};
use crate::event::{AckTarget, Event, Owner, PartitionAcks};
use crate::group::Membership;
use crate::share::ShareAcks;
use crate::subscription::{refresh_loop, run_partition};
use crate::topic::Topic;
use crate::unpack::Unpacker;

mod options;

pub use options::{
    default_spin, ConsumerOptions, DEFAULT_SPIN, LATENCY_SPIN, SPARE_CORES, SPIN_ENV,
};

const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What `pull` yields: an event, or the end of the stream.
pub enum Next {
    Event(Event),
    EndOfStream,
}

pub(crate) enum Item {
    Events(u32, VecDeque<Event>),
    End(u32),
    Failed(Error),
    /// Partitioned groups: the listener's `on_assigned`, queued ahead of
    /// the partitions' events.
    Assigned(Vec<u32>),
    /// Partitioned groups: the listener's `on_revoked`.
    Revoked(Vec<u32>),
    /// Partitioned groups: the group read the whole stream; stays queued.
    GroupEnd,
}

pub(crate) struct Queue {
    items: VecDeque<Item>,
    pub epoch: u64,
    pub ended: Vec<bool>,
    /// Slots whose partition was revoked: their events are dropped.
    dead: Vec<bool>,
    /// A partitioned group's member: the end comes from the group.
    partitioned: bool,
    /// Events taken per partition since credit was last returned.
    pub taken: Vec<u32>,
    wakers: Vec<Waker>,
}

/// One subscribed partition.
pub(crate) struct PartSub {
    pub partition: u32,
    pub owner: Arc<Mutex<Owner>>,
    /// The connection the current subscription runs on.
    pub conn: Mutex<Option<Arc<ClientConn>>>,
    pub acks: AckTarget,
    pub stream: AtomicU64,
    /// Partitioned groups: the holder `(consumer, epoch)` it is read as.
    pub fence: Option<(u64, u64)>,
    /// Partitioned groups: the partition's end offset, once reached.
    pub end: AtomicU64,
    /// Partitioned groups: the subscription task, stopped on revocation.
    pub task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl PartSub {
    /// A partition read under `name`, or in a shared group when `group` is
    /// set (then `name` is the group's).
    pub fn new(
        topic: &Topic,
        name: &str,
        group: Option<&Membership>,
        partition: u32,
        member: u32,
        addr: String,
    ) -> Arc<Self> {
        let owner = Arc::new(Mutex::new(Owner { member, addr }));
        let acks = match group {
            Some(g) if g.is_shared() => {
                AckTarget::Share(ShareAcks::new(topic, partition, name, owner.clone()))
            }
            _ => AckTarget::Offsets(PartitionAcks::new(
                topic,
                partition,
                name.into(),
                owner.clone(),
            )),
        };
        Arc::new(PartSub {
            partition,
            acks,
            owner,
            conn: Mutex::new(None),
            stream: AtomicU64::new(0),
            fence: None,
            end: AtomicU64::new(u64::MAX),
            task: Mutex::new(None),
        })
    }

    /// A partition held in partitioned group `group` as `fence`.
    pub fn held(
        topic: &Topic,
        group: &str,
        partition: u32,
        owner: Owner,
        fence: (u64, u64),
    ) -> Arc<Self> {
        let owner = Arc::new(Mutex::new(owner));
        let acks =
            PartitionAcks::fenced(topic, partition, group.into(), owner.clone(), Some(fence));
        Arc::new(PartSub {
            partition,
            acks: AckTarget::Offsets(acks),
            owner,
            conn: Mutex::new(None),
            stream: AtomicU64::new(0),
            fence: Some(fence),
            end: AtomicU64::new(u64::MAX),
            task: Mutex::new(None),
        })
    }

    /// Partitioned groups: `(partition, end)` once the partition was read
    /// to its end and committed there.
    pub fn finished(&self) -> Option<(u32, u64)> {
        let end = self.end.load(Ordering::Acquire);
        match &self.acks {
            AckTarget::Offsets(a) if end != u64::MAX && a.committed() >= end => {
                Some((self.partition, end))
            }
            _ => None,
        }
    }

    /// Stops the current subscription, if any (best effort).
    pub fn unsubscribe(&self) {
        let stream = self.stream.swap(0, Ordering::AcqRel);
        if let (true, Some(conn)) = (stream != 0, self.conn.lock().take()) {
            conn.close_stream(stream);
            conn.send_oneway(&Request::Unsubscribe { stream });
        }
    }
}

pub(crate) struct Shared {
    pub topic: Topic,
    pub name: String,
    /// The consumer group this consumer is a member of.
    pub group: Option<Arc<Membership>>,
    pub policy: Arc<TopicPolicy>,
    pub opts: ConsumerOptions,
    /// Grows when partitions are added (if the consumer follows all).
    pub parts: RwLock<Vec<Arc<PartSub>>>,
    pub tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Partitioned groups: the partitions held now.
    pub assigned: Mutex<Vec<u32>>,
    pub budget: DataBudget,
    pub queue: Mutex<Queue>,
    cond: Condvar,
    /// A compressed topic's decoder (`None` when data parts are stored as
    /// pushed).
    pub unpacker: Option<Arc<Unpacker>>,
}

impl Shared {
    /// The state of a consumer reading `parts` as `name` (in `group`).
    pub fn new(
        topic: Topic,
        name: &str,
        group: Option<Arc<Membership>>,
        opts: ConsumerOptions,
        parts: Vec<Arc<PartSub>>,
        partitioned: bool,
    ) -> Result<Arc<Shared>> {
        let n = parts.len();
        let min_prefetch = if group.is_some() { 1 } else { 2 };
        let compression = Compression::parse(&topic.info().spec.compression);
        // An option this build cannot parse still gets its frames checked.
        let unpacker = (compression != Ok(Compression::None)).then(|| {
            Arc::new(Unpacker {
                topic: topic.name().to_string(),
                selector: opts.selector.clone(),
                broker: opts.broker.clone(),
            })
        });
        Ok(Arc::new(Shared {
            name: name.into(),
            group,
            policy: Arc::new(topic.policy()?),
            topic,
            // A group member may hold as little as one event (credit goes
            // back after each pull); a named consumer streams at least two.
            opts: ConsumerOptions {
                prefetch: opts.prefetch.max(min_prefetch),
                ..opts
            },
            parts: RwLock::new(parts),
            tasks: Mutex::new(Vec::new()),
            assigned: Mutex::new(Vec::new()),
            budget: DataBudget::default(),
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                epoch: 0,
                ended: vec![false; n],
                dead: vec![false; n],
                partitioned,
                taken: vec![0; n],
                wakers: Vec::new(),
            }),
            cond: Condvar::new(),
            unpacker,
        }))
    }

    pub fn part(&self, slot: usize) -> Arc<PartSub> {
        self.parts.read()[slot].clone()
    }

    /// Queues an item unless a seek started a new epoch meanwhile.
    pub fn deliver(&self, epoch: u64, item: Item) -> bool {
        let mut q = self.queue.lock();
        if q.epoch != epoch {
            return false;
        }
        if let Item::Events(slot, _) | Item::End(slot) = &item {
            if q.dead.get(*slot as usize).copied().unwrap_or(false) {
                return false;
            }
        }
        q.items.push_back(item);
        let wakers = std::mem::take(&mut q.wakers);
        drop(q);
        self.cond.notify_all();
        wakers.into_iter().for_each(Waker::wake);
        true
    }

    /// Drops every queued item (for a seek) and starts a new epoch, which
    /// items of the old position can no longer enter; returns it.
    pub fn reset_queue(&self) -> u64 {
        let mut q = self.queue.lock();
        q.epoch += 1;
        let held: u64 = q
            .items
            .iter()
            .map(|i| match i {
                Item::Events(_, evs) => evs.iter().map(|e| e.fetched_len()).sum(),
                _ => 0,
            })
            .sum();
        self.budget.release(held);
        q.items.clear();
        q.ended.iter_mut().for_each(|e| *e = false);
        q.dead.iter_mut().for_each(|d| *d = false);
        q.taken.iter_mut().for_each(|t| *t = 0);
        q.epoch
    }

    pub fn epoch(&self) -> u64 {
        self.queue.lock().epoch
    }

    /// Adds a partition slot; returns its index and the current epoch.
    pub fn add_part(&self, sub: Arc<PartSub>) -> (usize, u64) {
        let mut parts = self.parts.write();
        parts.push(sub);
        let mut q = self.queue.lock();
        q.ended.push(false);
        q.taken.push(0);
        q.dead.push(false);
        (parts.len() - 1, q.epoch)
    }

    /// Partitioned groups: stops reading slot `slot` (its partition was
    /// revoked), drops its queued events, and waits for its commit in
    /// flight, so the next holder starts where this one's acks ended.
    /// False if the listener was not told of the partition yet (its
    /// `Assigned` marker was still queued, and now no longer names it).
    pub async fn revoke(&self, slot: usize) -> bool {
        let sub = self.part(slot);
        if let Some(t) = sub.task.lock().take() {
            t.abort();
        }
        sub.unsubscribe();
        let announced = {
            let mut q = self.queue.lock();
            q.dead[slot] = true;
            let mut freed = 0;
            let mut announced = true;
            q.items.retain_mut(|i| match i {
                Item::Events(s, evs) if *s as usize == slot => {
                    freed += evs.iter().map(|e| e.fetched_len()).sum::<u64>();
                    false
                }
                Item::End(s) => *s as usize != slot,
                Item::Assigned(ps) if ps.contains(&sub.partition) => {
                    announced = false;
                    ps.retain(|p| *p != sub.partition);
                    !ps.is_empty()
                }
                _ => true,
            });
            q.taken[slot] = 0;
            self.budget.release(freed);
            announced
        };
        if let AckTarget::Offsets(a) = &sub.acks {
            a.settle(Duration::from_secs(10)).await;
        }
        announced
    }

    /// Queues a marker item (listener calls, the group's end).
    pub fn mark(&self, item: Item) {
        let epoch = self.epoch();
        self.deliver(epoch, item);
    }

    /// Queues a marker ahead of everything queued: the next pull runs it.
    pub fn mark_first(&self, item: Item) {
        let mut q = self.queue.lock();
        q.items.push_front(item);
        let wakers = std::mem::take(&mut q.wakers);
        drop(q);
        self.cond.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }
}

pub struct Consumer {
    shared: Arc<Shared>,
    refresher: Mutex<Option<JoinHandle<()>>>,
    /// A backend's reader that fills the same queue instead of the
    /// native partition subscriptions (the Kafka backend's).
    feed: Option<Box<dyn Feed>>,
}

impl Consumer {
    pub(crate) fn new(topic: Topic, name: &str, opts: ConsumerOptions) -> Result<Consumer> {
        Self::with_group(topic, name, opts, None)
    }

    /// A consumer reading as `name`, or as a member of `group` (then `name`
    /// is the group's name).
    pub(crate) fn with_group(
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        group: Option<Arc<Membership>>,
    ) -> Result<Consumer> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "a consumer needs a non-empty name".into(),
            ));
        }
        let backend = topic.driver.inner.backend.clone();
        backend.consumer(topic, name, opts, group)
    }

    /// A consumer of Strom servers' partitions (the native backend's).
    pub(crate) fn native(
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        group: Option<Arc<Membership>>,
    ) -> Result<Consumer> {
        let info = topic.refresh_blocking()?;
        let partitioned = group.as_ref().is_some_and(|g| !g.is_shared());
        let follow_new = opts.partitions.is_none() && !partitioned;
        let partitions = match &opts.partitions {
            // A partitioned group's member starts with nothing and follows
            // its assignment.
            _ if partitioned => Vec::new(),
            Some(p) => p.clone(),
            None => (0..info.partitions.len() as u32).collect(),
        };
        let mut parts = Vec::new();
        for &p in &partitions {
            let pi = info.partitions.get(p as usize).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "topic '{}' has {} partitions; {p} does not exist",
                    topic.name(),
                    info.partitions.len()
                ))
            })?;
            parts.push(PartSub::new(
                &topic,
                name,
                group.as_deref(),
                p,
                pi.member,
                pi.addr.clone(),
            ));
        }
        let shared = Shared::new(topic, name, group, opts, parts, partitioned)?;
        let c = Consumer {
            shared,
            refresher: Mutex::new(None),
            feed: None,
        };
        c.start(c.shared.opts.start, 0)?;
        if follow_new {
            let refresh = refresh_loop(Arc::downgrade(&c.shared));
            *c.refresher.lock() = Some(c.handle().spawn(refresh));
        }
        if partitioned {
            let follow = crate::partitioned::follow(Arc::downgrade(&c.shared));
            *c.refresher.lock() = Some(c.handle().spawn(follow));
        }
        Ok(c)
    }

    /// A consumer whose queue `feed` fills (only the Kafka backend feeds
    /// one today).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn fed(shared: Arc<Shared>, feed: Box<dyn Feed>) -> Consumer {
        Consumer {
            shared,
            refresher: Mutex::new(None),
            feed: Some(feed),
        }
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        &self.shared.topic.driver.inner.handle
    }

    /// Subscribes every partition at `start` and waits until the servers
    /// confirmed where each subscription begins (or a partition's server
    /// turned out to be unreachable, which it keeps retrying).
    fn start(&self, start: StartPos, epoch: u64) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let n = self.shared.parts.read().len();
        let mut tasks = self.shared.tasks.lock();
        for i in 0..n {
            let task = run_partition(self.shared.clone(), i, start, epoch, Some(tx.clone()));
            tasks.push(self.handle().spawn(task));
        }
        drop((tasks, tx));
        for _ in 0..n {
            match rx.recv_timeout(SUBSCRIBE_TIMEOUT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::Timeout(SUBSCRIBE_TIMEOUT)),
            }
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The consumer group this consumer is a member of, if any.
    pub fn group(&self) -> Option<&str> {
        self.shared.group.as_ref().map(|g| g.spec.name.as_str())
    }

    /// The partitions this consumer reads: in a partitioned group, those
    /// assigned to it now; otherwise every partition it subscribed.
    pub fn assignment(&self) -> Vec<u32> {
        if self.shared.queue.lock().partitioned {
            return self.shared.assigned.lock().clone();
        }
        self.shared
            .parts
            .read()
            .iter()
            .map(|p| p.partition)
            .collect()
    }

    /// The member id this consumer holds in its consumer group.
    pub fn member_id(&self) -> Option<u64> {
        self.shared.group.as_ref().map(|g| g.consumer())
    }

    pub fn topic(&self) -> &Topic {
        &self.shared.topic
    }

    /// Waits for the next event or the end of the stream.
    pub fn pull(&self) -> PullFuture<'_> {
        PullFuture { consumer: self }
    }

    /// Like `pull().wait()` with a time limit.
    pub fn pull_timeout(&self, timeout: Duration) -> Result<Next> {
        self.next_blocking(Some(Instant::now() + timeout))
            .unwrap_or(Err(Error::Timeout(timeout)))
    }

    fn take(&self, q: &mut Queue) -> Option<Result<Next>> {
        loop {
            if !q.partitioned && q.ended.iter().all(|e| *e) {
                return Some(Ok(Next::EndOfStream));
            }
            match q.items.front_mut()? {
                Item::GroupEnd => return Some(Ok(Next::EndOfStream)),
                Item::Assigned(_) | Item::Revoked(_) => {
                    let listener = self.shared.group.as_ref().and_then(|g| g.listener.clone());
                    match (q.items.pop_front(), listener) {
                        (Some(Item::Assigned(ps)), Some(l)) => l.on_assigned(&ps),
                        (Some(Item::Revoked(ps)), Some(l)) => l.on_revoked(&ps),
                        _ => {}
                    }
                }
                Item::Events(slot, events) => {
                    let slot = *slot as usize;
                    let Some(ev) = events.pop_front() else {
                        q.items.pop_front();
                        continue;
                    };
                    if events.is_empty() {
                        q.items.pop_front();
                    }
                    q.taken[slot] += 1;
                    self.shared.budget.release(ev.fetched_len());
                    // A shared group's window is its unacked events: acks,
                    // not pulls, give the credit back (on the server).
                    let per_ack = self.shared.group.as_ref().is_some_and(|g| g.is_shared());
                    if !per_ack && q.taken[slot] >= (self.shared.opts.prefetch / 2).max(1) {
                        let events = std::mem::take(&mut q.taken[slot]);
                        let p = self.shared.part(slot);
                        let stream = p.stream.load(Ordering::Acquire);
                        let conn = p.conn.lock().clone();
                        if let Some(conn) = conn {
                            conn.send_oneway(&Request::Credit { stream, events });
                        }
                    }
                    return Some(Ok(Next::Event(ev)));
                }
                Item::End(slot) => {
                    let slot = *slot as usize;
                    q.ended[slot] = true;
                    q.items.pop_front();
                }
                Item::Failed(_) => {
                    if let Some(Item::Failed(e)) = q.items.pop_front() {
                        return Some(Err(e));
                    }
                }
            }
        }
    }

    /// Takes every event that has arrived, up to `max`, in one call: waits
    /// up to `timeout` for the first one, never for more. `Ok(None)` at the
    /// end of the stream (after every event was returned); an empty batch
    /// when `timeout` passed with nothing to take. An error is returned on
    /// its own, after the events queued before it.
    pub fn pull_many(&self, max: usize, timeout: Duration) -> Result<Option<Vec<Event>>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut q = self.shared.queue.lock();
        loop {
            while out.len() < max.max(1) {
                if !out.is_empty() && matches!(q.items.front(), Some(Item::Failed(_))) {
                    return Ok(Some(out));
                }
                match self.take(&mut q) {
                    Some(Ok(Next::Event(e))) => out.push(e),
                    Some(Ok(Next::EndOfStream)) if out.is_empty() => return Ok(None),
                    Some(Ok(Next::EndOfStream)) | None => break,
                    Some(Err(e)) => return Err(e),
                }
            }
            if !out.is_empty() || self.shared.cond.wait_until(&mut q, deadline).timed_out() {
                // One last look after the deadline, then whatever there is.
                if out.is_empty() {
                    match self.take(&mut q) {
                        Some(Ok(Next::Event(e))) => out.push(e),
                        Some(Ok(Next::EndOfStream)) => return Ok(None),
                        Some(Err(e)) => return Err(e),
                        None => {}
                    }
                    if !out.is_empty() {
                        continue;
                    }
                }
                return Ok(Some(out));
            }
        }
    }

    fn next_blocking(&self, deadline: Option<Instant>) -> Option<Result<Next>> {
        let spin = self.shared.opts.spin;
        if !spin.is_zero() {
            let left = deadline.map_or(spin, |d| d.saturating_duration_since(Instant::now()));
            let until = Instant::now() + spin.min(left);
            loop {
                if let Some(r) = self.take(&mut self.shared.queue.lock()) {
                    return Some(r);
                }
                if Instant::now() >= until {
                    break;
                }
                // No sched_yield: it would hand the CPU to any background
                // process for a whole time slice. A thread woken to
                // deliver the event preempts a spinner anyway.
                std::hint::spin_loop();
            }
        }
        let mut q = self.shared.queue.lock();
        loop {
            if let Some(r) = self.take(&mut q) {
                return Some(r);
            }
            match deadline {
                None => self.shared.cond.wait(&mut q),
                Some(d) => {
                    if self.shared.cond.wait_until(&mut q, d).timed_out() {
                        return self.take(&mut q);
                    }
                }
            }
        }
    }

    fn stop_partitions(&self) {
        for t in self.shared.tasks.lock().drain(..) {
            t.abort();
        }
        for p in self.shared.parts.read().iter() {
            p.unsubscribe();
        }
    }

    /// Moves every partition to `pos` (offset, timestamp, beginning, end,
    /// or back to the committed offsets). Queued events are dropped.
    pub fn seek(&self, pos: StartPos) -> Result<()> {
        if self.shared.group.as_ref().is_some_and(|g| g.is_shared()) {
            return Err(Error::InvalidArgument(
                "a shared consumer group has no position to seek: the group hands out what is not acked yet".into(),
            ));
        }
        if self.shared.queue.lock().partitioned {
            return Err(Error::InvalidArgument(
                "seek is not available to members of a partitioned consumer group yet".into(),
            ));
        }
        if let Some(f) = &self.feed {
            return f.reposition(pos, &|| self.shared.reset_queue());
        }
        self.stop_partitions();
        let epoch = self.shared.reset_queue();
        self.start(pos, epoch)
    }

    /// Runs the MPI-stream style loop: `on_start` once, `on_event` for every
    /// event until the end of the stream, then `on_end` once.
    pub fn process(
        &self,
        on_start: impl FnOnce(),
        mut on_event: impl FnMut(Event) -> Result<()>,
        on_end: impl FnOnce(),
    ) -> Result<()> {
        on_start();
        while let Next::Event(e) = self.pull().wait()? {
            on_event(e)?;
        }
        on_end();
        Ok(())
    }
}

impl Iterator for &Consumer {
    type Item = Result<Event>;
    fn next(&mut self) -> Option<Result<Event>> {
        match self.pull().wait() {
            Ok(Next::Event(e)) => Some(Ok(e)),
            Ok(Next::EndOfStream) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(r) = self.refresher.lock().take() {
            r.abort();
        }
        self.stop_partitions();
        if let Some(g) = &self.shared.group {
            g.leave();
        }
    }
}

/// Resolves to the next event or end of stream; `.wait()` or `.await`.
pub struct PullFuture<'a> {
    consumer: &'a Consumer,
}

impl PullFuture<'_> {
    pub fn wait(self) -> Result<Next> {
        self.consumer
            .next_blocking(None)
            .unwrap_or(Err(Error::Closed("consumer")))
    }
}

impl std::future::Future for PullFuture<'_> {
    type Output = Result<Next>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Next>> {
        let mut q = self.consumer.shared.queue.lock();
        match self.consumer.take(&mut q) {
            Some(r) => Poll::Ready(r),
            None => {
                q.wakers.push(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
