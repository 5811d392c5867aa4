//! `strom topic stage-out TOPIC --to DIR`: writes a topic's events out as
//! plain files that analysis tools read without Strom: per partition a
//! JSON-lines index (`DIR/TOPIC/pN/events.jsonl`) and, by `--format`, the
//! data concatenated in `data.bin` (`raw`), one `.npy` file per array event
//! (`npy`), the arrays in one HDF5 file (`hdf5`, docs/hdf5.md), or no data
//! at all (`jsonl`). It reads each partition up to its
//! end as of the start (or, with `--follow`, to the end of the stream),
//! then writes `MANIFEST.json` last and moves the directory into place, so
//! an unfinished stage-out never looks like a finished one. It never acks.
//! The format is documented in docs/stage-out.md.

mod hdf5;
mod npy;
mod partition;
mod target;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use strom_client::{ConsumerOptions, Driver, ErrorCode, Event, Next, Selection, StartPos};

use crate::interrupt;
use partition::{Format, PartitionWriter, Record, Stats};
use target::Target;

#[derive(Args)]
pub struct StageOutArgs {
    topic: String,
    /// Directory to write into; the stage-out goes to DIR/TOPIC.
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    /// raw: data concatenated in data.bin per partition; npy: one .npy
    /// file per event whose descriptor describes an array (others as raw);
    /// hdf5: the arrays in pN/events.h5 (docs/hdf5.md); jsonl: the index
    /// alone, no data.
    #[arg(long, value_enum, default_value = "raw")]
    format: Format,
    /// hdf5: per-event (a dataset per event, metadata as attributes),
    /// append (one row of /data per event, all of one dtype and shape) or
    /// concat (events joined along their axis 0 into /data).
    #[arg(long, value_enum, default_value = "per-event")]
    hdf5_layout: hdf5::Layout,
    /// hdf5 with append or concat: an event that does not fit /data gets
    /// its own dataset instead of failing the stage-out.
    #[arg(long)]
    hdf5_fallback: bool,
    /// hdf5: none | gzip | gzip:0..9 (chunks are compressed).
    #[arg(long, default_value = "none")]
    compress: String,
    /// Only these partitions (comma separated).
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<u32>>,
    /// beginning | <offset> (the same offset in every partition).
    #[arg(long, default_value = "beginning")]
    from: String,
    /// Read until the stream ends, not just to each partition's current end.
    #[arg(long)]
    follow: bool,
    /// Replace an existing complete stage-out of this topic in DIR.
    #[arg(long)]
    force: bool,
    /// Consumer name the events are read under (nothing is acked).
    #[arg(long, default_value = "strom-stage-out")]
    name: String,
    /// Seconds without any event, before the end, after which the
    /// stage-out fails (a partition is unreachable or its events are gone).
    /// Not with --follow, which waits for the end of the stream.
    #[arg(long, default_value_t = 30.0)]
    idle_timeout: f64,
}

/// What `--format hdf5` says when this strom was built without it.
pub const NO_HDF5: &str = "this strom was built without HDF5 support; build it with \
     `--features hdf5` (needs libhdf5-dev; see docs/hdf5.md)";

/// The HDF5 options, checked: only with `--format hdf5`.
fn hdf5_options(a: &StageOutArgs) -> anyhow::Result<hdf5::Options> {
    let gzip = hdf5::parse_compress(&a.compress)?;
    if a.format != Format::Hdf5 {
        anyhow::ensure!(
            a.hdf5_layout == hdf5::Layout::PerEvent && !a.hdf5_fallback && gzip.is_none(),
            "--hdf5-layout, --hdf5-fallback and --compress apply only to --format hdf5"
        );
    } else {
        anyhow::ensure!(cfg!(feature = "hdf5"), NO_HDF5);
        anyhow::ensure!(
            !a.hdf5_fallback || a.hdf5_layout != hdf5::Layout::PerEvent,
            "--hdf5-fallback applies to --hdf5-layout append or concat"
        );
    }
    Ok(hdf5::Options {
        topic: a.topic.clone(),
        layout: a.hdf5_layout,
        gzip,
        fallback: a.hdf5_fallback,
    })
}

/// How long a pull waits before the loop looks at signals and timeouts.
const TICK: Duration = Duration::from_millis(100);

