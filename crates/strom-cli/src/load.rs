//! `strom topic load FILE.h5:/DATASET --topic T`: produces a topic's
//! events from an HDF5 dataset (docs/hdf5.md). By default one event per
//! row (a slice along axis 0, without that axis: `a[i]`); with `--chunk N`
//! one event per N rows, keeping the axis (`a[i:i+N]`, the last one
//! shorter), and with `--chunk hdf5` per the dataset's own chunk rows. A
//! scalar dataset is one event. Each event's data is the raw bytes of its
//! slice in the file's dtype, its descriptor the `{"dtype","shape","order"}`
//! the numpy path writes, and its metadata names the source:
//! `{"source_file","source_dataset","source_start","source_stop"}` (rows,
//! stop exclusive).
//!
//! The file, the path, the dtype and every size are checked before the
//! producer opens, so a refused source produces nothing. The producer
//! closes at the end, so consumers see the end of the stream; if an event
//! fails, or a read fails part way, the stream is held open as `strom
//! produce` does (docs/hdf5.md says how to finish it).

use std::path::PathBuf;

use clap::Args;

use crate::h5::source::Source;

#[derive(Args)]
pub struct LoadArgs {
    /// FILE:/DATASET, for example run1.h5:/entry/frames.
    source: String,
    /// The topic to produce into (it must exist).
    #[arg(long)]
    topic: String,
    /// N: rows of axis 0 per event (the event keeps the axis);
    /// hdf5: the dataset's chunk rows. Default: one event per row.
    #[arg(long)]
    chunk: Option<String>,
    /// Send every event to this partition (overrides the topic's selector).
    #[arg(long)]
    partition: Option<u32>,
    /// Largest event data in bytes (default 64 MiB, as `strom produce`);
    /// the server's max_frame_bytes must allow it too.
    #[arg(long)]
    max_event_bytes: Option<u64>,
    /// Refuse a dataset that would make more events than this (a huge
    /// first dimension, often unwritten fill values, is rarely meant).
    #[arg(long, default_value_t = 100_000_000)]
    max_events: u64,
}

/// Rows per event, and whether an event keeps axis 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// One row, without the axis (`a[i]`).
    One,
    /// N rows, with the axis (`a[i:i+N]`).
    Chunk(u64),
    /// The dataset's chunk rows along axis 0.
    Hdf5Chunk,
}

impl Rows {
    pub fn parse(s: Option<&str>) -> anyhow::Result<Rows> {
        match s {
            None => Ok(Rows::One),
            Some("hdf5") => Ok(Rows::Hdf5Chunk),
            Some(n) => match n.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Rows::Chunk(n)),
                _ => anyhow::bail!("--chunk takes a positive number of rows or 'hdf5', not '{n}'"),
            },
        }
    }
}

pub fn run(a: LoadArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let source = Source::parse(&a.source)?;
    let rows = Rows::parse(a.chunk.as_deref())?;
    imp::run(a, source, rows, group_file)
}

#[cfg(not(feature = "hdf5"))]
mod imp {
    use super::*;

    pub fn run(
        _a: LoadArgs,
        _source: Source,
        _rows: Rows,
        _group_file: Option<PathBuf>,
    ) -> anyhow::Result<()> {
        anyhow::bail!(
            "this strom was built without HDF5 support; build it with `--features hdf5` \
             (needs libhdf5-dev; see docs/hdf5.md)"
        )
    }
}

#[cfg(feature = "hdf5")]
mod imp {
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use serde_json::json;
    use strom_client::select::{ArrayLayout, Order};
    use strom_client::{ProducerOptions, PushFuture};

    use super::*;
    use crate::h5::read::Loadable;
    use crate::interrupt;

    /// Events in flight before the oldest is awaited.
    const MAX_PENDING: usize = 256;
    /// The default largest event, as `strom produce`'s.
    const DEFAULT_MAX_EVENT_BYTES: u64 = 64 << 20;

