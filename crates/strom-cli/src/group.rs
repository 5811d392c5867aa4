//! `strom group list|describe|delete`: consumer groups, their members,
//! and per partition the committed position (the lowest unacked offset in
//! a shared group), lag, pending, redelivered and dead-lettered events.

use std::path::PathBuf;

use clap::Subcommand;
use strom_client::{ConsumerGroupInfo, ConsumerGroupMode, GroupPartitionInfo};
use strom_proto::PartitionStatus;

#[derive(Subcommand)]
pub enum GroupCmd {
    /// Every consumer group with its totals.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One group: spec, members, and each partition's state.
    Describe {
        group: String,
        #[arg(long)]
        json: bool,
    },
    /// Deletes a group and its state on every partition.
    Delete { group: String },
}

pub fn run(cmd: GroupCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    match cmd {
        GroupCmd::List { json } => {
            let groups = d.list_groups()?;
            if json {
                let v: Vec<_> = groups.iter().map(totals_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if groups.is_empty() {
                println!("no consumer groups");
            } else {
                println!(
                    "{:<24} {:<20} {:<11} {:>7} {:>10} {:>8} {:>11} {:>5}",
                    "GROUP", "TOPIC", "MODE", "MEMBERS", "LAG", "PENDING", "REDELIVERED", "DLQ"
                );
                for g in &groups {
                    let t = totals_json(g);
                    println!(
                        "{:<24} {:<20} {:<11} {:>7} {:>10} {:>8} {:>11} {:>5}",
                        g.spec.name,
                        g.spec.topic,
                        g.spec.mode.as_str(),
                        t["members_alive"],
                        t["lag"],
                        t["pending"],
                        t["redelivered"],
                        t["dead_lettered"]
                    );
                }
            }
        }
        GroupCmd::Describe { group, json } => {
            let g = d.describe_group(&group)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&describe_json(&g))?);
            } else {
                print_describe(&g);
            }
        }
        GroupCmd::Delete { group } => {
            d.delete_group(&group)?;
            println!("deleted consumer group '{group}'");
        }
    }
    Ok(())
}

fn sum(g: &ConsumerGroupInfo, f: impl Fn(&GroupPartitionInfo) -> u64) -> u64 {
    g.partitions.iter().map(f).sum()
}

fn totals_json(g: &ConsumerGroupInfo) -> serde_json::Value {
    serde_json::json!({
        "group": g.spec.name,
        "topic": g.spec.topic,
        "mode": g.spec.mode.as_str(),
        "members": g.consumers.len(),
        "members_alive": g.consumers.iter().filter(|c| c.alive).count(),
        "lag": sum(g, |p| p.lag()),
        "pending": sum(g, |p| p.pending),
        "redelivered": sum(g, |p| p.redelivered),
        "dead_lettered": sum(g, |p| p.dead_lettered),
    })
}

fn status_text(s: &PartitionStatus) -> String {
    match s {
        PartitionStatus::Ok => "ok".into(),
        other => format!("{} ({})", other.as_str(), other.reason()),
    }
}

fn describe_json(g: &ConsumerGroupInfo) -> serde_json::Value {
    let mut v = totals_json(g);
    v["generation"] = g.generation.into();
    v["spec"] = serde_json::json!({
        "session_ms": g.spec.session_ms,
        "visibility_ms": g.spec.visibility_ms,
        "max_deliveries": g.spec.max_deliveries,
        "dead_letter": g.spec.dead_letter,
    });
    v["consumers"] = g
        .consumers
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.id, "label": c.label, "alive": c.alive,
                "last_seen_ms": c.last_seen_ms, "partitions": c.partitions,
            })
        })
        .collect();
    v["partitions"] = g
        .partitions
        .iter()
        .map(|p| {
            serde_json::json!({
                "partition": p.partition, "member": p.member,
                "holder": p.holder.map(|(c, e)| serde_json::json!({"consumer": c, "epoch": e})),
                "committed": p.committed, "next_offset": p.next_offset, "lag": p.lag(),
                "pending": p.pending, "acked_above_committed": p.acked_above,
                "redelivered": p.redelivered, "dead_lettered": p.dead_lettered,
                "pending_by_consumer": p.pending_by_consumer.iter()
                    .map(|(c, n)| serde_json::json!({"consumer": c, "pending": n}))
                    .collect::<Vec<_>>(),
                "status": status_text(&p.status),
            })
        })
        .collect();
    v
}

fn print_describe(g: &ConsumerGroupInfo) {
    let s = &g.spec;
    println!(
        "group {} on topic {} ({} mode), generation {}",
        s.name,
        s.topic,
        s.mode.as_str(),
        g.generation
    );
    match s.dead_letter.as_deref() {
        _ if s.mode == ConsumerGroupMode::Kafka => println!(
            "a Kafka group: Kafka clients assign its partitions; committed offsets are its consumer offsets"
        ),
        Some(dlq) => println!(
            "visibility timeout {} ms, at most {} deliveries, then dead-letter topic {dlq}",
            s.visibility_ms, s.max_deliveries
        ),
        None => println!(
            "session timeout {} ms, visibility timeout {} ms, unlimited deliveries",
            s.session_ms, s.visibility_ms
        ),
    }
    println!("consumers: {}", g.consumers.len());
    for c in &g.consumers {
        println!(
            "  {:>4} {:<28} {} (last seen {} ms ago){}",
            c.id,
            c.label,
            if c.alive { "alive" } else { "gone" },
            c.last_seen_ms,
            if c.partitions.is_empty() {
                String::new()
            } else {
                format!(", partitions {:?}", c.partitions)
            }
        );
    }
    println!(
        "{:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>11} {:>5}  STATUS",
        "PARTITION", "MEMBER", "COMMITTED", "NEXT", "LAG", "PENDING", "REDELIVERED", "DLQ"
    );
    for p in &g.partitions {
        println!(
            "{:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>11} {:>5}  {}",
            p.partition,
            p.member,
            p.committed,
            p.next_offset,
            p.lag(),
            p.pending,
            p.redelivered,
            p.dead_lettered,
            status_text(&p.status)
        );
    }
}