/// One partition to read: from `start` up to (not including) `end`.
struct Span {
    start: u64,
    end: u64,
}

fn parse_from(s: &str) -> anyhow::Result<Option<u64>> {
    match s {
        "beginning" => Ok(None),
        _ => s
            .parse()
            .map(Some)
            .map_err(|_| anyhow::anyhow!("--from takes beginning or an offset, not '{s}'")),
    }
}

/// The partitions to read and their ranges, from the topic as it is now.
fn plan(
    info: &strom_client::TopicInfo,
    only: Option<&[u32]>,
    from: Option<u64>,
    follow: bool,
) -> anyhow::Result<BTreeMap<u32, Span>> {
    let name = &info.spec.name;
    if let Some(ids) = only {
        for id in ids {
            anyhow::ensure!(
                info.partitions.iter().any(|p| p.id == *id),
                "topic '{name}' has no partition {id} (it has {})",
                info.partitions.len()
            );
        }
    }
    let mut spans = BTreeMap::new();
    for p in &info.partitions {
        if only.is_some_and(|ids| !ids.contains(&p.id)) {
            continue;
        }
        let start = match from {
            None => p.first_offset,
            Some(n) if n > p.next_offset => bail!(
                "--from {n} is past the end of partition {} of topic '{name}' (next offset {})",
                p.id,
                p.next_offset
            ),
            Some(n) => n.max(p.first_offset),
        };
        let end = if follow { u64::MAX } else { p.next_offset };
        spans.insert(p.id, Span { start, end });
    }
    Ok(spans)
}

/// The event's data as fetched, in pieces, checked to be all of it.
fn data_pieces(ev: &Event) -> anyhow::Result<Vec<&[u8]>> {
    let mut left = ev.fetched_len() as usize;
    let mut out = Vec::new();
    for b in ev.buffers() {
        let s = b.as_slice();
        let n = left.min(s.len());
        out.push(&s[..n]);
        left -= n;
    }
    anyhow::ensure!(
        left == 0,
        "event {}/{}: the buffers hold less than the fetched length",
        ev.partition,
        ev.offset
    );
    Ok(out)
}

/// The reading state: writers and how far each partition got.
struct Reader {
    format: Format,
    json_serializer: bool,
    spans: BTreeMap<u32, Span>,
    next: BTreeMap<u32, u64>,
    writers: BTreeMap<u32, PartitionWriter>,
}

impl Reader {
    fn caught_up(&self) -> bool {
        self.spans.iter().all(|(p, s)| self.next[p] >= s.end)
    }

    /// Writes one event if it is in range; skips what is past the end.
    fn event(&mut self, ev: &Event) -> anyhow::Result<()> {
        let p = ev.partition;
        let (Some(span), Some(next)) = (self.spans.get(&p), self.next.get_mut(&p)) else {
            return Ok(());
        };
        if ev.offset < *next || ev.offset >= span.end {
            return Ok(());
        }
        let Some(w) = self.writers.get_mut(&p) else {
            return Ok(());
        };
        if ev.offset > *next {
            w.gap(*next, ev.offset - 1, "not delivered".into());
        }
        *next = ev.offset + 1;
        let data = if self.format == Format::Jsonl {
            Vec::new()
        } else {
            anyhow::ensure!(
                ev.fetched_len() == ev.data_size(),
                "event {p}/{}: fetched {} of {} data bytes",
                ev.offset,
                ev.fetched_len(),
                ev.data_size()
            );
            data_pieces(ev)?
        };
        let record = Record {
            offset: ev.offset,
            timestamp_us: ev.timestamp_us,
            raw_meta: ev.raw(),
            json_serializer: self.json_serializer,
            decoded: if self.json_serializer {
                None
            } else {
                ev.json().ok()
            },
            descriptor: ev.descriptor(),
            data_len: ev.data_size(),
            data,
        };
        w.write(&record)
    }

    /// Records a range the server reported gone (retention or damage).
    fn gap(&mut self, p: u32, first: u64, last: u64, reason: &str) {
        tracing::warn!("partition {p}: events {first}..={last} {reason}; recorded in the manifest");
        if let (Some(w), Some(next)) = (self.writers.get_mut(&p), self.next.get_mut(&p)) {
            w.gap(first, last, reason.into());
            *next = (*next).max(last + 1);
        }
    }

