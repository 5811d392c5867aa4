//! A consumer's data fetch for one batch of pushed events: the selector
//! and broker run for each event, then one `FetchData` request carries
//! every selected range, and its answer is read straight into the
//! buffers. Parts smaller than the broker's
//! [`carve_below`](crate::DataBroker::carve_below) share chunks: one
//! allocation for many events, each holding its own [`ChunkPart`] of one,
//! instead of a buffer per event from the broker.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use strom_proto::message::DataItem;
use strom_proto::{ErrorCode, Request, Response, Selection};

use crate::conn::ResponseWaiter;
use crate::consumer::state::{PartSub, Shared};
use crate::data::{plan_fill, ChunkPart, DataBuffer, DataDescriptor, EventMeta};
use crate::error::{unexpected, Error, Result};
use crate::event::Event;
use crate::subscription::{Batch, Incoming};
use crate::unpack::{Fetched, Unpacker};

/// The most bytes of small parts one chunk holds: what one event that is
/// kept can keep alive of its neighbours' memory.
const CHUNK_MOST: usize = 64 << 10;
/// Each part starts at a multiple of this in its chunk (whose start the
/// allocator aligns to 16 bytes at least): a numpy array over a part is
/// aligned, as over a buffer of its own, and neighbours rarely share a
/// cache line.
const PART_ALIGN: usize = 64;

fn aligned(n: usize) -> usize {
    n.next_multiple_of(PART_ALIGN)
}

/// Where an event's fetched bytes land.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Holds {
    /// This many of the request's own buffers (after the chunks), in order.
    Own(usize),
    /// `len` bytes at `at` in chunk `chunk` (where [`layout`] put them).
    Part { chunk: usize, at: usize, len: usize },
}

/// A data request on the wire and the events its answer fills. Until
/// [`finish`](InFlight::finish) hands the events out, dropping it gives
/// back the bytes it reserved of the consumer's data budget.
pub(crate) struct InFlight {
    shared: Arc<Shared>,
    events: VecDeque<Event>,
    /// Where each event's bytes are, in order.
    holds: Vec<Holds>,
    /// Chunks at the start of the request's buffers.
    chunks: usize,
    /// Budget reserved for the answer.
    want: u64,
    waiter: Option<ResponseWaiter>,
    /// Compressed topics: the buffers hold the stored frames, which this
    /// decodes into the broker's buffers.
    unpacker: Option<Arc<Unpacker>>,
    /// Counted in the consumer's `fetching` (its request is on the wire).
    counted: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.budget.release(self.want);
        if self.counted {
            self.shared.fetching.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl InFlight {
    /// Waits for the answer and hands out the events, with their data.
    pub(crate) async fn finish(mut self) -> Result<Fetched> {
        let mut events = std::mem::take(&mut self.events);
        let Some(waiter) = self.waiter.take() else {
            return Ok(events.into_iter().map(Ok).collect());
        };
        let filled = match waiter.wait().await? {
            (Response::Data { .. }, filled) => filled,
            (other, _) => return Err(unexpected(other)),
        };
        // The held bytes are the events' now (released as they are pulled).
        self.want = 0;
        let mut filled = filled.into_iter();
        let mut chunks: Vec<(BytesMut, usize)> = filled
            .by_ref()
            .take(self.chunks)
            .map(|b| b.into_any().downcast::<ChunkPart>().map(|c| (c.0, 0)))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| internal("a chunk came back as another buffer"))?;
        for (ev, h) in events.iter_mut().zip(&self.holds) {
            ev.buffers = match *h {
                Holds::Own(n) => filled.by_ref().take(n).collect(),
                Holds::Part { chunk, at, len } => {
                    let c = chunks
                        .get_mut(chunk)
                        .ok_or_else(|| internal("no such chunk"))?;
                    vec![Box::new(carve(c, at, len)?)]
                }
            };
        }
        match self.unpacker.clone() {
            Some(u) => crate::unpack::unpack_all(&self.shared.budget, u, events).await,
            None => Ok(events.into_iter().map(Ok).collect()),
        }
    }
}

/// The `len` bytes at `at` of a chunk whose first `cut` bytes were cut
/// off already (parts are cut in order); asking for bytes behind `cut` or
/// past the end is an error.
fn carve((chunk, cut): &mut (BytesMut, usize), at: usize, len: usize) -> Result<ChunkPart> {
    let skip = at.checked_sub(*cut).filter(|s| s + len <= chunk.len());
    let skip = skip.ok_or_else(|| internal("a part outside its chunk"))?;
    bytes::Buf::advance(chunk, skip);
    *cut = at + len;
    Ok(ChunkPart(chunk.split_to(len)))
}

fn internal(what: &str) -> Error {
    Error::coded(ErrorCode::INTERNAL, format!("fetching data: {what}"))
}

/// An event's selection, once its selector ran.
struct Selected {
    meta: EventMeta,
    selection: Selection,
    /// Ranges of its data part, relative to the part.
    ranges: Vec<(u64, u64)>,
    fetched: u64,
}

/// Runs the selector on each event that has a data part (not for
/// compressed topics, whose selection follows decoding).
fn select_all(shared: &Shared, batch: &Batch, items: &[Incoming]) -> Result<Vec<Option<Selected>>> {
    items
        .iter()
        .map(|i| {
            let e = &i.entry;
            if e.data_len == 0 || shared.unpacker.is_some() {
                return Ok(None);
            }
            let meta = batch.meta(i);
            let desc = DataDescriptor {
                size: e.data_len,
                descriptor: e.descriptor.clone(),
            };
            let selection = shared
                .opts
                .selector
                .try_select(&meta, &desc)
                .map_err(Error::Selector)?;
            let ranges = selection.resolve(e.data_len).map_err(Error::Selector)?;
            let fetched = ranges.iter().map(|r| r.1).sum();
            Ok(Some(Selected {
                meta,
                selection,
                ranges,
                fetched,
            }))
        })
        .collect()
}

/// Where the small parts among `selected` go: the chunks' sizes, each at
/// most [`CHUNK_MOST`], and each item's (chunk, offset), parts at aligned
/// offsets in order, none straddling two chunks.
fn layout(selected: &[Option<Selected>], below: u64) -> (Vec<usize>, Vec<Option<(usize, usize)>>) {
    let mut sizes = Vec::new();
    let mut cur = 0usize;
    let places = selected
        .iter()
        .map(|s| {
            let len = s.as_ref().map_or(0, |s| s.fetched);
            if len == 0 || len >= below {
                return None;
            }
            let len = len as usize;
            let mut at = aligned(cur);
            if cur > 0 && at + len > CHUNK_MOST {
                sizes.push(cur);
                at = 0;
            }
            cur = at + len;
            Some((sizes.len(), at))
        })
        .collect();
    if cur > 0 {
        sizes.push(cur);
    }
    (sizes, places)
}

/// The request being built: buffers, where the answer's bytes go in them,
/// and which ranges of which stored batches it asks for.
struct Building {
    buffers: Vec<Box<dyn DataBuffer>>,
    plan: Vec<(usize, usize, usize)>,
    wanted: Vec<DataItem>,
}

impl Building {
    fn want(&mut self, batch: u64, ranges: impl Iterator<Item = (u64, u64)>) {
        match self.wanted.last_mut() {
            Some((base, r)) if *base == batch => r.extend(ranges),
            _ => self.wanted.push((batch, ranges.collect())),
        }
    }

