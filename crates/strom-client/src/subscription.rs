//! One partition's subscription, as a task on the driver's runtime: it
//! subscribes at the owner, receives metadata batches pushed ahead of
//! demand, runs the data selector and broker for a whole batch, fetches the
//! batch's selected bytes with one request straight into the broker's
//! buffers, and queues the events. When the owner is unreachable it reports
//! one error naming the member and partition, then retries (following the
//! owner to a new address) and resumes exactly where it stopped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strom_proto::{BatchView, ErrorCode, EventEntry, Push, Request, Response, Run, StartPos};
use tokio::sync::mpsc;

use crate::consumer::state::{Item, PartSub, Shared};
use crate::data::{DataBuffer, EventMeta, PolicyHandle};
use crate::error::{unexpected, Error, Result};
use crate::event::{Event, EventAcks};
use crate::fetch::{start_fetch, InFlight};
use crate::owner::{follow_move, is_unreachable, moved_away, refresh_owner, Follow};
use crate::unpack::Fetched;

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);
const RETRY: Duration = Duration::from_secs(1);

type Started = std::sync::mpsc::Sender<Result<()>>;

pub(crate) async fn run_partition(
    shared: Arc<Shared>,
    slot: usize,
    start: StartPos,
    epoch: u64,
    mut started: Option<Started>,
) {
    let sub = shared.part(slot);
    // Next offset to deliver, once known: where a retry resumes.
    let mut resume: Option<u64> = None;
    let mut reported = false;
    loop {
        let from = resume.map_or(start, StartPos::Offset);
        let result =
            subscribe_and_stream(&shared, &sub, slot, from, epoch, &mut started, &mut resume).await;
        let e = match result {
            Ok(()) => return,
            // A partitioned group's partition moved on: the membership
            // task hears of it from the master and gives it up.
            Err(e) if sub.fence.is_some() && e.code() == ErrorCode::FENCED => {
                tracing::debug!(partition = sub.partition, "group subscription fenced");
                return;
            }
            Err(e) => e,
        };
        let (member, addr) = {
            let o = sub.owner.lock();
            (o.member, o.addr.clone())
        };
        let e = Error::coded(
            e.code(),
            format!(
                "partition {} of topic '{}' on member {member} ({addr}): {}",
                sub.partition,
                shared.name_topic(),
                e.message()
            ),
        );
        if moved_away(&e) {
            match follow_move(&shared, &sub, epoch).await {
                Follow::Moved => continue,
                Follow::Gone => {}
                Follow::Superseded => return,
            }
        }
        let retry = is_unreachable(&e);
        // The owner may have moved (restarted elsewhere): follow it first.
        if retry && refresh_owner(&shared, &sub).await {
            continue;
        }
        if let Some(tx) = started.take() {
            if !retry {
                let _ = tx.send(Err(e));
                return;
            }
            let _ = tx.send(Ok(()));
        }
        if !retry {
            shared.deliver(epoch, Item::Failed(e));
            return;
        }
        if !reported {
            tracing::warn!(error = %e, "partition unreachable; retrying");
            reported = shared.deliver(epoch, Item::Failed(e));
        }
        tokio::time::sleep(RETRY).await;
        if shared.epoch() != epoch {
            return;
        }
        refresh_owner(&shared, &sub).await;
    }
}

impl Shared {
    fn name_topic(&self) -> &str {
        self.topic.name()
    }
}

/// State shared by a subscription's task and its push handler.
struct StreamCtx {
    shared: Arc<Shared>,
    sub: Arc<PartSub>,
    slot: usize,
    epoch: u64,
    /// Next offset to deliver.
    pos: AtomicU64,
    /// Pushes handed to the task and not handled yet (1 until subscribed).
    queued: AtomicUsize,
}

