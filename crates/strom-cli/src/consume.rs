//! `strom consume TOPIC --name N`: prints one JSON line per event on stdout
//! and acks what it printed. Without `--follow` it stops once it has read
//! what the topic held when it started; with `--follow` it waits for more
//! until the stream ends.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use strom_client::{ConsumerOptions, Next, Selection, StartPos};

#[derive(Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Consumer name; acks are stored under it.
    #[arg(long)]
    name: String,
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
    /// Do not ack consumed events.
    #[arg(long)]
    no_ack: bool,
}

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

pub fn run(a: ConsumeArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let topic = d.open_topic(&a.topic)?;
    let info = topic.describe()?;
    let partitions = a.partitions.clone();
    let opts = ConsumerOptions {
        start: parse_from(&a.from)?,
        partitions: partitions.clone(),
        selector: std::sync::Arc::new(if a.data {
            Selection::All
        } else {
            Selection::None
        }),
        ..Default::default()
    };
    let consumer = topic.consumer_with(&a.name, opts)?;
    // Without --follow, stop at each partition's end as of now.
    let mut remaining: Vec<u64> = info.partitions.iter().map(|p| p.next_offset).collect();
    let wanted = |p: u32| partitions.as_ref().is_none_or(|v| v.contains(&p));
    let mut caught_up: Vec<bool> = info.partitions.iter().map(|p| !wanted(p.id)).collect();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut count = 0u64;
    let mut acks = std::collections::HashMap::new();
    loop {
        if a.max.is_some_and(|m| count >= m) {
            break;
        }
        if !a.follow && caught_up.iter().all(|c| *c) {
            break;
        }
        let next = if a.follow {
            consumer.pull().wait()?
        } else {
            match consumer.pull_timeout(Duration::from_millis(500)) {
                Ok(n) => n,
                Err(e) if e.code() == strom_client::ErrorCode::TIMEOUT => {
                    // Nothing more arrived: whatever is missing was removed by retention.
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let ev = match next {
            Next::Event(ev) => ev,
            Next::EndOfStream => break,
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
        if a.data {
            let data = ev.data_vec();
            let hex: String = data.iter().take(32).map(|b| format!("{b:02x}")).collect();
            line["data_prefix_hex"] = serde_json::Value::String(hex);
        }
        writeln!(out, "{line}")?;
        let p = ev.partition as usize;
        if ev.offset + 1 >= remaining[p] {
            caught_up[p] = true;
            remaining[p] = 0;
        }
        count += 1;
        if !a.no_ack {
            acks.insert(ev.partition, ev.ack());
        }
    }
    out.flush()?;
    drop(out);
    for (_, ack) in acks {
        ack.wait()?;
    }
    eprintln!("consumed {count} events");
    Ok(())
}
