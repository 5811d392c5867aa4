//! `strom consume TOPIC --name N`: prints one JSON line per event on stdout
//! and acks what the reader took. Without `--follow` it stops once it has
//! read what the topic held when it started; with `--follow` it waits for
//! more until the stream ends. `--select EXPR` fetches only what a data
//! selector picks of each event (the textual form of
//! `strom_client::select::Selector`).
//!
//! Acks follow the output, never lead it: lines are written in batches
//! (see [`out::Output`]), and an event is acked only once its whole line
//! left this process, and, when stdout is a pipe, once the reader took it
//! out of the pipe. SIGINT and SIGTERM stop the loop; a closed pipe stops
//! it quietly. Either way what was delivered is acked, and nothing else.
//!
//! With `--group G` the process is a member of consumer group G: with
//! `--mode shared` it gets events no other member holds and acks each one
//! (lines then carry `deliveries`); without `--follow` it stops once
//! nothing has come for a moment.

mod out;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use strom_client::select::Selector;
use strom_client::{ConsumerOptions, ErrorCode, Next, Selection, StartPos};
use strom_proto::PartitionStatus;

use crate::interrupt;
use out::{Output, Stop};

#[derive(Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Consumer name; acks are stored under it. With --group, the
    /// member's label instead (default host:pid).
    #[arg(long, required_unless_present = "group")]
    name: Option<String>,
    /// Join this consumer group instead of reading as a name.
    #[arg(long)]
    group: Option<String>,
    /// partitioned (members split the partitions) | shared (any member
    /// gets any event; each is acked on its own).
    #[arg(long, default_value = "partitioned", requires = "group")]
    mode: strom_client::ConsumerGroupMode,
    /// Seconds a silent member keeps its place in the group.
    #[arg(long, requires = "group")]
    session_timeout: Option<f64>,
    /// Shared groups: seconds before an unacked event goes to another member.
    #[arg(long, requires = "group")]
    visibility_timeout: Option<f64>,
    /// Shared groups: deliveries before an event goes to the dead-letter topic.
    #[arg(long, requires = "group")]
    max_deliveries: Option<u32>,
    /// Shared groups: the dead-letter topic (default TOPIC.GROUP.dlq).
    #[arg(long, requires = "group")]
    dead_letter: Option<String>,
    /// Events each partition may push ahead of demand.
    #[arg(long)]
    prefetch: Option<u32>,
    /// committed | beginning | end | <offset> | ts:<microseconds>
    #[arg(long, default_value = "committed")]
    from: String,
    /// Keep waiting for new events until the stream ends.
    #[arg(long)]
    follow: bool,
    /// Stop after this many events.
    #[arg(long)]
    max: Option<u64>,
    /// Only these partitions (comma separated).
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<u32>>,
    /// Fetch each event's data and print a hex prefix of it.
    #[arg(long)]
    data: bool,
    /// Fetch only the part of each event's data this selector picks, and
    /// print `fetched_size` and a hex prefix of it: all | none |
    /// bytes[START:STOP] | an N-d sub-array of array payloads such as
    /// '[:, 10:20, ::2]' | FIELD OP VALUE [then DATA], a comparison on a
    /// metadata field (OP: == != < <= > >=) choosing what to fetch of
    /// matching events (all of it unless `then` says) and nothing of others.
    #[arg(long, value_name = "EXPR")]
    select: Option<Selector>,
    /// Do not ack consumed events.
    #[arg(long)]
    no_ack: bool,
}

/// How long a pull waits before the loop looks at signals and flushes.
const TICK: Duration = Duration::from_millis(20);
/// Without `--follow`: quiet time after which what is missing is taken to
/// be gone (retention) or unreachable (reported).
const IDLE_END: Duration = Duration::from_millis(500);
/// How long an interrupted run waits for the reader to take what was written.
const DRAIN_ON_SIGNAL: Duration = Duration::from_secs(2);

fn parse_from(s: &str) -> anyhow::Result<StartPos> {
    Ok(match s {
        "committed" => StartPos::Committed,
        "beginning" => StartPos::Beginning,
        "end" => StartPos::End,
        _ => match s.strip_prefix("ts:") {
            Some(ts) => StartPos::Timestamp(
                ts.parse()
                    .map_err(|_| anyhow::anyhow!("bad timestamp in --from {s}"))?,
            ),
            None => StartPos::Offset(s.parse().map_err(|_| {
                anyhow::anyhow!(
                    "--from takes committed, beginning, end, an offset or ts:<µs>, not '{s}'"
                )
            })?),
        },
    })
}