    /// Plans an event's `ranges` one after the other from `at` in chunk
    /// `chunk` (the first buffers are the chunks).
    fn part(&mut self, ranges: &[(u64, u64)], chunk: usize, at: usize) {
        let mut pos = at;
        for &(_, l) in ranges {
            self.plan.push((chunk, pos, l as usize));
            pos += l as usize;
        }
    }
}

/// Selection and buffers per event, then one data request for them all
/// (one item per stored batch), straight into the buffers. The request is
/// sent before this returns.
pub(crate) async fn start_fetch(
    shared: &Arc<Shared>,
    sub: &Arc<PartSub>,
    items: Vec<Incoming>,
) -> Result<InFlight> {
    let batch = shared.batch(sub);
    let selected = select_all(shared, &batch, &items)?;
    let below = shared.opts.broker.carve_below();
    let (sizes, places) = layout(&selected, below);
    let mut req = Building {
        buffers: Vec::new(),
        plan: Vec::new(),
        wanted: Vec::new(),
    };
    for &n in &sizes {
        req.buffers
            .push(Box::new(ChunkPart(BytesMut::zeroed(n))) as Box<dyn DataBuffer>);
    }
    let mut events = VecDeque::with_capacity(items.len());
    let mut holds = Vec::with_capacity(items.len());
    for ((i, sel), place) in items.into_iter().zip(selected).zip(places) {
        let e = &i.entry;
        let first = req.buffers.len();
        let mut fetched = 0;
        let mut hold = Holds::Own(0);
        let mut meta = None;
        if e.data_len > 0 && shared.unpacker.is_some() {
            // Compressed: the whole stored frame, selected after decoding.
            fetched = crate::unpack::stored_frame(e.data_len, &mut req.buffers, &mut req.plan);
            if fetched > 0 {
                req.want(i.batch_base, std::iter::once((e.data_pos, e.data_len)));
            }
            hold = Holds::Own(req.buffers.len() - first);
        } else if let Some(s) = sel {
            fetched = s.fetched;
            if let Some((chunk, at)) = place {
                req.part(&s.ranges, chunk, at);
                let len = fetched as usize;
                hold = Holds::Part { chunk, at, len };
            } else if fetched > 0 {
                let bufs = shared
                    .opts
                    .broker
                    .buffers(&s.meta, &s.selection, fetched)
                    .map_err(Error::Broker)?;
                plan_fill(&bufs, first, fetched, &mut req.plan)?;
                req.buffers.extend(bufs);
                hold = Holds::Own(req.buffers.len() - first);
            }
            if fetched > 0 {
                req.want(
                    i.batch_base,
                    s.ranges.iter().map(|&(o, l)| (e.data_pos + o, l)),
                );
            }
            meta = Some(s.meta);
        }
        holds.push(hold);
        events.push_back(batch.event(i, meta, fetched, Vec::new()));
    }
    let mut flight = InFlight {
        shared: shared.clone(),
        events,
        holds,
        chunks: sizes.len(),
        want: 0,
        waiter: None,
        unpacker: shared.unpacker.clone(),
        counted: false,
    };
    if req.wanted.is_empty() {
        return Ok(flight);
    }
    let want: u64 = req
        .wanted
        .iter()
        .flat_map(|(_, r)| r.iter())
        .map(|r| r.1)
        .sum();
    shared
        .budget
        .reserve(want, shared.opts.prefetch_bytes)
        .await;
    flight.want = want;
    let msg = Request::FetchData {
        topic: shared.topic.name().to_string(),
        partition: sub.partition,
        items: req.wanted,
    };
    let conn = sub.conn.lock().clone().ok_or_else(|| {
        Error::coded(
            ErrorCode::CONNECTION_CLOSED,
            "the subscription has no connection",
        )
    })?;
    flight.waiter = Some(conn.send(&msg, Vec::new(), req.buffers, req.plan).await?);
    shared.fetching.fetch_add(1, Ordering::AcqRel);
    flight.counted = true;
    Ok(flight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(fetched: u64) -> Option<Selected> {
        let policy = strom_policy::TopicPolicy::new("none", None, "round-robin", "json").unwrap();
        let meta = EventMeta::new(
            0,
            0,
            0,
            bytes::Bytes::new(),
            crate::data::PolicyHandle::new(Arc::new(policy)),
        );
        Some(Selected {
            meta,
            selection: Selection::All,
            ranges: vec![(0, fetched)],
            fetched,
        })
    }

    /// Small parts fill chunks of at most 64 KiB in order, none straddles
    /// two; large parts, events without data and unfetched ones take none.
    #[test]
    fn small_parts_fill_chunks_in_order() {
        let mut s: Vec<Option<Selected>> = vec![sel(1000), None, sel(20_000), sel(0)];
        s.extend((0..70).map(|_| sel(1024)));
        s.push(sel(16 << 10));
        let (sizes, places) = layout(&s, 16 << 10);
        // 1000 bytes, then 1 KiB parts from offset 1024 (aligned).
        assert_eq!(sizes, vec![1024 + 63 * 1024, 7 * 1024]);
        assert!(sizes.iter().all(|&n| n <= CHUNK_MOST));
        assert_eq!(
            &places[..5],
            &[Some((0, 0)), None, None, None, Some((0, 1024))]
        );
        assert_eq!(
            places[66..70],
            [
                Some((0, 63 * 1024)),
                Some((1, 0)),
                Some((1, 1024)),
                Some((1, 2048))
            ]
        );
        assert_eq!(places[74], None);
        assert!(layout(&s, 0).0.is_empty(), "a broker that does not carve");
    }

    /// Parts are cut in order after their padding; asking for bytes behind
    /// what was cut or past the end is an error, not a panic.
    #[test]
    fn parts_are_cut_from_the_chunks_in_order() {
        let mut chunk = (BytesMut::from(&b"abcdef"[..]), 0);
        let a = carve(&mut chunk, 0, 1).unwrap();
        let b = carve(&mut chunk, 2, 1).unwrap();
        let c = carve(&mut chunk, 3, 3).unwrap();
        assert_eq!(
            (&a.0[..], &b.0[..], &c.0[..]),
            (&b"a"[..], &b"c"[..], &b"def"[..])
        );
        assert!(carve(&mut chunk, 6, 1).is_err());
        assert!(carve(&mut chunk, 0, 1).is_err());
    }
}
