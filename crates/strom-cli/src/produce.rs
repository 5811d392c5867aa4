//! `strom produce TOPIC`: each non-empty stdin line is one event's JSON
//! metadata; optional data comes from a file or is generated. Prints one
//! JSON record per non-empty input line it took, in input order, naming
//! the line (1-based, counting blank lines too): `{"line":N,"partition":P,
//! "offset":O}` for a stored event, `{"line":N,"error":{"code":C,"name":
//! "...","message":"..."}}` for one that was not. So a script matches
//! every acknowledgement to its input line, and knows which lines to send
//! again. It closes the producer at the end of input (unless
//! `--keep-open`), so consumers see the end of the stream.
//!
//! Every line taken gets its record, whatever stops the run:
//! - SIGINT / SIGTERM: stop reading, wait for the events in flight, print,
//!   close, exit 130 / 143;
//! - a partition whose member is down: its events fail (error records) and
//!   the others go on; stderr sums up the failures per partition, exit 1;
//! - a line that cannot be produced: its error record, stop there, exit 1.
//!
//! In the last two cases the stream is held open so the failed lines can
//! be sent again: a producer without a lease takes over (its id is on
//! stderr; `strom topic close-producer` ends the hold), and the leased one
//! closes. By default the producer holds a lease (the server's
//! `producer_lease_ms`, or `--lease SECS`) that this process renews: once
//! the process exits (or is killed), the lease runs out and the producer
//! counts as finished, expired. `--keep-open` opens the producer without a
//! lease, so the stream stays open after the process exits until `strom
//! topic complete` or another close ends it.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use strom_client::{Acks, Data, ErrorCode, ProducerOptions, PushFuture};

use crate::interrupt;

#[derive(Args)]
#[command(
    after_help = "Output: one JSON record per non-empty input line taken, in input \
order; N is the input line number (from 1, blank lines counted):\n  \
{\"line\":N,\"partition\":P,\"offset\":O}   the line's event is stored there\n  \
{\"line\":N,\"error\":{\"code\":C,\"name\":\"...\",\"message\":\"...\"}}   it was not \
(send it again)\n\
Exit status: 0 every line stored; 1 some line failed (stderr sums up why); 130/143 stopped \
by SIGINT/SIGTERM (lines not yet read get no record)."
)]
pub struct ProduceArgs {
    topic: String,
    /// Attach this file's contents as every event's data part.
    #[arg(long, conflicts_with = "data_size")]
    data_file: Option<PathBuf>,
    /// Attach a generated data part of this many bytes to every event.
    #[arg(long)]
    data_size: Option<usize>,
    /// Send every event to this partition (overrides the topic's selector).
    #[arg(long)]
    partition: Option<u32>,
    /// Leave this producer open at end of input, without a lease: the
    /// stream does not end when this process exits.
    #[arg(long)]
    keep_open: bool,
    /// The producer's lease in seconds (default: the server's
    /// producer_lease_ms): if this process dies, its part of the stream
    /// ends this long after its last renewal.
    #[arg(long, conflicts_with = "keep_open")]
    lease: Option<f64>,
    /// Accepted for compatibility: closing at end of input is the default.
    #[arg(long, hide = true, conflicts_with = "keep_open")]
    close: bool,
    /// Largest event (metadata + data + 16 bytes of framing), in bytes; the
    /// server's max_frame_bytes must allow it too. Default 64 MiB.
    #[arg(long)]
    max_event_bytes: Option<u64>,
    /// Replicated topics: acknowledge after every in-sync copy has the
    /// event (all, the default) or after the leader's append (leader).
    #[arg(long, default_value = "all", value_parser = ["all", "leader"])]
    acks: String,
    /// Stamp batches and resend those whose answer was lost to the
    /// partition's current leader, appended once each (default: on for
    /// replicated topics).
    #[arg(long)]
    idempotent: Option<bool>,
}

/// How long the main loop waits for input before it looks at signals and
/// prints what is stored.
const TICK: Duration = Duration::from_millis(20);
/// Events in flight before the oldest is awaited.
const MAX_PENDING: usize = 8192;

/// Lines read from stdin, numbered from 1, or why reading stopped.
type Chunk = Result<Vec<(usize, String)>, ReadStop>;

/// Why reading stdin stopped early.
enum ReadStop {
    /// This input line cannot be an event (not UTF-8).
    Line(usize, String),
    /// Reading stdin failed.
    Io(anyhow::Error),
}