/// The group options from the command line; `opts` carries prefetch and
/// selector (a shared member defaults to a prefetch of 64).
fn group_options(
    a: &ConsumeArgs,
    mut opts: ConsumerOptions,
) -> anyhow::Result<strom_client::GroupOptions> {
    let secs = |v: Option<f64>, what: &str| -> anyhow::Result<Option<Duration>> {
        v.map(|s| {
            Duration::try_from_secs_f64(s)
                .map_err(|_| anyhow::anyhow!("--{what} takes a number of seconds, not {s}"))
        })
        .transpose()
    };
    let mut g = strom_client::GroupOptions {
        mode: a.mode,
        label: a.name.clone(),
        max_deliveries: a.max_deliveries,
        dead_letter: a.dead_letter.clone(),
        ..Default::default()
    };
    if a.from != "committed" {
        g.start = opts.start;
    }
    if let Some(d) = secs(a.session_timeout, "session-timeout")? {
        g.session_timeout = d;
    }
    if let Some(d) = secs(a.visibility_timeout, "visibility-timeout")? {
        g.visibility_timeout = d;
    }
    if a.prefetch.is_none() {
        opts.prefetch = g.consumer.prefetch;
    }
    opts.partitions = None;
    opts.start = StartPos::Committed;
    g.consumer = opts;
    Ok(g)
}

/// Errors a pull reports for one partition while the others carry on.
pub(crate) fn partition_unavailable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::CONNECTION_FAILED
            | ErrorCode::CONNECTION_CLOSED
            | ErrorCode::PARTITION_UNAVAILABLE
            | ErrorCode::PARTITION_FAILED
    )
}

