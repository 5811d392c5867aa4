//! `strom topic ...`: administer topics.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use strom_client::{Durability, Overflow, PartitionType, TopicInfo, TopicSpec};

#[derive(Subcommand)]
pub enum TopicCmd {
    /// Create a topic.
    Create(Box<CreateArgs>),
    /// List topics.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show a topic's spec, partitions, offsets and consumer positions.
    Describe {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// End a topic's stream: consumers see end of stream after what was written.
    Complete { name: String },
    /// Close one producer's part of a topic's stream on its behalf: a
    /// producer that died without closing, or the producer `strom produce`
    /// left holding the stream open after events failed (its id is on
    /// stderr). The stream ends once every producer closed.
    CloseProducer { name: String, producer: u64 },
    /// Delete a topic and its data.
    Delete { name: String },
    /// Add partitions to a topic; running producers and consumers pick them up.
    AddPartitions {
        name: String,
        #[arg(long)]
        count: u32,
        /// Place the new partitions on this member (default: round-robin).
        #[arg(long)]
        server: Option<u32>,
    },
    /// Write a topic's events out as plain files (a JSON-lines index, raw
    /// data or .npy arrays) that tools read without Strom (docs/stage-out.md).
    StageOut(Box<crate::stage_out::StageOutArgs>),
    /// Produce events from an HDF5 dataset, one per row or per --chunk
    /// rows, with their dtype and shape (docs/hdf5.md).
    Load(Box<crate::load::LoadArgs>),
}

#[derive(Args)]
pub struct CreateArgs {
    name: String,
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// memory | file
    #[arg(long = "type", default_value = "file")]
    partition_type: String,
    /// always | never | interval:<ms>
    #[arg(long, default_value = "always")]
    durability: String,
    /// none | json | json-schema
    #[arg(long, default_value = "none")]
    validator: String,
    /// Inline JSON schema, or @FILE to read it from a file.
    #[arg(long)]
    schema: Option<String>,
    /// round-robin | hash:<field> | explicit
    #[arg(long, default_value = "round-robin")]
    selector: String,
    /// json | binary
    #[arg(long, default_value = "json")]
    serializer: String,
    #[arg(long)]
    retention_bytes: Option<u64>,
    #[arg(long)]
    retention_ms: Option<u64>,
    #[arg(long)]
    segment_bytes: Option<u64>,
    /// What a full memory partition does: block (producers wait for
    /// consumers to ack; the default) | drop-oldest (readers that fall
    /// behind get a DATA_EXPIRED gap). Memory topics only.
    #[arg(long, value_parser = Overflow::parse)]
    overflow: Option<Overflow>,
    /// Place every partition on this member (default: round-robin over live members).
    #[arg(long)]
    server: Option<u32>,
    /// Copies of each partition on distinct members (docs/replication.md).
    #[arg(long, default_value_t = 1)]
    replication_factor: u32,
    /// In-sync copies an acks=all push needs (default: a majority).
    #[arg(long)]
    min_in_sync: Option<u32>,
    /// How producers compress each event's data part: none | zstd |
    /// zstd:<1..22> | lz4 | lz4:<0..12> (docs/compression.md).
    #[arg(long, default_value = "none")]
    compression: String,
    /// true | false: copy closed segments to the server's tier (default:
    /// when the server has one; docs/tiering.md).
    #[arg(long)]
    tier: Option<bool>,
    /// Bytes of tiered segments kept locally (default: the server's).
    #[arg(long)]
    local_retention_bytes: Option<u64>,
    /// Age in ms past which tiered segments are dropped locally.
    #[arg(long)]
    local_retention_ms: Option<u64>,
}

pub fn run(cmd: TopicCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    // Load checks its source file, and stage-out its options, before
    // either connects.
    let cmd = match cmd {
        TopicCmd::Load(a) => return crate::load::run(*a, group_file),
        TopicCmd::StageOut(a) => {
            crate::stage_out::check_args(&a)?;
            TopicCmd::StageOut(a)
        }
        cmd => cmd,
    };
    let d = crate::connect(group_file)?;
    match cmd {
        TopicCmd::Create(a) => {
            let schema = match a.schema {
                Some(s) if s.starts_with('@') => Some(
                    std::fs::read_to_string(&s[1..])
                        .with_context(|| format!("reading schema file {}", &s[1..]))?,
                ),
                s => s,
            };
            let partition_type =
                PartitionType::parse(&a.partition_type).map_err(anyhow::Error::msg)?;
            let overflow = a.overflow;
            if overflow.is_some() && partition_type != PartitionType::Memory {
                anyhow::bail!(
                    "--overflow applies only to memory topics (--type memory); file partitions keep their retention (--retention-bytes, --retention-ms)"
                );
            }
            let spec = TopicSpec {
                partition_type,
                overflow,
                durability: Durability::parse(&a.durability).map_err(anyhow::Error::msg)?,
                validator: a.validator,
                schema,
                selector: a.selector,
                serializer: a.serializer,
                retention_bytes: a.retention_bytes,
                retention_ms: a.retention_ms,
                segment_bytes: a.segment_bytes,
                replication_factor: a.replication_factor,
                min_in_sync: a.min_in_sync.unwrap_or(0),
                compression: match a.compression.as_str() {
                    "none" => String::new(),
                    c => c.to_string(),
                },
                tier: a.tier,
                local_retention_bytes: a.local_retention_bytes,
                local_retention_ms: a.local_retention_ms,
                ..TopicSpec::new(a.name, a.partitions)
            };
            let replicated = spec.replicas() > 1;
            let min_in_sync = spec.min_in_sync_replicas();
            let (ptype, durability) = (spec.partition_type, spec.durability);
            let t = d.create_topic_on(spec, a.server)?;
            if d.is_kafka() {
                // The Kafka cluster's own settings decide what an ack means.
                eprintln!(
                    "created topic '{}' with {} partitions on the Kafka cluster; its brokers' settings (replication, min.insync.replicas, flush) decide what an ack promises",
                    t.name(),
                    t.partitions()
                );
            } else {
                eprintln!(
                    "created topic '{}' with {} {} partitions; {}",
                    t.name(),
                    t.partitions(),
                    ptype.as_str(),
                    promise(ptype, durability)
                );
                if replicated {
                    eprintln!(
                        "each partition has {} copies on distinct members; an acks=all push (the default) is acknowledged once every in-sync copy has it, and needs {min_in_sync} in sync",
                        t.info().partitions.first().map_or(0, |p| p.replicas.len())
                    );
                }
            }
        }
        TopicCmd::List { json } => {
            let topics = d.list_topics()?;
            if json {
                let v: Vec<_> = topics.iter().map(|t| info_json(t, None)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{:<32} {:>10} {:>7} {:>12} {:>7}",
                    "TOPIC", "PARTITIONS", "TYPE", "EVENTS", "ENDED"
                );
                for t in topics {
                    let events: u64 = t
                        .partitions
                        .iter()
                        .map(|p| p.next_offset - p.first_offset)
                        .sum();
                    println!(
                        "{:<32} {:>10} {:>7} {:>12} {:>7}",
                        t.spec.name,
                        t.partitions.len(),
                        t.spec.partition_type.as_str(),
                        events,
                        t.state.ended
                    );
                }
            }
        }
        TopicCmd::Describe { name, json } => {
            let info = d.describe(&name)?;
            let mut consumers = Vec::new();
            for p in &info.partitions {
                consumers.push(
                    d.consumer_offsets_at(&p.addr, &name, p.id)
                        .unwrap_or_default(),
                );
            }
            let v = info_json(&info, Some(&consumers));
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_describe(&info, &consumers);
            }
        }
        TopicCmd::Complete { name } => {
            d.open_topic(&name)?.complete()?;
            eprintln!("topic '{name}' completed");
        }
        TopicCmd::CloseProducer { name, producer } => {
            let t = d.open_topic(&name)?;
            t.close_producer(producer)?;
            let state = t.describe()?.state;
            eprintln!(
                "closed producer {producer} of topic '{name}'; {}",
                if state.ended {
                    "every producer has closed: the stream has ended".to_string()
                } else {
                    format!("{} producers still open", state.open_producers)
                }
            );
        }
        TopicCmd::AddPartitions {
            name,
            count,
            server,
        } => {
            let info = d.add_partitions(&name, count, server)?;
            eprintln!(
                "topic '{name}' now has {} partitions",
                info.partitions.len()
            );
        }
        TopicCmd::StageOut(a) => crate::stage_out::run(*a, &d)?,
        TopicCmd::Load(_) => unreachable!("handled before connecting"),
        TopicCmd::Delete { name } => {
            d.delete_topic(&name)?;
            eprintln!("deleted topic '{name}'");
        }
    }
    Ok(())
}

