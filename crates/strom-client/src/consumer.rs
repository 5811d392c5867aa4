//! The consumer: one subscription stream per partition, driven by tasks on
//! the driver's runtime. Each task receives metadata batches pushed ahead of
//! demand, runs the data selector and broker for the whole batch, fetches
//! the selected bytes of the batch with one request straight into the
//! broker's buffers, and queues the events. `pull` takes from that queue and
//! returns credit to the server in chunks, which bounds the prefetch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strom_policy::TopicPolicy;
use strom_proto::{BatchView, ErrorCode, Push, Request, Response, Selection, StartPos};
use tokio::task::JoinHandle;

use crate::conn::ClientConn;
use crate::data::{
    plan_fill, DataBroker, DataBuffer, DataDescriptor, DataSelector, EventMeta, VecBroker,
};
use crate::driver::unexpected;
use crate::error::{Error, Result};
use crate::event::{Event, PartitionAcks};
use crate::topic::Topic;

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

type Started = std::sync::mpsc::Sender<Result<()>>;

#[derive(Clone)]
pub struct ConsumerOptions {
    /// Partitions to read; `None` means all.
    pub partitions: Option<Vec<u32>>,
    /// Events per partition the server may push ahead of demand.
    pub prefetch: u32,
    /// Where to start; `Committed` resumes after the name's last ack.
    pub start: StartPos,
    pub selector: Arc<dyn DataSelector>,
    pub broker: Arc<dyn DataBroker>,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            partitions: None,
            prefetch: 4096,
            start: StartPos::Committed,
            selector: Arc::new(Selection::All),
            broker: Arc::new(VecBroker),
        }
    }
}

/// What `pull` yields: an event, or the end of the stream.
pub enum Next {
    Event(Event),
    EndOfStream,
}

enum Item {
    Events(u32, VecDeque<Event>),
    End(u32),
    Failed(Error),
}

struct Queue {
    items: VecDeque<(u64, Item)>,
    epoch: u64,
    ended: Vec<bool>,
    /// Events taken per partition since credit was last returned.
    taken: Vec<u32>,
    wakers: Vec<Waker>,
}

struct PartSub {
    partition: u32,
    conn: Arc<ClientConn>,
    acks: Arc<PartitionAcks>,
    stream: AtomicU64,
}

struct Shared {
    topic: String,
    name: String,
    policy: Arc<TopicPolicy>,
    opts: ConsumerOptions,
    parts: Vec<PartSub>,
    queue: Mutex<Queue>,
    cond: Condvar,
}

