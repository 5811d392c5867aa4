//! A consumer's side of data-part compression (`compress.rs` holds the
//! frame format): checking and decoding each fetched event's stored
//! frame on the blocking pool, then running the selector and broker on
//! the decoded data. It sits above the consumer types it fills, so the
//! frame codec below stays a leaf.

use std::collections::VecDeque;
use std::sync::Arc;

use strom_proto::ErrorCode;

use crate::compress::{Frame, HEADER_LEN, MAX_UNCOMPRESSED};
use crate::data::{plan_fill, DataBroker, DataBudget, DataBuffer, DataDescriptor, DataSelector};
use crate::error::{Error, FrameError, Result};
use crate::event::Event;

/// What a consumer of a compressed topic runs on each event once its
/// stored frame was fetched (alone, into the event's one buffer).
pub(crate) struct Unpacker {
    pub topic: String,
    pub selector: Arc<dyn DataSelector>,
    pub broker: Arc<dyn DataBroker>,
}

impl Unpacker {
    /// Checks and decodes the event's frame, runs the selector and broker
    /// on the uncompressed view, and fills the broker's buffers with the
    /// selected bytes. A bad frame is a [`Error::DataFrame`]; selector and
    /// broker failures are what they are on other topics.
    pub fn unpack(&self, mut ev: Event) -> Result<Event> {
        if ev.data_size == 0 {
            return Ok(ev);
        }
        let stored = std::mem::take(&mut ev.buffers);
        let bytes = match stored.first() {
            Some(b) => &b.as_slice()[..ev.fetched as usize],
            // Not fetched: more than any frame of an event can hold.
            None => {
                let claimed = ev.data_size;
                return Err(self.bad(
                    &ev,
                    FrameError::TooLarge {
                        claimed,
                        cap: MAX_UNCOMPRESSED,
                    },
                ));
            }
        };
        let frame = Frame::parse(bytes, MAX_UNCOMPRESSED).map_err(|e| self.bad(&ev, e))?;
        let size = frame.len();
        let desc = DataDescriptor {
            size,
            descriptor: ev.descriptor.clone(),
        };
        let sel = self
            .selector
            .try_select(&ev.meta, &desc)
            .map_err(Error::Selector)?;
        let ranges = sel.resolve(size).map_err(Error::Selector)?;
        let fetched: u64 = ranges.iter().map(|r| r.1).sum();
        (ev.data_size, ev.fetched) = (size, fetched);
        if fetched == 0 {
            return Ok(ev);
        }
        let mut bufs = self
            .broker
            .buffers(&ev.meta, &sel, fetched)
            .map_err(Error::Broker)?;
        let mut plan = Vec::new();
        plan_fill(&bufs, 0, fetched, &mut plan)?;
        if ranges == [(0, size)] && plan.len() == 1 {
            // The whole part into one buffer: decoded in place, no copy.
            let out = &mut bufs[0].as_mut_slice()[..size as usize];
            frame.decode_into(out).map_err(|e| self.bad(&ev, e))?;
        } else {
            let full = frame.decode().map_err(|e| self.bad(&ev, e))?;
            scatter(&full, &ranges, &mut bufs, &plan);
        }
        ev.buffers = bufs;
        Ok(ev)
    }

    fn bad(&self, ev: &Event, source: FrameError) -> Error {
        Error::DataFrame {
            topic: self.topic.clone(),
            partition: ev.meta.partition,
            offset: ev.meta.offset,
            source,
        }
    }
}

/// Copies the `ranges` of `full` in order over the `(buffer, start, len)`
/// pieces of `plan` (which add up to the ranges' length).
fn scatter(
    full: &[u8],
    ranges: &[(u64, u64)],
    bufs: &mut [Box<dyn DataBuffer>],
    plan: &[(usize, usize, usize)],
) {
    let mut pieces = plan.iter().copied();
    let mut cur = pieces.next();
    for &(o, l) in ranges {
        let mut src = &full[o as usize..(o + l) as usize];
        while let (false, Some((b, pos, left))) = (src.is_empty(), cur.as_mut()) {
            let n = (*left).min(src.len());
            bufs[*b].as_mut_slice()[*pos..*pos + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            *pos += n;
            *left -= n;
            if *left == 0 {
                cur = pieces.next();
            }
        }
    }
}

/// A batch's events in order, with an error in the place of each one whose
/// data could not be decoded.
pub(crate) type Fetched = Vec<Result<Event>>;

/// Decodes a compressed topic's fetched events on the blocking pool (the
/// selectors and brokers run there too), and moves the data budget from
/// the stored frames to the selected bytes handed out.
pub(crate) async fn unpack_all(
    budget: &DataBudget,
    u: Arc<Unpacker>,
    events: VecDeque<Event>,
) -> Result<Fetched> {
    let stored: u64 = events.iter().map(|e| e.fetched_len()).sum();
    let decoded = tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            match u.unpack(ev) {
                Ok(ev) => out.push(Ok(ev)),
                Err(e @ Error::DataFrame { .. }) => out.push(Err(e)),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::coded(ErrorCode::INTERNAL, format!("decoding data parts: {e}")));
    let decoded = match decoded.and_then(|d| d) {
        Ok(d) => d,
        Err(e) => {
            budget.release(stored);
            return Err(e);
        }
    };
    let held: u64 = decoded.iter().flatten().map(|e| e.fetched_len()).sum();
    match held.cmp(&stored) {
        std::cmp::Ordering::Greater => budget.take(held - stored),
        _ => budget.release(stored - held),
    }
    Ok(decoded)
}

/// A buffer for a compressed event's whole stored frame (`len` bytes),
/// planned to be filled; 0 (nothing fetched) when no frame can be that
/// large, which decoding then reports.
pub(crate) fn stored_frame(
    len: u64,
    buffers: &mut Vec<Box<dyn DataBuffer>>,
    plan: &mut Vec<(usize, usize, usize)>,
) -> u64 {
    let most = MAX_UNCOMPRESSED + HEADER_LEN as u64;
    if len > most {
        return 0;
    }
    plan.push((buffers.len(), 0, len as usize));
    buffers.push(Box::new(vec![0u8; len as usize]));
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_ranges_are_scattered_over_the_brokers_buffers() {
        let full: Vec<u8> = (0..100u8).collect();
        let mut bufs: Vec<Box<dyn DataBuffer>> =
            vec![Box::new(vec![0u8; 3]), Box::new(vec![0u8; 9])];
        let mut plan = Vec::new();
        plan_fill(&bufs, 0, 12, &mut plan).unwrap();
        scatter(&full, &[(10, 5), (50, 7)], &mut bufs, &plan);
        assert_eq!(bufs[0].as_slice(), &[10, 11, 12]);
        assert_eq!(bufs[1].as_slice(), &[13, 14, 50, 51, 52, 53, 54, 55, 56]);
    }
}