/// Reads stdin on its own thread, in chunks of whole lines, so the main
/// loop can stop on a signal while a read blocks.
fn spawn_reader() -> mpsc::Receiver<Chunk> {
    let (tx, rx) = mpsc::sync_channel::<Chunk>(8);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 << 10];
        let mut partial: Vec<u8> = Vec::new();
        let mut lineno = 0usize;
        let take = |bytes: &[u8], lineno: &mut usize, out: &mut Vec<(usize, String)>| {
            *lineno += 1;
            let line = std::str::from_utf8(bytes)
                .map_err(|e| ReadStop::Line(*lineno, format!("not UTF-8: {e}")))?;
            if !line.trim().is_empty() {
                out.push((*lineno, line.trim_end_matches('\r').to_string()));
            }
            Ok(())
        };
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.send(Err(ReadStop::Io(
                        anyhow::Error::new(e).context("reading stdin"),
                    )));
                    return;
                }
            };
            let mut lines = Vec::new();
            let mut rest = &buf[..n];
            let mut result = Ok(());
            while let Some(i) = rest.iter().position(|b| *b == b'\n') {
                partial.extend_from_slice(&rest[..i]);
                rest = &rest[i + 1..];
                result = take(&partial, &mut lineno, &mut lines);
                partial.clear();
                if result.is_err() {
                    break;
                }
            }
            partial.extend_from_slice(rest);
            let failed = result.is_err();
            let sent = match result {
                Ok(()) => tx.send(Ok(lines)),
                Err(e) => tx.send(Ok(lines)).and_then(|_| tx.send(Err(e))),
            };
            if sent.is_err() || failed {
                return;
            }
        }
        let mut lines = Vec::new();
        let r = if partial.is_empty() {
            Ok(())
        } else {
            take(&partial, &mut lineno, &mut lines)
        };
        let _ = tx.send(Ok(lines));
        if let Err(e) = r {
            let _ = tx.send(Err(e));
        }
    });
    rx
}

/// Prints one record per line taken, in input order, and counts failures
/// per partition.
struct Results<W: Write> {
    out: W,
    /// (input line, its event's future)
    pending: VecDeque<(usize, PushFuture)>,
    stored: u64,
    /// partition -> (events failed, the first error)
    failed: BTreeMap<u32, (u64, String)>,
}

impl<W: Write> Results<W> {
    fn settle(&mut self, line: usize, f: PushFuture) -> anyhow::Result<()> {
        let partition = f.partition();
        match f.wait() {
            Ok(id) => {
                self.stored += 1;
                writeln!(
                    self.out,
                    "{{\"line\":{line},\"partition\":{},\"offset\":{}}}",
                    id.partition, id.offset
                )?;
            }
            Err(e) => {
                let message = e.message();
                self.failure(line, e.code(), &message)?;
                let entry = self.failed.entry(partition).or_insert((0, message));
                entry.0 += 1;
            }
        }
        Ok(())
    }

    /// Prints the record of input line `line`, which was not stored.
    fn failure(&mut self, line: usize, code: ErrorCode, message: &str) -> anyhow::Result<()> {
        let record = serde_json::json!({
            "line": line,
            "error": { "code": code.0, "name": code.name(), "message": message },
        });
        writeln!(self.out, "{record}")?;
        Ok(())
    }

    /// Settles the oldest futures that are done (all of them if `all`).
    fn settle_ready(&mut self, all: bool) -> anyhow::Result<()> {
        while let Some((line, f)) = self.pending.pop_front() {
            if !all && !f.is_done() && self.pending.len() < MAX_PENDING {
                self.pending.push_front((line, f));
                break;
            }
            self.settle(line, f)?;
        }
        Ok(())
    }
}

/// After events failed: a producer without a lease that keeps the stream
/// open once this process exits, so the failed lines can be sent again;
/// returns its id. A leased producer hands over to a new one (and closes:
/// its lease would run out soon after this process exits, and that would
/// end the stream); a `--keep-open` one is such a producer already.
pub(crate) fn hold_open(
    topic: &strom_client::Topic,
    producer: &strom_client::Producer,
    keep_open: bool,
) -> anyhow::Result<u64> {
    if keep_open {
        return Ok(producer.id());
    }
    let holder = topic.producer_with(ProducerOptions {
        lease: None,
        ..Default::default()
    })?;
    producer.close().context("closing the producer")?;
    Ok(holder.id())
}

