//! `strom sink postgres`: reads every partition of a topic under a consumer
//! name and writes each event's JSON metadata as a row of a PostgreSQL
//! table, exactly once. The loop fills a batch (up to `--batch` events, or
//! whatever came within `--flush-interval` of the batch's first event),
//! then hands it to the writer thread ([`super::writer`]), which writes it
//! with its partitions' next offsets in one transaction (see
//! [`super::store`]) while this thread fills the next batch. Only after
//! that commit are the events acked to Strom, which shows progress in
//! `strom status` but is never read back. See docs/postgres-sink.md.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use strom_client::Event;

use super::mapping::{parse_columns, to_cells, BadEvent, Column};
use super::source::{Pulled, Source};
use super::store::{Layout, Row, Store};
use super::writer::{Batch, Writer, Written};
use crate::interrupt;

#[derive(Args)]
pub struct PostgresArgs {
    /// Topic to read (all its partitions).
    #[arg(long)]
    topic: String,
    /// Consumer name; positions are stored under (topic, name).
    #[arg(long)]
    name: String,
    /// libpq-style connection string, e.g. 'host=/run/postgresql
    /// dbname=app user=strom' or postgresql://user@host/db.
    #[arg(long, env = "STROM_SINK_DSN", hide_env_values = true)]
    dsn: String,
    /// Target table, TABLE or SCHEMA.TABLE; created when missing.
    #[arg(long)]
    table: String,
    /// Mapped columns, comma separated: COLUMN[=FIELD]:TYPE[?]. FIELD is a
    /// metadata key (default COLUMN) or a JSON pointer such as /pos/x;
    /// TYPE is text, bigint, integer, double, boolean, uuid, timestamptz
    /// or jsonb; a trailing ? lets the field be missing (NULL).
    #[arg(long, default_value = "")]
    columns: String,
    /// JSONB column holding the fields no mapped column took.
    #[arg(long, default_value = "extra")]
    rest_column: String,
    /// Table of positions, in the target table's schema.
    #[arg(long, default_value = "strom_sink_offsets")]
    offsets_table: String,
    /// Events per transaction, at most.
    #[arg(long, default_value = "1000")]
    batch: NonZeroUsize,
    /// Seconds after a batch's first event at which it is written even if
    /// not full, so a slow stream still lands.
    #[arg(long, default_value = "0.5", value_parser = parse_secs)]
    flush_interval: Duration,
    /// Stop (after writing what came before) once no event came for this
    /// many seconds. Without it the sink runs until the end of the stream.
    #[arg(long, value_parser = parse_secs)]
    idle_timeout: Option<Duration>,
    /// What to do with an event that is not JSON or lacks a mapped field:
    /// stop before it (exit 1; a restart meets it again) or skip it (warn,
    /// count, and move past it).
    #[arg(long, value_enum, default_value = "stop")]
    on_bad: OnBad,
    /// Do not ack written events to Strom (positions live in PostgreSQL
    /// either way).
    #[arg(long)]
    no_ack: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnBad {
    Stop,
    Skip,
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("expected a number of seconds, not '{s}'"))
}

/// How long one wait for events may block before the loop looks at
/// signals, the flush deadline and the idle timeout.
const TICK: Duration = Duration::from_millis(50);

/// Why filling a batch stopped.
enum Fill {
    /// Full or due: write it and go on.
    Ready,
    End,
    Idle,
    Signal(i32),
    /// A bad event under `--on-bad stop`: write what came before it, then stop.
    Bad(String),
}

/// The consuming side's counters.
#[derive(Default)]
struct Stats {
    skipped: u64,
    consume: Duration,
    /// Time waiting for the writer to take a batch.
    handoff: Duration,
}

struct Sink {
    args: PostgresArgs,
    columns: Vec<Column>,
    source: Source,
    /// Per partition: the offset after the last event handed to the
    /// writer (or, at start, the one PostgreSQL holds).
    taken: BTreeMap<u32, u64>,
    stats: Stats,
}

pub fn run(a: PostgresArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let columns = parse_columns(&a.columns)?;
    let layout = Layout::new(&a.table, &a.offsets_table, columns.clone(), &a.rest_column)?;
    // The topic first: a missing one creates no tables.
    let driver = crate::connect(group_file)?;
    let topic = driver.open_topic(&a.topic)?;
    let store = Store::open(&a.dsn, layout, &a.topic, &a.name)?;
    let committed = store.load_offsets()?;
    let source = Source::open(&topic, &a.name, &committed, 4096)?;
    tracing::info!(topic = %a.topic, name = %a.name, partitions = ?source.partitions(),
        stored = ?committed, "sink started");
    interrupt::install()?;
    let mut writer = Writer::spawn(store, committed.clone(), !a.no_ack)?;
    let mut sink = Sink {
        args: a,
        columns,
        source,
        taken: committed,
        stats: Stats::default(),
    };
    let started = Instant::now();
    let end = sink.run_loop(&mut writer);
    let (written, wrote) = writer.finish();
    sink.report(&written, started.elapsed());
    // A failed write explains a stopped loop: report it first.
    wrote?;
    match end? {
        Fill::Signal(sig) => {
            eprintln!("strom: stopped by {}", interrupt::name(sig));
            Err(crate::Exit(interrupt::exit_code(sig)).into())
        }
        Fill::Bad(msg) => anyhow::bail!(msg),
        _ => Ok(()),
    }
}