fn info_json(t: &TopicInfo, consumers: Option<&[Vec<(String, u64)>]>) -> serde_json::Value {
    let s = &t.spec;
    serde_json::json!({
        "name": s.name,
        "partition_type": s.partition_type.as_str(),
        "durability": s.durability.to_string(),
        "validator": s.validator,
        "schema": s.schema,
        "selector": s.selector,
        "serializer": s.serializer,
        "retention_bytes": s.retention_bytes,
        "retention_ms": s.retention_ms,
        "overflow": s.effective_overflow().map(Overflow::as_str),
        "compression": compression(s),
        "state": {
            "open_producers": t.state.open_producers,
            "closed_producers": t.state.closed_producers,
            "expired_producers": t.state.expired_producers,
            "ended": t.state.ended,
        },
        "partitions": t.partitions.iter().enumerate().map(|(i, p)| serde_json::json!({
            "id": p.id,
            "member": p.member,
            "addr": p.addr,
            "first_offset": p.first_offset,
            "next_offset": p.next_offset,
            "dropped_events": p.dropped_events,
            "consumers": consumers.and_then(|c| c.get(i)).map(|c| c.iter().map(|(n, o)| serde_json::json!({
                "name": n, "committed": o, "lag": p.next_offset.saturating_sub(*o)
            })).collect::<Vec<_>>()),
        })).collect::<Vec<_>>(),
    })
}