pub fn run(a: ProduceArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let topic = d.open_topic(&a.topic)?;
    let mut opts = ProducerOptions {
        acks: if a.acks == "leader" {
            Acks::Leader
        } else {
            Acks::All
        },
        idempotent: a.idempotent,
        ..Default::default()
    };
    if let Some(n) = a.max_event_bytes {
        anyhow::ensure!(n > 0, "--max-event-bytes must be positive");
        opts.batch.max_event_bytes = Some(n);
    }
    opts.lease = match (a.keep_open, a.lease) {
        (true, _) => None,
        (false, None) => Some(Duration::ZERO),
        (false, Some(s)) => {
            anyhow::ensure!(
                s.is_finite() && s > 0.0,
                "--lease must be a positive number of seconds"
            );
            Some(Duration::from_secs_f64(s))
        }
    };
    let limit = opts.batch.max_event_bytes.unwrap_or(u64::MAX);
    let producer = topic.producer_with(opts)?;
    let data = match (&a.data_file, a.data_size) {
        (Some(f), _) => Bytes::from(
            std::fs::read(f).with_context(|| format!("reading data file {}", f.display()))?,
        ),
        (None, Some(n)) => Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
        (None, None) => Bytes::new(),
    };
    let input = spawn_reader();
    interrupt::install()?;
    let mut results = Results {
        out: std::io::BufWriter::new(std::io::stdout().lock()),
        pending: VecDeque::new(),
        stored: 0,
        failed: BTreeMap::new(),
    };
    // Why the run stopped before the end of input: (input line, code, what).
    let mut bad_line: Option<(Option<usize>, ErrorCode, String)> = None;
    'input: while interrupt::received().is_none() {
        let lines = match input.recv_timeout(TICK) {
            Ok(Ok(lines)) => lines,
            Ok(Err(ReadStop::Line(n, why))) => {
                bad_line = Some((Some(n), ErrorCode::INVALID_ARGUMENT, why));
                break;
            }
            Ok(Err(ReadStop::Io(e))) => {
                bad_line = Some((None, ErrorCode::INVALID_ARGUMENT, format!("{e:#}")));
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                results.settle_ready(false)?;
                results.out.flush()?;
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        for (n, line) in lines {
            let size = line.len() as u64 + data.len() as u64 + 16;
            match producer.push_with(line, Data::from(data.clone()), a.partition, &[]) {
                Ok(f) => results.pending.push_back((n, f)),
                Err(e) => {
                    let why = if e.code() == ErrorCode::BATCH_TOO_LARGE && size > limit {
                        format!(
                            "the event is {size} bytes, over the limit of {limit} bytes; \
                             raise it with --max-event-bytes (the server's max_frame_bytes \
                             must allow it too) or split the data"
                        )
                    } else {
                        // Over what the server accepts, or another error: the
                        // client's message names the limit or the cause.
                        e.message()
                    };
                    bad_line = Some((Some(n), e.code(), why));
                    break 'input;
                }
            }
        }
        results.settle_ready(false)?;
    }
    // Stop reading; whatever is in flight is stored or fails, and is printed.
    drop(input);
    let _ = producer.flush(); // failures are counted per event below
    results.settle_ready(true)?;
    if let Some((Some(n), code, why)) = &bad_line {
        // In input order: every earlier line's record is printed by now.
        results.failure(*n, *code, why)?;
    }
    results.out.flush()?;
    let signal = interrupt::received();
    for (p, (count, error)) in &results.failed {
        eprintln!("strom: partition {p}: {count} events failed: {error}");
    }
    match &bad_line {
        Some((Some(n), _, why)) => eprintln!("strom: error: line {n}: {why}"),
        Some((None, _, why)) => eprintln!("strom: error: {why}"),
        None => {}
    }
    if signal.is_none() && (bad_line.is_some() || !results.failed.is_empty()) {
        let failed: u64 = results.failed.values().map(|f| f.0).sum();
        eprintln!(
            "strom: {} events stored, {failed} failed (one record per line on stdout)",
            results.stored
        );
        let t = &a.topic;
        match hold_open(&topic, &producer, a.keep_open) {
            Ok(held) => eprintln!(
                "strom: producer {held} holds the stream open, so the failed lines can be sent \
                 again with `strom produce {t}`; then `strom topic close-producer {t} {held}` \
                 ends the hold (or `strom topic complete {t}` ends the stream)"
            ),
            Err(e) => eprintln!(
                "strom: could not hold the stream open ({e:#}): this producer's lease runs out \
                 soon after this process exits, and that ends the stream unless another producer \
                 of '{t}' is open by then"
            ),
        }
        return Err(crate::Exit(1).into());
    }
    if !a.keep_open || signal.is_some() {
        producer.close().context("closing the producer")?;
    }
    if let Some(sig) = signal {
        eprintln!(
            "strom: stopped by {}; {} events stored (one record per line on stdout), producer closed",
            interrupt::name(sig),
            results.stored
        );
        return Err(crate::Exit(interrupt::exit_code(sig)).into());
    }
    Ok(())
}