impl Sink {
    /// Fills and writes batches until the stream ends, idles, is
    /// interrupted, or meets a bad event it must stop at.
    fn run_loop(&mut self, writer: &mut Writer) -> anyhow::Result<Fill> {
        let mut last_event = Instant::now();
        loop {
            let mut batch = Batch::default();
            let fill = self.fill(&mut batch, &mut last_event, writer)?;
            self.taken.extend(&batch.next);
            let t = Instant::now();
            let sent = writer.send(batch);
            self.stats.handoff += t.elapsed();
            if !sent {
                // The writer failed; `finish` returns why.
                return Ok(Fill::End);
            }
            if !matches!(fill, Fill::Ready) {
                return Ok(fill);
            }
        }
    }

    fn fill(
        &mut self,
        batch: &mut Batch,
        last_event: &mut Instant,
        writer: &Writer,
    ) -> anyhow::Result<Fill> {
        let max = self.args.batch.get();
        let mut first: Option<Instant> = None;
        loop {
            if let Some(sig) = interrupt::received() {
                return Ok(Fill::Signal(sig));
            }
            if writer.stopped() {
                // It failed; stop filling (`finish` returns why).
                return Ok(Fill::End);
            }
            if batch.rows.len() >= max
                || first.is_some_and(|t| t.elapsed() >= self.args.flush_interval)
            {
                return Ok(Fill::Ready);
            }
            let t = Instant::now();
            let pulled = self.source.next(max - batch.rows.len(), TICK)?;
            self.stats.consume += t.elapsed();
            match pulled {
                Pulled::Events(evs) => {
                    *last_event = Instant::now();
                    first.get_or_insert(*last_event);
                    for ev in evs {
                        if let Err(msg) = self.take(batch, ev) {
                            return Ok(Fill::Bad(msg));
                        }
                    }
                }
                Pulled::Idle => {
                    if self
                        .args
                        .idle_timeout
                        .is_some_and(|d| last_event.elapsed() >= d)
                    {
                        return Ok(Fill::Idle);
                    }
                }
                Pulled::End => return Ok(Fill::End),
            }
        }
    }

    /// Adds one event to the batch; `Err` when it is bad and the sink stops.
    fn take(&mut self, batch: &mut Batch, ev: Event) -> Result<(), String> {
        let p = ev.partition;
        let due = batch.next.get(&p).or(self.taken.get(&p)).copied();
        if due.is_some_and(|n| ev.offset < n) {
            // Already written: never write an offset twice.
            tracing::debug!(
                partition = p,
                offset = ev.offset,
                "duplicate delivery dropped"
            );
            return Ok(());
        }
        let cells = ev
            .json()
            .map_err(|e| BadEvent::NotJson(e.message().to_string()))
            .and_then(|meta| to_cells(&self.columns, meta));
        match cells {
            Ok((cells, rest)) => batch.rows.push(Row {
                partition: p,
                offset: ev.offset,
                cells,
                rest,
            }),
            Err(bad) if self.args.on_bad == OnBad::Skip => {
                tracing::warn!(partition = p, offset = ev.offset, reason = %bad, "skipping bad event");
                self.stats.skipped += 1;
            }
            Err(bad) => {
                return Err(format!(
                    "event {p}/{} of topic '{}': {bad}; stopped before it (rows before it are \
                     written; a restart meets it again); fix the mapping or pass --on-bad skip",
                    ev.offset, self.args.topic
                ))
            }
        }
        batch.next.insert(p, ev.offset + 1);
        batch.last.insert(p, ev);
        Ok(())
    }

    /// The summary, one line on stdout.
    fn report(&self, w: &Written, elapsed: Duration) {
        let s = &self.stats;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let mut line = format!(
            "sink: {} rows in {} transactions, {:.2} s, {:.0} rows/s \
             (waiting for events {:.2} s, for the writer {:.2} s; COPY {:.2} s, COMMIT {:.2} s)",
            w.rows,
            w.transactions,
            secs,
            w.rows as f64 / secs,
            s.consume.as_secs_f64(),
            s.handoff.as_secs_f64(),
            w.times.copy.as_secs_f64(),
            w.times.commit.as_secs_f64()
        );
        if s.skipped > 0 {
            line.push_str(&format!("; {} bad events skipped", s.skipped));
        }
        if self.source.gaps > 0 {
            line.push_str(&format!("; {} gaps reported by Strom", self.source.gaps));
        }
        println!("{line}");
    }
}