pub fn run(a: ConsumeArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let start = parse_from(&a.from)?;
    let d = crate::connect(group_file)?;
    let topic = d.open_topic(&a.topic)?;
    let info = topic.describe()?;
    let partitions = a.partitions.clone();
    let wanted = |p: u32| partitions.as_ref().is_none_or(|v| v.contains(&p));
    if let StartPos::Offset(n) = start {
        for p in info.partitions.iter().filter(|p| wanted(p.id)) {
            anyhow::ensure!(
                p.status != PartitionStatus::Ok || n <= p.next_offset,
                "--from {n} is past the end of partition {} of topic '{}' (next offset {}); \
                 nothing there to read",
                p.id,
                a.topic,
                p.next_offset
            );
        }
    }
    let mut opts = ConsumerOptions {
        start,
        partitions: partitions.clone(),
        selector: match &a.select {
            Some(s) => std::sync::Arc::new(s.clone()),
            None if a.data => std::sync::Arc::new(Selection::All),
            None => std::sync::Arc::new(Selection::None),
        },
        ..Default::default()
    };
    if let Some(p) = a.prefetch {
        opts.prefetch = p;
    }
    let consumer = match &a.group {
        Some(g) => topic.consumer_group(g, group_options(&a, opts)?)?,
        None => topic.consumer_with(a.name.as_deref().unwrap_or_default(), opts)?,
    };
    let grouped = a.group.is_some();
    interrupt::install()?;
    // Without --follow, stop at each partition's end as of now (a group
    // member gets only part of it: it stops when nothing more comes).
    let mut remaining: Vec<u64> = info
        .partitions
        .iter()
        .map(|p| if grouped { u64::MAX } else { p.next_offset })
        .collect();
    let mut caught_up: Vec<bool> = info.partitions.iter().map(|p| !wanted(p.id)).collect();
    let mut out = Output::new(
        !a.no_ack,
        grouped && a.mode == strom_client::ConsumerGroupMode::Shared,
    );
    let mut count = 0u64;
    let mut unavailable = 0u32;
    let mut idle_since: Option<Instant> = None;
    let stop = loop {
        if let Some(sig) = interrupt::received() {
            break Some(Stop::Signal(sig));
        }
        if a.max.is_some_and(|m| count >= m) || (!a.follow && caught_up.iter().all(|c| *c)) {
            break None;
        }
        let next = match consumer.pull_timeout(TICK) {
            Ok(n) => n,
            Err(e) if e.code() == ErrorCode::TIMEOUT => {
                if let Err(s) = out.flush_and_ack() {
                    break Some(s);
                }
                let since = *idle_since.get_or_insert_with(Instant::now);
                if !a.follow && since.elapsed() >= IDLE_END {
                    // Nothing more arrived: what is missing was removed by
                    // retention, or sits on an unavailable partition.
                    break None;
                }
                continue;
            }
            Err(e) if partition_unavailable(e.code()) => {
                // The client reports each unreachable partition once and
                // keeps retrying it; the others carry on.
                unavailable += 1;
                eprintln!("strom: partition unavailable: {}", e.message());
                continue;
            }
            // An explicit gap (dropped by the overflow policy, or damaged
            // on disk): say so, and carry on after it.
            Err(
                e @ (strom_client::Error::DataExpired {
                    partition, last, ..
                }
                | strom_client::Error::DataCorrupt {
                    partition, last, ..
                }),
            ) => {
                eprintln!("strom: warning: {}", e.message());
                let p = partition as usize;
                if remaining.get(p).is_some_and(|end| last + 1 >= *end) {
                    caught_up[p] = true;
                }
                continue;
            }
            Err(e) if e.code() == ErrorCode::OFFSET_OUT_OF_RANGE => {
                eprintln!("strom: warning: {}", e.message());
                continue;
            }
            Err(e) => break Some(Stop::Failed(e.into())),
        };
        idle_since = None;
        let mut ev = match next {
            Next::Event(ev) => ev,
            Next::EndOfStream => break None,
        };
        let meta: serde_json::Value = ev.json().unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(ev.raw()).into_owned())
        });
        let mut line = serde_json::json!({
            "partition": ev.partition,
            "offset": ev.offset,
            "timestamp_us": ev.timestamp_us,
            "metadata": meta,
            "data_size": ev.data_size(),
        });
        if a.select.is_some() {
            line["fetched_size"] = ev.fetched_len().into();
        }
        if grouped {
            line["deliveries"] = ev.deliveries().into();
        }
        if a.data || a.select.is_some() {
            let data = ev.data_vec();
            let hex: String = data.iter().take(32).map(|b| format!("{b:02x}")).collect();
            line["data_prefix_hex"] = serde_json::Value::String(hex);
        }
        // The data is printed; only the ack handle is kept.
        drop(ev.take_buffers());
        let p = ev.partition as usize;
        if let Some(r) = remaining.get_mut(p) {
            if ev.offset + 1 >= *r {
                caught_up[p] = true;
                *r = 0;
            }
        }
        count += 1;
        if let Err(s) = out.line(&line, ev) {
            break Some(s);
        }
    };
    finish(out, stop, unavailable)
}

/// Writes what is buffered, waits for the reader as the way the run ended
/// allows, acks what was delivered, and picks the exit.
fn finish(mut out: Output, stop: Option<Stop>, unavailable: u32) -> anyhow::Result<()> {
    let stop = stop.or_else(|| out.flush_and_ack().err());
    let stop = match stop {
        None => out.drain(None).err(),
        Some(Stop::Signal(sig)) => {
            // Best effort: the reader may still take what is buffered.
            let _ = out.write_pending(true);
            let _ = out.drain(Some(Instant::now() + DRAIN_ON_SIGNAL));
            Some(Stop::Signal(sig))
        }
        other => other,
    };
    out.ack_delivered();
    let acked = out.wait_acks();
    let printed = out.delivered_events();
    match stop {
        Some(Stop::BrokenPipe) => {
            // Quiet, like any filter whose reader went away.
            Err(crate::Exit(141).into())
        }
        Some(Stop::Signal(sig)) => {
            eprintln!(
                "strom: stopped by {}; consumed {printed} events",
                interrupt::name(sig)
            );
            acked?;
            Err(crate::Exit(interrupt::exit_code(sig)).into())
        }
        Some(Stop::Failed(e)) => {
            eprintln!("strom: consumed {printed} events before the error below");
            if let Err(a) = acked {
                eprintln!("strom: error: {a:#}");
            }
            Err(e)
        }
        None => {
            acked?;
            eprintln!("strom: consumed {printed} events");
            if unavailable > 0 {
                eprintln!(
                    "strom: {unavailable} partition(s) were unavailable; their events were not read"
                );
                return Err(crate::Exit(1).into());
            }
            Ok(())
        }
    }
}
