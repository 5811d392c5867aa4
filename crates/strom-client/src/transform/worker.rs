//! The loop that carries one source partition through a transform,
//! exactly once: read as the named consumer `transform.NAME`, gather each
//! stored source batch whole (its boundaries are the producer's, the same
//! on every read), run the transform on its events, append what comes out
//! as one stamped batch (`append.rs`), and only then ack the source batch.
//! After a crash the consumer resumes at the last committed batch end; the
//! batches after it are transformed again and appended with the same
//! stamps, and the output partition answers those it already holds
//! without appending them twice. One output batch is in flight at a time
//! (stamps are not consecutive, so the partition cannot order a second
//! one behind a retried first), and at most [`MAX_UNCOMMITTED`] output
//! batches belong to source batches acked but not yet committed: a rerun
//! resends at most that many, well inside the 64 batches per producer a
//! partition's sequence table remembers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strom_policy::{MetadataInput, TopicPolicy};
use strom_proto::{BatchBuilder, Compression, ErrorCode, StartPos};

use super::append::{self, OutBatch};
use super::{consumer_name, producer_id, Out, Transformer};
use crate::consumer::ConsumerOptions;
use crate::error::{Error, Result};
use crate::event::{AckFuture, Event};
use crate::topic::Topic;

/// Output batches of source batches acked but not known committed, at
/// most (a source batch whose output is split counts each piece).
pub const MAX_UNCOMMITTED: usize = 32;
/// Output bytes past which a source batch's output is split (at source
/// event boundaries, so the split is the same on every rerun).
const SPLIT_BYTES: usize = 4 << 20;
const POLL: Duration = Duration::from_millis(200);

/// What one run of a partition did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Source events read and transformed.
    pub read: u64,
    /// Output events appended (or found already appended).
    pub written: u64,
    /// Whether the source partition's stream ended.
    pub ended: bool,
}

/// One source partition of a transform.
pub struct PartitionJob<'a> {
    pub name: &'a str,
    pub src: &'a Topic,
    pub dst: &'a Topic,
    pub partition: u32,
    pub transformer: &'a dyn Transformer,
    /// Set to stop the run after the batch in hand.
    pub stop: &'a AtomicBool,
}

struct Sink<'a> {
    dst: &'a Topic,
    policy: TopicPolicy,
    compression: Compression,
    out_partition: u32,
    partitions: u32,
    producer: u64,
}

impl PartitionJob<'_> {
    /// Runs until `stop` is set or the source partition's stream ends.
    pub fn run(&self) -> Result<Progress> {
        let dst_info = self.dst.describe()?;
        let partitions = dst_info.spec.partitions;
        if partitions == 0 {
            return Err(Error::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("output topic '{}' has no partitions", self.dst.name()),
            ));
        }
        let sink = Sink {
            dst: self.dst,
            policy: self.dst.policy()?,
            compression: Compression::parse(&dst_info.spec.compression)
                .map_err(|e| Error::coded(ErrorCode::INVALID_TOPIC_SPEC, e))?,
            out_partition: self.partition % partitions,
            partitions,
            producer: producer_id(self.name, self.partition),
        };
        let opts = ConsumerOptions {
            partitions: Some(vec![self.partition]),
            start: StartPos::Committed,
            ..ConsumerOptions::default()
        };
        let consumer = self.src.consumer_with(&consumer_name(self.name), opts)?;
        let mut progress = Progress::default();
        let mut batch: Vec<Event> = Vec::new();
        // Acks not known committed, with the output batches they cover.
        let mut acks: std::collections::VecDeque<(AckFuture, usize)> = Default::default();
        let mut uncommitted = 0;
        while !self.stop.load(Ordering::Acquire) {
            let events = match consumer.pull_many(4096, POLL)? {
                Some(e) => e,
                None => {
                    progress.ended = true;
                    break;
                }
            };
            for ev in events {
                let end = ev.batch_end();
                let last = ev.offset + 1 >= end;
                batch.push(ev);
                if last {
                    let done = std::mem::take(&mut batch);
                    let ack = done[done.len() - 1].ack_later();
                    progress.read += done.len() as u64;
                    let (written, batches) = self.carry(&sink, done)?;
                    progress.written += written;
                    acks.push_back((ack.ack(), batches));
                    uncommitted += batches;
                    while uncommitted > MAX_UNCOMMITTED {
                        let Some((a, n)) = acks.pop_front() else {
                            break;
                        };
                        a.wait()?;
                        uncommitted -= n;
                    }
                }
            }
        }
        for (a, _) in acks {
            a.wait()?;
        }
        Ok(progress)
    }

    /// Transforms one whole source batch and appends its output; returns
    /// the events written and in how many batches.
    fn carry(&self, sink: &Sink<'_>, batch: Vec<Event>) -> Result<(u64, usize)> {
        let mut chunk = Chunk::default();
        let (mut written, mut batches) = (0, 0);
        for ev in batch {
            let (partition, offset) = (ev.partition, ev.offset);
            let outs = self.transformer.apply(ev).map_err(|e| {
                Error::coded(
                    e.code(),
                    format!(
                        "transform '{}' failed on event {}/{} of '{}': {}",
                        self.name,
                        partition,
                        offset,
                        self.src.name(),
                        e.message()
                    ),
                )
            })?;
            if chunk.builder.is_empty() {
                chunk.first = offset;
            }
            for o in outs {
                chunk.push(sink, o)?;
            }
            if chunk.bytes >= SPLIT_BYTES {
                written += chunk.send(sink)?;
                batches += 1;
            }
        }
        let last = chunk.send(sink)?;
        written += last;
        batches += usize::from(last > 0);
        Ok((written, batches))
    }
}

