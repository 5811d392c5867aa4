//! `strom produce TOPIC`: each non-empty stdin line is one event's JSON
//! metadata; optional data comes from a file or is generated. Prints one
//! JSON line per event with its partition and offset, in input order.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use strom_client::{Data, PushFuture};

#[derive(Args)]
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
    /// Close this producer's part of the stream at end of input.
    #[arg(long)]
    close: bool,
}

pub fn run(a: ProduceArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let topic = d.open_topic(&a.topic)?;
    let producer = topic.producer()?;
    let data = match (&a.data_file, a.data_size) {
        (Some(f), _) => Bytes::from(
            std::fs::read(f).with_context(|| format!("reading data file {}", f.display()))?,
        ),
        (None, Some(n)) => Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
        (None, None) => Bytes::new(),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut pending: VecDeque<PushFuture> = VecDeque::new();
    let emit = |f: PushFuture, out: &mut dyn Write| -> anyhow::Result<()> {
        let id = f.wait()?;
        writeln!(
            out,
            "{{\"partition\":{},\"offset\":{}}}",
            id.partition, id.offset
        )?;
        Ok(())
    };
    let mut failure = None;
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        match producer.push_with(line, Data::from(data.clone()), a.partition, &[]) {
            Ok(f) => pending.push_back(f),
            Err(e) => {
                failure = Some(anyhow::anyhow!("line {}: {e}", n + 1));
                break;
            }
        }
        while pending.len() > 8192 {
            emit(pending.pop_front().expect("non-empty"), &mut out)?;
        }
    }
    producer.flush()?;
    for f in pending {
        emit(f, &mut out)?;
    }
    out.flush()?;
    if let Some(e) = failure {
        return Err(e.context("stopped at the first bad line; every earlier event was produced"));
    }
    if a.close {
        producer.close()?;
    }
    Ok(())
}
