//! A consumer's state, shared by the tasks that fill it and the threads
//! that pull from it: the queue of delivered items, the subscribed
//! partitions (`PartSub`) with their acks, the data budget, and the
//! topic's decoder. Every backend's consumer fills the same queue (the
//! native subscriptions in `subscription.rs` and `partitioned.rs`, the
//! Kafka backend's reader); `queue.rs` takes from it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use strom_proto::{Compression, Request};
use tokio::task::JoinHandle;

use crate::acks::PartitionAcks;
use crate::conn::ClientConn;
use crate::consumer_options::ConsumerOptions;
use crate::data::{DataBudget, PolicyHandle};
use crate::error::{Error, Result};
use crate::event::{AckFuture, AckSource, Event, EventAcks};
use crate::membership::Membership;
use crate::share::ShareAcks;
use crate::topic::{Owner, Topic};
use crate::unpack::Unpacker;

/// Where a subscribed partition's acks go.
#[derive(Clone)]
pub(crate) enum AckTarget {
    /// Cumulative: the partition's committed offset of a consumer name.
    Offsets(Arc<PartitionAcks>),
    /// One by one: a shared group's acks of the partition.
    Share(Arc<ShareAcks>),
    /// Cumulative: offsets another backend commits (the Kafka group's
    /// committed offset of the partition).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    Committed(Arc<dyn EventAcks>),
}

impl AckTarget {
    /// Where the acks of the partition's events go.
    pub fn for_events(&self) -> Arc<dyn EventAcks> {
        match self {
            AckTarget::Offsets(a) => a.clone(),
            AckTarget::Share(s) => s.clone(),
            AckTarget::Committed(c) => c.clone(),
        }
    }

    /// A handle on it for one batch of events (see [`PolicyHandle`]: the
    /// same reason).
    pub fn for_batch(&self) -> Arc<dyn EventAcks> {
        Arc::new(BatchAcks(self.for_events()))
    }
}

/// A batch's handle on its partition's acks target.
struct BatchAcks(Arc<dyn EventAcks>);

impl AckSource for BatchAcks {
    fn poll_ticket(&self, t: u64, waker: Option<&Waker>) -> Option<Result<()>> {
        self.0.poll_ticket(t, waker)
    }
    fn wait_ticket(&self, t: u64, deadline: Option<std::time::Instant>) -> Option<Result<()>> {
        self.0.wait_ticket(t, deadline)
    }
}

impl EventAcks for BatchAcks {
    fn ack_event(self: Arc<Self>, offset: u64) -> AckFuture {
        self.0.clone().ack_event(offset)
    }
    fn nack_event(self: Arc<Self>, offset: u64) -> AckFuture {
        self.0.clone().nack_event(offset)
    }
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
    pub items: VecDeque<Item>,
    pub epoch: u64,
    pub ended: Vec<bool>,
    /// Slots whose partition was revoked: their events are dropped.
    pub dead: Vec<bool>,
    /// A partitioned group's member: the end comes from the group.
    pub partitioned: bool,
    /// Events taken per partition since credit was last returned.
    pub taken: Vec<u32>,
    pub wakers: Vec<Waker>,
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
    pub policy: PolicyHandle,
    pub opts: ConsumerOptions,
    /// Grows when partitions are added (if the consumer follows all).
    pub parts: RwLock<Vec<Arc<PartSub>>>,
    pub tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Partitioned groups: the partitions held now.
    pub assigned: Mutex<Vec<u32>>,
    pub budget: DataBudget,
    /// Data requests on the wire: while one is, the next event comes from
    /// the runtime (which reads the answer), so a pull waits for it there
    /// instead of reading the connection itself.
    pub fetching: std::sync::atomic::AtomicUsize,
    pub queue: Mutex<Queue>,
    pub cond: Condvar,
    /// Rung with the condvar, for a pull that waits reading its
    /// connection itself ([`ConsumerOptions::read_on_pull`]).
    pub bell: Option<Arc<strom_net::Bell>>,
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
            policy: PolicyHandle::new(Arc::new(topic.policy()?)),
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
            fetching: Default::default(),
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
            // No bell (no descriptor left): pulls wait on the condvar.
            bell: strom_net::Bell::new().ok().map(Arc::new),
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
        self.wake_pullers(wakers);
        true
    }

    /// Wakes every pull waiting for the queue: on the condvar, reading a
    /// connection (the bell), or as a future.
    fn wake_pullers(&self, wakers: Vec<Waker>) {
        self.cond.notify_all();
        if let Some(b) = &self.bell {
            b.ring();
        }
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The one connection every partition is read on, if there is one.
    pub fn single_conn(&self) -> Option<Arc<ClientConn>> {
        let parts = self.parts.read();
        let mut one: Option<Arc<ClientConn>> = None;
        for p in parts.iter() {
            let c = p.conn.lock().clone()?;
            match &one {
                Some(o) if !Arc::ptr_eq(o, &c) => return None,
                Some(_) => {}
                None => one = Some(c),
            }
        }
        one
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
        self.wake_pullers(wakers);
    }
}