impl StreamCtx {
    /// Delivers a batch that has no data to fetch right on the reader task
    /// (one thread hand-off less) when nothing is queued ahead of it.
    fn try_inline(&self, push: &Push) -> bool {
        if let Push::Deliver { runs, meta, .. } = push {
            return self.try_inline_runs(runs, meta);
        }
        let Push::Events {
            base_offset,
            count,
            timestamp_us,
            meta,
            ..
        } = push
        else {
            return false;
        };
        if self.queued.load(Ordering::Acquire) != 0 {
            return false;
        }
        let Ok(view) = BatchView::parse(meta.clone()) else {
            return false;
        };
        let pos = self.pos.load(Ordering::Acquire);
        // A gap before the batch is reported by the stream task, in order.
        if view.data_len() != 0 || *base_offset > pos {
            return false;
        }
        let batch = self.shared.batch(&self.sub);
        let events: VecDeque<Event> = view
            .iter()
            .enumerate()
            .filter(|(i, _)| base_offset + *i as u64 >= pos)
            .map(|(i, e)| Event {
                meta: EventMeta::new(
                    self.sub.partition,
                    base_offset + i as u64,
                    *timestamp_us,
                    e.metadata,
                    batch.policy.clone(),
                ),
                data_size: 0,
                fetched: 0,
                buffers: Vec::new(),
                descriptor: e.descriptor,
                acks: batch.acks.clone(),
                deliveries: 1,
                batch_end: base_offset + *count as u64,
            })
            .collect();
        self.pos
            .fetch_max(base_offset + *count as u64, Ordering::AcqRel);
        if !events.is_empty() {
            self.shared
                .deliver(self.epoch, Item::Events(self.slot as u32, events));
        }
        true
    }

    /// The same for a shared group's delivery without data.
    fn try_inline_runs(&self, runs: &[Run], meta: &bytes::Bytes) -> bool {
        if self.queued.load(Ordering::Acquire) != 0 {
            return false;
        }
        let Ok(items) = delivered(runs, meta) else {
            return false;
        };
        if items.iter().any(|i| i.entry.data_len != 0) {
            return false;
        }
        let batch = self.shared.batch(&self.sub);
        let events: VecDeque<Event> = items
            .into_iter()
            .map(|i| batch.event(i, None, 0, Vec::new()))
            .collect();
        if !events.is_empty() {
            self.shared
                .deliver(self.epoch, Item::Events(self.slot as u32, events));
        }
        true
    }
}

/// One event as pushed: where it is stored and what it is.
pub(crate) struct Incoming {
    pub offset: u64,
    pub timestamp_us: u64,
    /// Base offset of the stored batch holding it (what `FetchData` names).
    pub batch_base: u64,
    /// The offset after that batch's last event.
    pub batch_end: u64,
    /// Its entry, with `data_pos` in the stored batch's data section.
    pub entry: EventEntry,
    pub deliveries: u32,
}

/// The events of a shared group's `Deliver` push: its section holds
/// exactly the runs' events, in run order.
fn delivered(runs: &[Run], meta: &bytes::Bytes) -> Result<Vec<Incoming>> {
    let view = BatchView::parse(meta.clone())?;
    let total: u64 = runs.iter().map(|r| u64::from(r.count)).sum();
    if total != u64::from(view.count()) {
        return Err(Error::coded(
            ErrorCode::MALFORMED_FRAME,
            format!(
                "a delivery names {total} events but carries {}",
                view.count()
            ),
        ));
    }
    let mut entries = view.iter();
    let mut out = Vec::with_capacity(total as usize);
    for r in runs {
        let mut pos = r.data_pos;
        for k in 0..u64::from(r.count) {
            let Some(mut entry) = entries.next() else {
                break;
            };
            entry.data_pos = pos;
            pos = pos.saturating_add(entry.data_len);
            out.push(Incoming {
                offset: r.offset().saturating_add(k),
                timestamp_us: r.timestamp_us,
                batch_base: r.batch_base,
                batch_end: r.offset().saturating_add(k + 1),
                entry,
                deliveries: r.deliveries,
            });
        }
    }
    Ok(out)
}

/// What the events of one batch share: handles made for them on the topic
/// policy and on the partition's acks target (see [`PolicyHandle`]).
pub(crate) struct Batch {
    partition: u32,
    policy: PolicyHandle,
    acks: Arc<dyn EventAcks>,
}

impl Shared {
    /// The handles a batch of events of partition `sub` shares.
    pub(crate) fn batch(&self, sub: &PartSub) -> Batch {
        Batch {
            partition: sub.partition,
            policy: self.policy.fresh(),
            acks: sub.acks.for_batch(),
        }
    }
}