    /// Which partitions have not reached their end, for error messages.
    fn missing(&self) -> String {
        let v: Vec<String> = self
            .spans
            .iter()
            .filter(|(p, s)| self.next[*p] < s.end)
            .map(|(p, s)| format!("partition {p} at offset {} of {}", self.next[p], s.end))
            .collect();
        v.join(", ")
    }
}

/// Pulls until every partition reached its end (or the stream ended);
/// returns whether the end of the stream was seen.
fn read_all(
    consumer: &strom_client::Consumer,
    r: &mut Reader,
    idle_timeout: Option<Duration>,
) -> anyhow::Result<bool> {
    let mut last_event = Instant::now();
    loop {
        if let Some(sig) = interrupt::received() {
            eprintln!(
                "strom: stopped by {}; nothing was staged out",
                interrupt::name(sig)
            );
            return Err(crate::Exit(interrupt::exit_code(sig)).into());
        }
        if r.caught_up() {
            return Ok(false);
        }
        match consumer.pull_timeout(TICK) {
            Ok(Next::Event(ev)) => {
                last_event = Instant::now();
                r.event(&ev)?;
            }
            Ok(Next::EndOfStream) => return Ok(true),
            Err(e) if e.code() == ErrorCode::TIMEOUT => {
                if let Some(limit) = idle_timeout.filter(|l| last_event.elapsed() >= *l) {
                    bail!(
                        "nothing arrived for {limit:?} before the end ({}); \
                         the partition may be unreachable or its events gone",
                        r.missing()
                    );
                }
            }
            Err(strom_client::Error::DataExpired {
                partition,
                first,
                last,
                ..
            }) => {
                last_event = Instant::now();
                r.gap(partition, first, last, "expired (retention or overflow)");
            }
            Err(strom_client::Error::DataCorrupt {
                partition,
                first,
                last,
                ..
            }) => {
                last_event = Instant::now();
                r.gap(partition, first, last, "damaged on disk (quarantined)");
            }
            Err(e) => return Err(e).context("reading the topic"),
        }
    }
}

fn manifest_partition(
    id: u32,
    span: &Span,
    next: u64,
    s: &Stats,
    format: Format,
) -> serde_json::Value {
    let mut v = json!({
        "id": id,
        "dir": format!("p{id}"),
        "index": format!("p{id}/{}", partition::INDEX),
        "from_offset": span.start,
        "end_offset": next,
        "events": s.events,
        "data_bytes": s.data_bytes,
        "files": s.files,
        "npy_files": s.npy_files,
        "raw_fallbacks": s.raw_fallbacks,
        "gaps": s.gaps.iter().map(|g| json!({
            "first": g.first, "last": g.last, "reason": g.reason,
        })).collect::<Vec<_>>(),
    });
    if format == Format::Hdf5 {
        v["hdf5_file"] = format!("p{id}/{}", hdf5::FILE).into();
        v["hdf5_datasets"] = s.hdf5_datasets.into();
    }
    v
}

/// Totals over the partitions: events, data bytes, files, bytes written.
#[derive(Default)]
struct Totals {
    events: u64,
    data_bytes: u64,
    files: u64,
    bytes_written: u64,
}

/// Finishes every partition and builds the manifest (without its own file
/// in the counts, which [`run`] adds).
fn finish(r: Reader, a: &StageOutArgs, ended: bool) -> anyhow::Result<(serde_json::Value, Totals)> {
    let mut parts = Vec::new();
    let mut t = Totals::default();
    for (id, w) in r.writers {
        let s = w.finish()?;
        t.events += s.events;
        t.data_bytes += s.data_bytes;
        t.files += s.files;
        t.bytes_written += s.bytes_written;
        parts.push(manifest_partition(
            id,
            &r.spans[&id],
            r.next[&id],
            &s,
            a.format,
        ));
    }
    let created_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut manifest = json!({
        "format_name": target::FORMAT_NAME,
        "format_version": 1,
        "strom_version": env!("CARGO_PKG_VERSION"),
        "topic": a.topic,
        "format": a.format.as_str(),
        "serializer": if r.json_serializer { "json" } else { "binary" },
        "created_unix_ms": created_ms,
        "end_of_stream": ended,
        "events": t.events,
        "data_bytes": t.data_bytes,
        "files": t.files + 1,
        "partitions": parts,
    });
    if a.format == Format::Hdf5 {
        manifest["hdf5"] = json!({
            "layout": a.hdf5_layout.as_str(),
            "compress": a.compress,
            "fallback": a.hdf5_fallback,
        });
    }
    Ok((manifest, t))
}