pub struct Consumer {
    topic: Topic,
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Consumer {
    pub(crate) fn new(topic: Topic, name: &str, opts: ConsumerOptions) -> Result<Consumer> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "a consumer needs a non-empty name".into(),
            ));
        }
        let info = topic.info();
        let all: Vec<u32> = (0..info.partitions.len() as u32).collect();
        let partitions = opts.partitions.clone().unwrap_or(all);
        for &p in &partitions {
            if p as usize >= info.partitions.len() {
                return Err(Error::InvalidArgument(format!(
                    "topic '{}' has {} partitions; {p} does not exist",
                    topic.name(),
                    info.partitions.len()
                )));
            }
        }
        let d = topic.driver.clone();
        let addrs: Vec<String> = partitions
            .iter()
            .map(|&p| info.partitions[p as usize].addr.clone())
            .collect();
        let conns = topic.driver.block_on(async move {
            let mut v = Vec::new();
            for a in &addrs {
                v.push(d.conn(a).await?);
            }
            Ok::<_, Error>(v)
        })?;
        let handle = topic.driver.inner.handle.clone();
        let parts = partitions
            .iter()
            .zip(conns)
            .map(|(&partition, conn)| PartSub {
                partition,
                acks: PartitionAcks::new(
                    topic.name().into(),
                    partition,
                    name.into(),
                    conn.clone(),
                    handle.clone(),
                ),
                conn,
                stream: AtomicU64::new(0),
            })
            .collect::<Vec<_>>();
        let n = parts.len();
        let shared = Arc::new(Shared {
            topic: topic.name().into(),
            name: name.into(),
            policy: Arc::new(topic.policy()?),
            opts: ConsumerOptions {
                prefetch: opts.prefetch.max(2),
                ..opts
            },
            parts,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                epoch: 0,
                ended: vec![false; n],
                taken: vec![0; n],
                wakers: Vec::new(),
            }),
            cond: Condvar::new(),
        });
        let c = Consumer {
            topic,
            shared,
            tasks: Mutex::new(Vec::new()),
        };
        c.start(c.shared.opts.start, 0)?;
        Ok(c)
    }

    /// Subscribes every partition at `start` and waits until the servers
    /// confirmed where each subscription begins.
    fn start(&self, start: StartPos, epoch: u64) -> Result<()> {
        let handle = &self.topic.driver.inner.handle;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut tasks = self.tasks.lock();
        for i in 0..self.shared.parts.len() {
            tasks.push(handle.spawn(run_partition(
                self.shared.clone(),
                i,
                start,
                epoch,
                tx.clone(),
            )));
        }
        drop((tasks, tx));
        for _ in 0..self.shared.parts.len() {
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

    pub fn topic(&self) -> &Topic {
        &self.topic
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
            if q.ended.iter().all(|e| *e) {
                return Some(Ok(Next::EndOfStream));
            }
            let (_, item) = q.items.front_mut()?;
            match item {
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
                    if q.taken[slot] >= self.shared.opts.prefetch / 2 {
                        let events = std::mem::take(&mut q.taken[slot]);
                        let p = &self.shared.parts[slot];
                        let stream = p.stream.load(Ordering::Acquire);
                        p.conn.send_oneway(&Request::Credit { stream, events });
                    }
                    return Some(Ok(Next::Event(ev)));
                }
                Item::End(slot) => {
                    q.ended[*slot as usize] = true;
                    q.items.pop_front();
                }
                Item::Failed(e) => {
                    let e = e.shared();
                    q.items.pop_front();
                    return Some(Err(e));
                }
            }
        }
    }

    fn next_blocking(&self, deadline: Option<Instant>) -> Option<Result<Next>> {
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

    /// Moves every partition to `pos` (offset, timestamp, beginning, end,
    /// or back to the committed offsets). Queued events are dropped.
    pub fn seek(&self, pos: StartPos) -> Result<()> {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        let epoch = {
            let mut q = self.shared.queue.lock();
            q.epoch += 1;
            q.items.clear();
            q.ended.iter_mut().for_each(|e| *e = false);
            q.taken.iter_mut().for_each(|t| *t = 0);
            q.epoch
        };
        for p in &self.shared.parts {
            let stream = p.stream.swap(0, Ordering::AcqRel);
            if stream != 0 {
                p.conn.close_stream(stream);
                p.conn.send_oneway(&Request::Unsubscribe { stream });
            }
        }
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
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        for p in &self.shared.parts {
            let stream = p.stream.swap(0, Ordering::AcqRel);
            if stream != 0 {
                p.conn.close_stream(stream);
                p.conn.send_oneway(&Request::Unsubscribe { stream });
            }
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

impl Shared {
    /// Queues an item unless a seek started a new epoch meanwhile.
    fn deliver(&self, epoch: u64, item: Item) -> bool {
        let mut q = self.queue.lock();
        if q.epoch != epoch {
            return false;
        }
        q.items.push_back((epoch, item));
        let wakers = std::mem::take(&mut q.wakers);
        drop(q);
        self.cond.notify_all();
        wakers.into_iter().for_each(Waker::wake);
        true
    }
}

async fn run_partition(
    shared: Arc<Shared>,
    slot: usize,
    start: StartPos,
    epoch: u64,
    started: Started,
) {
    let mut started = Some(started);
    if let Err(e) = stream_partition(&shared, slot, start, epoch, &mut started).await {
        match started.take() {
            Some(tx) => {
                let _ = tx.send(Err(e));
            }
            None => {
                shared.deliver(epoch, Item::Failed(e));
            }
        }
    }
}

async fn stream_partition(
    shared: &Arc<Shared>,
    slot: usize,
    start: StartPos,
    epoch: u64,
    started: &mut Option<Started>,
) -> Result<()> {
    let sub = &shared.parts[slot];
    let stream = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
    let mut rx = sub.conn.open_stream(stream);
    sub.stream.store(stream, Ordering::Release);
    let req = Request::Subscribe {
        stream,
        topic: shared.topic.clone(),
        partition: sub.partition,
        consumer: shared.name.clone(),
        start,
        prefetch: shared.opts.prefetch,
    };
    let mut pos = match sub.conn.call(&req, Vec::new()).await? {
        Response::Subscribed { start_offset } => start_offset,
        other => return Err(unexpected(other)),
    };
    if let Some(tx) = started.take() {
        let _ = tx.send(Ok(()));
    }
    while let Some(push) = rx.recv().await {
        match push {
            Push::Events {
                base_offset,
                count,
                timestamp_us,
                meta,
                ..
            } => {
                let events =
                    fetch_batch(shared, slot, pos, base_offset, timestamp_us, meta).await?;
                pos = pos.max(base_offset + count as u64);
                if !events.is_empty() && !shared.deliver(epoch, Item::Events(slot as u32, events)) {
                    return Ok(());
                }
            }
            Push::EndOfStream { .. } => {
                shared.deliver(epoch, Item::End(slot as u32));
                return Ok(());
            }
            Push::StreamError { code, message } => return Err(Error::Coded { code, message }),
        }
    }
    Err(Error::coded(
        ErrorCode::CONNECTION_CLOSED,
        format!(
            "lost the connection to server {} serving {}/{}",
            sub.conn.addr, shared.topic, sub.partition
        ),
    ))
}

/// Turns one pushed batch into events: selection and buffers per event,
/// then one data request for the whole batch.
async fn fetch_batch(
    shared: &Arc<Shared>,
    slot: usize,
    pos: u64,
    base: u64,
    timestamp_us: u64,
    meta: bytes::Bytes,
) -> Result<VecDeque<Event>> {
    let sub = &shared.parts[slot];
    let view = BatchView::parse(meta)?;
    let mut events = VecDeque::with_capacity(view.count() as usize);
    let mut ranges = Vec::new();
    let mut buffers: Vec<Box<dyn DataBuffer>> = Vec::new();
    let mut plan = Vec::new();
    let mut owned = Vec::with_capacity(view.count() as usize);
    for (i, e) in view.iter().enumerate() {
        let offset = base + i as u64;
        if offset < pos {
            continue;
        }
        let em = EventMeta::new(
            sub.partition,
            offset,
            timestamp_us,
            e.metadata,
            shared.policy.clone(),
        );
        let mut fetched = 0;
        let first = buffers.len();
        if e.data_len > 0 {
            let desc = DataDescriptor {
                size: e.data_len,
                descriptor: e.descriptor.clone(),
            };
            let sel = shared.opts.selector.select(&em, &desc);
            let rs = sel.resolve(e.data_len).map_err(Error::Selector)?;
            fetched = rs.iter().map(|r| r.1).sum();
            if fetched > 0 {
                let bufs = shared
                    .opts
                    .broker
                    .buffers(&em, &sel, fetched)
                    .map_err(Error::Broker)?;
                plan_fill(&bufs, first, fetched, &mut plan)?;
                buffers.extend(bufs);
                ranges.extend(rs.iter().map(|&(o, l)| (e.data_pos + o, l)));
            }
        }
        owned.push(buffers.len() - first);
        events.push_back(Event {
            meta: em,
            data_size: e.data_len,
            fetched,
            buffers: Vec::new(),
            descriptor: e.descriptor,
            acks: sub.acks.clone(),
        });
    }
    if !ranges.is_empty() {
        let req = Request::FetchData {
            topic: shared.topic.clone(),
            partition: sub.partition,
            items: vec![(base, ranges)],
        };
        let (resp, filled) = sub.conn.call_into(&req, Vec::new(), buffers, plan).await?;
        if !matches!(resp, Response::Data { .. }) {
            return Err(unexpected(resp));
        }
        let mut filled = filled.into_iter();
        for (ev, n) in events.iter_mut().zip(owned) {
            ev.buffers = filled.by_ref().take(n).collect();
        }
    }
    Ok(events)
}