    /// What each event holds, checked against the limits.
    struct Plan {
        rows_per_event: u64,
        keep_axis: bool,
    }

    fn plan(
        l: &Loadable,
        rows: Rows,
        limit: u64,
        max_events: u64,
        shown: &str,
    ) -> anyhow::Result<Plan> {
        let row_bytes = l.row_bytes().with_context(|| {
            format!(
                "{shown}: one row of shape {:?} and dtype {} does not fit in 2^64 bytes",
                l.shape.get(1..).unwrap_or(&[]),
                l.dtype.numpy()
            )
        })?;
        let (rows_per_event, keep_axis) = match (rows, l.shape.is_empty()) {
            (_, true) => (1, false),
            (Rows::One, false) => (1, false),
            (Rows::Chunk(n), false) => (n, true),
            (Rows::Hdf5Chunk, false) => match l.chunk_rows {
                Some(n) if n > 0 => (n, true),
                _ => anyhow::bail!(
                    "{shown}: --chunk hdf5, but the dataset is not chunked; give --chunk N"
                ),
            },
        };
        let rows_per_event = rows_per_event.min(l.rows().max(1));
        let event_bytes = row_bytes.checked_mul(rows_per_event).with_context(|| {
            format!("{shown}: {rows_per_event} rows of {row_bytes} bytes overflow")
        })?;
        anyhow::ensure!(
            event_bytes <= limit,
            "{shown}: each event would hold {event_bytes} bytes ({rows_per_event} row(s) of \
             shape {:?}, dtype {}), over the limit of {limit} bytes; give --chunk with fewer \
             rows, or raise --max-event-bytes (the server's max_frame_bytes must allow it too)",
            l.shape.get(1..).unwrap_or(&[]),
            l.dtype.numpy()
        );
        let events = l.rows().div_ceil(rows_per_event.max(1));
        anyhow::ensure!(
            events <= max_events,
            "{shown}: {} rows of axis 0 make {events} events, over --max-events {max_events}; \
             give --chunk N to put N rows in each event, or raise --max-events",
            l.rows()
        );
        Ok(Plan {
            rows_per_event,
            keep_axis,
        })
    }

    /// Settles futures: the oldest ones while more than `keep` are pending.
    fn settle(
        pending: &mut VecDeque<(u64, PushFuture)>,
        keep: usize,
    ) -> Result<u64, (u64, strom_client::Error)> {
        let mut stored = 0;
        while pending.len() > keep {
            let Some((start, f)) = pending.pop_front() else {
                break;
            };
            f.wait().map_err(|e| (start, e))?;
            stored += 1;
        }
        Ok(stored)
    }