impl Batch {
    /// The metadata of event `i`, as selectors and brokers see it.
    pub(crate) fn meta(&self, i: &Incoming) -> EventMeta {
        EventMeta::new(
            self.partition,
            i.offset,
            i.timestamp_us,
            i.entry.metadata.clone(),
            self.policy.clone(),
        )
    }

    /// Event `i` (with its `meta`, if made already), whose selected data
    /// (`fetched` bytes) is in `buffers`.
    pub(crate) fn event(
        &self,
        i: Incoming,
        meta: Option<EventMeta>,
        fetched: u64,
        buffers: Vec<Box<dyn DataBuffer>>,
    ) -> Event {
        let meta = meta.unwrap_or_else(|| {
            EventMeta::new(
                self.partition,
                i.offset,
                i.timestamp_us,
                i.entry.metadata,
                self.policy.clone(),
            )
        });
        Event {
            meta,
            data_size: i.entry.data_len,
            fetched,
            buffers,
            descriptor: i.entry.descriptor,
            acks: self.acks.clone(),
            deliveries: i.deliveries,
            batch_end: i.batch_end,
        }
    }
}

async fn subscribe_and_stream(
    shared: &Arc<Shared>,
    sub: &Arc<PartSub>,
    slot: usize,
    start: StartPos,
    epoch: u64,
    started: &mut Option<Started>,
    resume: &mut Option<u64>,
) -> Result<()> {
    let addr = sub.owner.lock().addr.clone();
    let conn = shared.topic.driver.conn(&addr).await?;
    let stream = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
    let ctx = Arc::new(StreamCtx {
        shared: shared.clone(),
        sub: sub.clone(),
        slot,
        epoch,
        pos: AtomicU64::new(0),
        queued: AtomicUsize::new(1),
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Push>();
    let handler_ctx = ctx.clone();
    conn.open_stream(
        stream,
        Box::new(move |push| {
            if !handler_ctx.try_inline(&push) {
                handler_ctx.queued.fetch_add(1, Ordering::AcqRel);
                let _ = tx.send(push);
            }
        }),
    );
    *sub.conn.lock() = Some(conn.clone());
    sub.stream.store(stream, Ordering::Release);
    let req = match &shared.group {
        Some(g) => Request::GroupSubscribe {
            stream,
            spec: g.spec.clone(),
            partition: sub.partition,
            consumer: sub.fence.map_or(g.consumer(), |(c, _)| c),
            epoch: sub.fence.map_or(0, |(_, e)| e),
            prefetch: shared.opts.prefetch,
        },
        None => Request::Subscribe {
            stream,
            topic: shared.topic.name().to_string(),
            partition: sub.partition,
            consumer: shared.name.clone(),
            start,
            prefetch: shared.opts.prefetch,
        },
    };
    let start_offset = match conn.call(&req, Vec::new()).await? {
        Response::Subscribed { start_offset } => start_offset,
        other => return Err(unexpected(other)),
    };
    ctx.pos.store(start_offset, Ordering::Release);
    if let (Some(_), crate::consumer::state::AckTarget::Offsets(a)) = (sub.fence, &sub.acks) {
        // The group committed everything before where it resumes.
        a.committed_from(start_offset);
    }
    ctx.queued.fetch_sub(1, Ordering::AcqRel);
    if let Some(tx) = started.take() {
        let _ = tx.send(Ok(()));
    }
    let result = stream_loop(&ctx, &mut rx).await;
    *resume = Some(ctx.pos.load(Ordering::Acquire));
    result
}

/// Handles the pushes the handler could not deliver inline, in order.
async fn stream_loop(ctx: &StreamCtx, rx: &mut mpsc::UnboundedReceiver<Push>) -> Result<()> {
    let (shared, sub, slot, epoch) = (&ctx.shared, &ctx.sub, ctx.slot, ctx.epoch);
    // Offsets dropped (overflow policy or retention) before this reader got
    // them, `[from, to)`, reported once, before the next events.
    let mut lost: Option<(u64, u64)> = None;
    let note_lost = |lost: &mut Option<(u64, u64)>, from: u64, to: u64| {
        if to > from {
            let from = lost.map_or(from, |(f, _)| f);
            *lost = Some((from, to));
        }
    };
    let mut next: Option<Push> = None;
    // The next batch's data request, sent while this batch's data arrives.
    let mut ahead: Option<(u64, Result<InFlight>)> = None;
    loop {
        let push = match next.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => break,
            },
        };
        match push {
            Push::Events {
                base_offset,
                count,
                timestamp_us,
                meta,
                ..
            } => {
                let pos = ctx.pos.load(Ordering::Acquire);
                let end = base_offset + count as u64;
                // The server skipped dropped events: an explicit gap.
                note_lost(&mut lost, pos, base_offset);
                let started = match ahead.take() {
                    Some((base, started)) if base == base_offset => started,
                    _ => match BatchView::parse(meta) {
                        Ok(view) => {
                            start_batch(shared, sub, pos, base_offset, timestamp_us, view).await
                        }
                        Err(e) => Err(e.into()),
                    },
                };
                if started.is_ok() {
                    if let Ok(p) = rx.try_recv() {
                        ahead = start_ahead(shared, sub, pos.max(end), &p).await;
                        next = Some(p);
                    }
                }
                let fetched = match started {
                    Ok(flight) => flight.finish().await,
                    Err(e) => Err(e),
                };
                let events = match fetched {
                    Ok(events) => events,
                    // Retention dropped the batch before its data was read:
                    // say so once, and go on with the next batch.
                    Err(e) if e.code() == ErrorCode::OFFSET_OUT_OF_RANGE => {
                        note_lost(&mut lost, pos.max(base_offset), end);
                        ctx.pos.fetch_max(end, Ordering::AcqRel);
                        ctx.queued.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    // The server found the batch's data damaged and
                    // quarantined it: an explicit gap, then the next batch.
                    Err(e) if e.code() == ErrorCode::DATA_CORRUPT => {
                        report_lost(ctx, &mut lost);
                        report_corrupt(ctx, pos.max(base_offset), end - 1);
                        ctx.pos.fetch_max(end, Ordering::AcqRel);
                        ctx.queued.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                report_lost(ctx, &mut lost);
                ctx.pos.fetch_max(end, Ordering::AcqRel);
                if !deliver_fetched(shared, epoch, slot, events) {
                    // A seek superseded this subscription; its data is dropped.
                    return Ok(());
                }
            }
            Push::Deliver { runs, meta, .. } => {
                let items = delivered(&runs, &meta)?;
                let events = match fetch_events(shared, sub, items).await {
                    Ok(events) => events,
                    // Dropped or damaged meanwhile: the owner resolves or
                    // redelivers them; nothing to hand out here.
                    Err(e)
                        if matches!(
                            e.code(),
                            ErrorCode::OFFSET_OUT_OF_RANGE | ErrorCode::DATA_CORRUPT
                        ) =>
                    {
                        tracing::warn!(error = %e, "delivered events could not be fetched");
                        ctx.queued.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if !deliver_fetched(shared, epoch, slot, events) {
                    return Ok(());
                }
            }
            Push::ConsumerAssignment { .. } => {}
            Push::EndOfStream { end_offset, .. } => {
                // A shared group's stream has no position of its own.
                if !shared.group.as_ref().is_some_and(|g| g.is_shared()) {
                    note_lost(&mut lost, ctx.pos.load(Ordering::Acquire), end_offset);
                }
                report_lost(ctx, &mut lost);
                sub.end.store(end_offset, Ordering::Release);
                shared.deliver(epoch, Item::End(slot as u32));
                return Ok(());
            }
            Push::StreamError { code, message } => return Err(Error::Coded { code, message }),
            Push::Gap { first, last, .. } => {
                note_lost(&mut lost, ctx.pos.load(Ordering::Acquire), first);
                report_lost(ctx, &mut lost);
                report_corrupt(ctx, first, last);
                ctx.pos.fetch_max(last.saturating_add(1), Ordering::AcqRel);
            }
        }
        ctx.queued.fetch_sub(1, Ordering::AcqRel);
    }
    Err(Error::coded(
        ErrorCode::CONNECTION_CLOSED,
        "the connection to the server was lost",
    ))
}

/// Queues a batch's fetched events, with an error in the place of each
/// event whose data could not be decoded (compressed topics), so the reader
/// carries on after it. False if a seek superseded the subscription (or
/// its partition was revoked): what was not queued gives its data back.
fn deliver_fetched(shared: &Shared, epoch: u64, slot: usize, fetched: Fetched) -> bool {
    let mut items = Vec::new();
    // Sized once: grown event by event, a fetch of hundreds of events cost
    // a chain of reallocations (copies, and fresh pages, as the consumer's
    // thread frees the queue).
    let mut run = VecDeque::with_capacity(fetched.len());
    for r in fetched {
        match r {
            Ok(ev) => run.push_back(ev),
            Err(e) => {
                if !run.is_empty() {
                    items.push(Item::Events(slot as u32, std::mem::take(&mut run)));
                }
                items.push(Item::Failed(e));
            }
        }
    }
    if !run.is_empty() {
        items.push(Item::Events(slot as u32, run));
    }
    let held = |i: &Item| match i {
        Item::Events(_, evs) => evs.iter().map(|e| e.fetched_len()).sum(),
        _ => 0,
    };
    let mut items = items.into_iter();
    while let Some(item) = items.next() {
        let bytes: u64 = held(&item);
        if !shared.deliver(epoch, item) {
            shared
                .budget
                .release(bytes + items.map(|i| held(&i)).sum::<u64>());
            return false;
        }
    }
    true
}

fn report_lost(ctx: &StreamCtx, lost: &mut Option<(u64, u64)>) {
    if let Some((from, to)) = lost.take() {
        tracing::warn!(topic = %ctx.shared.topic.name(), partition = ctx.sub.partition, first = from, last = to - 1, "events dropped before this reader got them");
        let e = Error::DataExpired {
            topic: ctx.shared.topic.name().to_string(),
            partition: ctx.sub.partition,
            first: from,
            last: to - 1,
        };
        ctx.shared.deliver(ctx.epoch, Item::Failed(e));
    }
}

fn report_corrupt(ctx: &StreamCtx, first: u64, last: u64) {
    tracing::warn!(topic = %ctx.shared.topic.name(), partition = ctx.sub.partition, first, last, "events damaged on disk were skipped");
    let e = Error::DataCorrupt {
        topic: ctx.shared.topic.name().to_string(),
        partition: ctx.sub.partition,
        first,
        last,
    };
    ctx.shared.deliver(ctx.epoch, Item::Failed(e));
}

/// Sends the data request of `next` ahead of time, when it is a batch
/// with data and its data fits the consumer's budget besides what is held
/// (so it never waits for the batch before it to be pulled).
async fn start_ahead(
    shared: &Arc<Shared>,
    sub: &Arc<PartSub>,
    pos: u64,
    next: &Push,
) -> Option<(u64, Result<InFlight>)> {
    let Push::Events {
        base_offset,
        timestamp_us,
        meta,
        ..
    } = next
    else {
        return None;
    };
    let view = BatchView::parse(meta.clone()).ok()?;
    let most = view.data_len();
    if most == 0 || !shared.budget.fits(most, shared.opts.prefetch_bytes) {
        return None;
    }
    let started = start_batch(shared, sub, pos, *base_offset, *timestamp_us, view).await;
    Some((*base_offset, started))
}

/// Sends the data request of one pushed batch (its events at or after
/// `pos`); [`InFlight::finish`] then waits for the data.
async fn start_batch(
    shared: &Arc<Shared>,
    sub: &Arc<PartSub>,
    pos: u64,
    base: u64,
    timestamp_us: u64,
    view: BatchView,
) -> Result<InFlight> {
    let items = view
        .iter()
        .enumerate()
        .map(|(i, entry)| Incoming {
            offset: base + i as u64,
            timestamp_us,
            batch_base: base,
            batch_end: base + u64::from(view.count()),
            entry,
            deliveries: 1,
        })
        .filter(|i| i.offset >= pos)
        .collect();
    start_fetch(shared, sub, items).await
}

/// Selection and buffers per event, then one data request for them all.
async fn fetch_events(
    shared: &Arc<Shared>,
    sub: &Arc<PartSub>,
    items: Vec<Incoming>,
) -> Result<Fetched> {
    start_fetch(shared, sub, items).await?.finish().await
}