/// A consumer of the planned partitions that fetches what `format` needs.
fn open_consumer(
    topic: &strom_client::Topic,
    a: &StageOutArgs,
    from: Option<u64>,
    spans: &BTreeMap<u32, Span>,
) -> anyhow::Result<strom_client::Consumer> {
    let selector = match a.format {
        Format::Jsonl => Selection::None,
        _ => Selection::All,
    };
    let options = ConsumerOptions {
        start: from.map_or(StartPos::Beginning, StartPos::Offset),
        partitions: Some(spans.keys().copied().collect()),
        selector: std::sync::Arc::new(selector),
        ..Default::default()
    };
    topic
        .consumer_with(&a.name, options)
        .with_context(|| format!("reading topic '{}' as consumer '{}'", a.topic, a.name))
}

/// The summary: one JSON line on stdout, one sentence on stderr.
fn report(a: &StageOutArgs, dir: &std::path::Path, t: &Totals, ended: bool, secs: f64) {
    let summary = json!({
        "topic": a.topic,
        "dir": dir.display().to_string(),
        "format": a.format.as_str(),
        "events": t.events,
        "data_bytes": t.data_bytes,
        "bytes_written": t.bytes_written,
        "files": t.files + 1,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "end_of_stream": ended,
    });
    println!("{summary}");
    eprintln!(
        "staged out {} events ({} data bytes) of topic '{}' to {} as {}: {} files, {:.3} s",
        t.events,
        t.data_bytes,
        a.topic,
        dir.display(),
        a.format.as_str(),
        t.files + 1,
        secs
    );
}

/// The options, checked without the server: `--from`, the HDF5 options
/// and `--idle-timeout`. `strom topic stage-out` calls this before it
/// connects, so a mistyped option fails at once.
pub fn check_args(a: &StageOutArgs) -> anyhow::Result<()> {
    parse_from(&a.from)?;
    hdf5_options(a)?;
    idle_timeout(a)?;
    Ok(())
}

fn idle_timeout(a: &StageOutArgs) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(a.idle_timeout)
        .map_err(|_| anyhow::anyhow!("--idle-timeout takes seconds, not {}", a.idle_timeout))
}

pub fn run(a: StageOutArgs, d: &Driver) -> anyhow::Result<()> {
    let started = Instant::now();
    let from = parse_from(&a.from)?;
    let h5 = hdf5_options(&a)?;
    let idle_timeout = idle_timeout(&a)?;
    let topic = d
        .open_topic(&a.topic)
        .with_context(|| format!("topic '{}'", a.topic))?;
    let info = topic
        .describe()
        .with_context(|| format!("describing topic '{}'", a.topic))?;
    let spans = plan(&info, a.partitions.as_deref(), from, a.follow)?;
    // From here on, a failure or a signal removes the temporary
    // directory (drop); the handler is in place before it exists.
    interrupt::install()?;
    let target = Target::prepare(&a.to, &a.topic, a.force)?;
    let mut writers = BTreeMap::new();
    for id in spans.keys() {
        writers.insert(
            *id,
            PartitionWriter::create(target.dir(), *id, a.format, &h5)?,
        );
    }
    let consumer = open_consumer(&topic, &a, from, &spans)?;
    let mut reader = Reader {
        format: a.format,
        json_serializer: info.spec.serializer == "json",
        next: spans.iter().map(|(p, s)| (*p, s.start)).collect(),
        spans,
        writers,
    };
    let ended = read_all(&consumer, &mut reader, (!a.follow).then_some(idle_timeout))?;
    drop(consumer);
    if !a.follow && !reader.caught_up() {
        bail!(
            "the stream ended before every partition reached its end ({})",
            reader.missing()
        );
    }
    let (manifest, t) = finish(reader, &a, ended)?;
    let dir = target.commit(&manifest)?;
    report(&a, &dir, &t, ended, started.elapsed().as_secs_f64());
    Ok(())
}