    pub fn run(
        a: LoadArgs,
        source: Source,
        rows: Rows,
        group_file: Option<PathBuf>,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let shown = a.source.clone();
        let limit = a.max_event_bytes.unwrap_or(DEFAULT_MAX_EVENT_BYTES);
        anyhow::ensure!(limit > 0, "--max-event-bytes must be positive");
        let l = Loadable::open(&source)?;
        let p = plan(&l, rows, limit, a.max_events, &shown)?;
        let file = std::fs::canonicalize(&source.file)
            .with_context(|| format!("{}", source.file.display()))?
            .display()
            .to_string();
        let d = crate::connect(group_file)?;
        let topic = d
            .open_topic(&a.topic)
            .with_context(|| format!("topic '{}'", a.topic))?;
        let mut opts = ProducerOptions {
            lease: Some(Duration::ZERO),
            ..Default::default()
        };
        opts.batch.max_event_bytes = Some(limit.saturating_add(64 << 10));
        let producer = topic.producer_with(opts)?;
        interrupt::install()?;
        let trailing: Vec<u64> = l.shape.get(1..).unwrap_or(&[]).to_vec();
        let total_rows = l.rows();
        let mut pending: VecDeque<(u64, PushFuture)> = VecDeque::new();
        let (mut start, mut stored, mut events) = (0u64, 0u64, 0u64);
        let mut failure: Option<String> = None;
        // A 0-d dataset is one event; an empty axis 0 is none.
        let scalar = l.shape.is_empty();
        while (scalar && events == 0) || (!scalar && start < total_rows) {
            if interrupt::received().is_some() {
                break;
            }
            let n = p.rows_per_event.min(total_rows - start).max(1);
            // At most the event size plan() checked against the limit; a
            // limit this machine cannot allocate is an error, not an abort.
            let len = l.row_bytes().unwrap_or(0) * n;
            let mut buf = Vec::new();
            let Some(len) = usize::try_from(len)
                .ok()
                .filter(|len| buf.try_reserve_exact(*len).is_ok())
            else {
                failure = Some(format!(
                    "{shown}: cannot allocate {len} bytes for rows {start}..{}; lower \
                     --max-event-bytes or give --chunk with fewer rows",
                    start + n
                ));
                break;
            };
            buf.resize(len, 0);
            if let Err(e) = l.read_rows(start, if scalar { 1 } else { n }, &mut buf) {
                failure = Some(format!("{shown}: {e}"));
                break;
            }
            let shape = match (scalar, p.keep_axis) {
                (true, _) => Vec::new(),
                (false, false) => trailing.clone(),
                (false, true) => [vec![n], trailing.clone()].concat(),
            };
            let descriptor = ArrayLayout {
                dtype: l.dtype.numpy(),
                shape,
                order: Order::C,
            }
            .to_descriptor();
            let meta = json!({
                "source_file": file,
                "source_dataset": source.dataset,
                "source_start": start,
                "source_stop": start + n,
            });
            match producer.push_with(meta, buf, a.partition, &descriptor) {
                Ok(f) => pending.push_back((start, f)),
                Err(e) => {
                    failure = Some(format!("rows {start}..{}: {}", start + n, e.message()));
                    break;
                }
            }
            events += 1;
            start += n;
            match settle(&mut pending, MAX_PENDING) {
                Ok(s) => stored += s,
                Err((at, e)) => {
                    failure = Some(format!("the event of row {at}: {}", e.message()));
                    break;
                }
            }
        }
        let _ = producer.flush(); // failures come back from the futures
        match settle(&mut pending, 0) {
            Ok(s) => stored += s,
            Err((at, e)) if failure.is_none() => {
                failure = Some(format!("the event of row {at}: {}", e.message()))
            }
            Err(_) => {}
        }
        if let Some(why) = failure {
            eprintln!("strom: error: {why}");
            eprintln!("strom: {stored} events of {shown} stored before the failure");
            let t = &a.topic;
            match crate::produce::hold_open(&topic, &producer, false) {
                Ok(held) => eprintln!(
                    "strom: producer {held} holds the stream open; `strom topic close-producer \
                     {t} {held}` ends the hold (or `strom topic complete {t}` ends the stream)"
                ),
                Err(e) => eprintln!(
                    "strom: could not hold the stream open ({e:#}); this producer's lease runs \
                     out soon after this process exits"
                ),
            }
            return Err(crate::Exit(1).into());
        }
        producer.close().context("closing the producer")?;
        if let Some(sig) = interrupt::received() {
            eprintln!(
                "strom: stopped by {}; {stored} events stored, producer closed",
                interrupt::name(sig)
            );
            return Err(crate::Exit(interrupt::exit_code(sig)).into());
        }
        let secs = started.elapsed().as_secs_f64();
        let summary = json!({
            "topic": a.topic,
            "source_file": file,
            "source_dataset": source.dataset,
            "dtype": l.dtype.numpy(),
            "shape": l.shape,
            "rows_per_event": p.rows_per_event,
            "events": stored,
            "seconds": (secs * 1000.0).round() / 1000.0,
        });
        println!("{summary}");
        eprintln!(
            "loaded {stored} events from {shown} ({} {:?}) into topic '{}' in {secs:.3} s; \
             producer closed",
            l.dtype.numpy(),
            l.shape,
            a.topic
        );
        Ok(())
    }
}