/// The topic's compression option as it is in force (`none`, `zstd:3`, ...).
fn compression(s: &TopicSpec) -> String {
    strom_client::Compression::parse(&s.compression)
        .map_or_else(|_| s.compression.clone(), |c| c.to_string())
}

fn print_describe(t: &TopicInfo, consumers: &[Vec<(String, u64)>]) {
    let s = &t.spec;
    println!("topic       {}", s.name);
    println!(
        "type        {}  durability {}",
        s.partition_type.as_str(),
        s.durability
    );
    println!(
        "policies    validator={} selector={} serializer={}",
        s.validator, s.selector, s.serializer
    );
    println!("compression {}", compression(s));
    if let Some(o) = s.effective_overflow() {
        let how = if s.overflow.is_some() {
            ""
        } else {
            " (default)"
        };
        println!("overflow    {o}{how}");
    }
    println!(
        "stream      open_producers={} closed_producers={} expired_producers={} ended={}",
        t.state.open_producers, t.state.closed_producers, t.state.expired_producers, t.state.ended
    );
    // Replica sets: a replicated topic, or one whose partitions moved.
    if s.replicas() > 1 || t.partitions.iter().any(|p| !p.replicas.is_empty()) {
        println!(
            "replication factor={} min_in_sync={}",
            s.replicas(),
            s.min_in_sync_replicas()
        );
        for p in &t.partitions {
            println!("  {}", replica_line(p));
        }
    }
    println!(
        "{:>9} {:>22} {:>12} {:>12} {:>10}  CONSUMERS (committed/lag)",
        "PARTITION", "SERVER", "FIRST", "NEXT", "DROPPED"
    );
    for (p, c) in t.partitions.iter().zip(consumers) {
        let cs: Vec<String> = c
            .iter()
            .map(|(n, o)| format!("{n}={o}/{}", p.next_offset.saturating_sub(*o)))
            .collect();
        println!(
            "{:>9} {:>22} {:>12} {:>12} {:>10}  {}",
            p.id,
            p.addr,
            p.first_offset,
            p.next_offset,
            p.dropped_events,
            cs.join(" ")
        );
    }
}

/// `partition 0: leader 1 epoch 2 replicas [1, 2, 0] in-sync [1, 2] UNDER-REPLICATED`
/// (and `MOVING TO [3, 2, 0]` while it moves)
pub fn replica_line(p: &strom_proto::PartitionInfo) -> String {
    let under = if p.isr.len() < p.replicas.len() {
        " UNDER-REPLICATED"
    } else {
        ""
    };
    let moving = match p.moving_to.is_empty() {
        true => String::new(),
        false => format!(" MOVING TO {:?}", p.moving_to),
    };
    format!(
        "partition {}: leader {} epoch {} replicas {:?} in-sync {:?}{under}{moving}",
        p.id, p.member, p.epoch, p.replicas, p.isr
    )
}

/// What an acknowledgement promises, said where the topic is created.
fn promise(ptype: PartitionType, durability: Durability) -> String {
    match (ptype, durability) {
        (PartitionType::Memory, _) => {
            "memory partitions: events live in server memory and are lost when it stops".into()
        }
        (_, Durability::Always) => {
            "durability always: each ack waits for fdatasync, so acked events survive kill -9, a kernel panic and power loss".into()
        }
        (_, Durability::Interval(ms)) => format!(
            "durability interval:{ms}: acked events survive kill -9; a kernel panic or power loss can lose up to the last {ms} ms of them"
        ),
        (_, Durability::Never) => {
            "durability never: acked events survive kill -9 of the server, NOT a kernel panic or power loss (use --durability always for that)".into()
        }
    }
}