/// Output events of consecutive source events, sent as one batch.
#[derive(Default)]
struct Chunk {
    builder: BatchBuilder,
    data: Vec<Bytes>,
    bytes: usize,
    /// Offset of the source event the chunk starts at (its stamp).
    first: u64,
}

impl Chunk {
    fn push(&mut self, sink: &Sink<'_>, o: Out) -> Result<()> {
        let (_, meta) =
            sink.policy
                .prepare(o.metadata, Some(sink.out_partition), sink.partitions)?;
        self.builder.push(&meta, &o.descriptor, o.data.len() as u64);
        self.bytes += meta.len() + o.descriptor.len() + o.data.len();
        if !o.data.is_empty() {
            self.data.push(o.data);
        }
        Ok(())
    }

    /// Appends what the chunk holds (nothing if it is empty).
    fn send(&mut self, sink: &Sink<'_>) -> Result<u64> {
        if self.builder.is_empty() {
            return Ok(0);
        }
        let count = self.builder.count();
        let stamp = append::stamp(sink.producer, self.first);
        let batch = OutBatch {
            meta: self.builder.finish_stamped(Some(stamp)),
            count,
            data: std::mem::take(&mut self.data),
        };
        self.bytes = 0;
        let (dst, p, c) = (sink.dst.clone(), sink.out_partition, sink.compression);
        sink.dst
            .driver
            .block_on(async move { append::append(&dst, p, c, batch).await })?;
        Ok(u64::from(count))
    }
}

/// A transform given as a closure.
pub struct FnTransformer<F>(pub F);

impl<F> Transformer for FnTransformer<F>
where
    F: Fn(Event) -> Result<Vec<Out>> + Send + Sync,
{
    fn apply(&self, event: Event) -> Result<Vec<Out>> {
        (self.0)(event)
    }
}

/// Runs `job` on every partition of its source at once, one thread each,
/// until `stop` is set or every partition's stream ended.
pub fn run_all(
    name: &str,
    src: &Topic,
    dst: &Topic,
    transformer: Arc<dyn Transformer>,
    stop: Arc<AtomicBool>,
) -> Result<Progress> {
    let partitions = src.describe()?.spec.partitions;
    let results: Vec<Result<Progress>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..partitions)
            .map(|p| {
                let (t, stop) = (transformer.clone(), stop.clone());
                s.spawn(move || {
                    let job = PartitionJob {
                        name,
                        src,
                        dst,
                        partition: p,
                        transformer: t.as_ref(),
                        stop: &stop,
                    };
                    let r = job.run();
                    if r.is_err() {
                        // One partition failed: the others stop too.
                        stop.store(true, Ordering::Release);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::coded(
                        ErrorCode::INTERNAL,
                        "a transform thread panicked",
                    ))
                })
            })
            .collect()
    });
    let mut total = Progress {
        ended: true,
        ..Progress::default()
    };
    for r in results {
        let p = r?;
        total.read += p.read;
        total.written += p.written;
        total.ended &= p.ended;
    }
    Ok(total)
}

/// Keeps metadata as stored when the transform does not look at it.
pub(crate) fn raw_metadata(ev: &Event) -> MetadataInput {
    MetadataInput::Json(ev.raw().clone())
}
