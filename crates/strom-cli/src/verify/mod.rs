//! `strom verify --topic T --name N`: reads every partition of a
//! telemetry topic written by `strom gen` from the beginning, until the
//! end of the stream (or `--idle-timeout` seconds without an event), and
//! checks for lost, duplicate, out-of-order and malformed events (see
//! [`check`] for what is exact). Prints a report on stdout (JSON with
//! `--json`) and exits 1 if anything was wrong.
//!
//! The checks need the whole history of each device, so a run always
//! starts at the beginning of every partition, whatever the name's
//! committed offset; it acks as it goes under N only so `strom status`
//! shows its progress (a restart reads everything again).

mod check;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use strom_client::{ConsumerOptions, Event, Selection, StartPos};

use crate::gen::telemetry::SchemaArgs;
use crate::interrupt;
use check::{Checker, Kind};

/// How long a pull waits before the loop looks at signals and the clock.
const TICK: Duration = Duration::from_millis(50);
/// Events taken per pull.
const PULL_MAX: usize = 4096;
/// How often the latest event of each partition is acked.
const ACK_EVERY: Duration = Duration::from_secs(1);
/// Largest `--id-window`.
const MAX_ID_WINDOW: usize = 100_000_000;

#[derive(Args)]
pub struct VerifyArgs {
    /// The topic to check.
    #[arg(long)]
    topic: String,
    /// Consumer name to read (and ack) under.
    #[arg(long)]
    name: String,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Stop once no event came for this many seconds (default: wait for
    /// the end of the stream).
    #[arg(long)]
    idle_timeout: Option<f64>,
    /// Event ids remembered to find duplicate event_ids (the most recent
    /// ones; about 50 bytes each). 0 turns that check off.
    #[arg(long, default_value_t = 1_000_000)]
    id_window: usize,
    #[command(flatten)]
    schema: SchemaArgs,
}

pub fn run(a: VerifyArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.id_window <= MAX_ID_WINDOW,
        "--id-window must be at most {MAX_ID_WINDOW}"
    );
    let idle = a
        .idle_timeout
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                anyhow::anyhow!("--idle-timeout takes a number of seconds >= 0, not {s}")
            })
        })
        .transpose()?;
    let d = crate::connect(group_file)?;
    let topic = d
        .open_topic(&a.topic)
        .with_context(|| format!("opening topic '{}'", a.topic))?;
    let consumer = topic.consumer_with(
        &a.name,
        ConsumerOptions {
            start: StartPos::Beginning,
            selector: Arc::new(Selection::None),
            ..Default::default()
        },
    )?;
    interrupt::install()?;
    let mut checker = Checker::new(a.schema.clone(), a.id_window);
    let mut acks = Acks::default();
    let mut last_event = Instant::now();
    let end = loop {
        if let Some(sig) = interrupt::received() {
            break interrupt::name(sig);
        }
        match consumer.pull_many(PULL_MAX, TICK)? {
            None => break "end_of_stream",
            Some(events) if events.is_empty() => {
                if idle.is_some_and(|i| last_event.elapsed() >= i) {
                    break "idle_timeout";
                }
            }
            Some(events) => {
                last_event = Instant::now();
                for ev in events {
                    checker.check(ev.partition, ev.offset, ev.raw());
                    acks.hold(ev);
                }
            }
        }
        acks.maybe_flush(false);
    };
    acks.maybe_flush(true);
    checker.finish();
    print_report(&checker, end, a.json, a.id_window)?;
    if let Some(sig) = interrupt::received() {
        return Err(crate::Exit(interrupt::exit_code(sig)).into());
    }
    if checker.total_violations() > 0 {
        eprintln!(
            "strom: verify: {} violations in {} events",
            checker.total_violations(),
            checker.events
        );
        return Err(crate::Exit(1).into());
    }
    Ok(())
}

/// The latest event of each partition, acked about once a second (an ack
/// covers every earlier event of its partition).
#[derive(Default)]
struct Acks {
    latest: BTreeMap<u32, Event>,
    last: Option<Instant>,
}

impl Acks {
    fn hold(&mut self, ev: Event) {
        self.latest.insert(ev.partition, ev);
    }

    fn maybe_flush(&mut self, wait: bool) {
        let due = self.last.is_none_or(|t| t.elapsed() >= ACK_EVERY);
        if !due && !wait {
            return;
        }
        self.last = Some(Instant::now());
        for (p, ev) in std::mem::take(&mut self.latest) {
            let f = ev.ack();
            if wait {
                if let Err(e) = f.wait_timeout(Some(Duration::from_secs(5))) {
                    tracing::warn!(partition = p, error = %e, "ack failed");
                }
            }
        }
    }
}

fn print_report(c: &Checker, end: &str, json: bool, id_window: usize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", c.to_json(end, id_window))?;
        return Ok(out.flush()?);
    }
    let verdict = if c.total_violations() == 0 {
        "OK"
    } else {
        "FAILED"
    };
    writeln!(
        out,
        "verify: {verdict}: {} events from {} devices (ended by {end})",
        c.events,
        c.devices()
    )?;
    for k in Kind::ALL {
        writeln!(out, "  {:<10} {}", k.name(), c.count(k))?;
    }
    for v in c.examples() {
        writeln!(
            out,
            "  {} at partition {} offset {}: {}",
            v.kind.name(),
            v.partition,
            v.offset,
            v.detail
        )?;
    }
    Ok(out.flush()?)
}
