//! `strom status`: members (address, alive, partitions), how many member
//! failures the group survives now (`survive.rs`), topics, each
//! partition's first and next offset, each consumer name's lag, and the
//! transforms with their lag.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct StatusArgs {
    #[arg(long)]
    json: bool,
}

pub fn run(a: StatusArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let members = d.members()?;
    let topics = d.list_topics()?;
    let mut hosted: BTreeMap<u32, usize> = BTreeMap::new();
    for t in &topics {
        for p in &t.partitions {
            *hosted.entry(p.member).or_default() += 1;
        }
    }
    let alive: BTreeMap<u32, bool> = members.iter().map(|m| (m.id, m.alive)).collect();
    let mut topics_json = Vec::new();
    for t in &topics {
        let mut parts = Vec::new();
        for p in &t.partitions {
            let up = alive.get(&p.member).copied().unwrap_or(false);
            let consumers = if up {
                d.consumer_offsets_at(&p.addr, &t.spec.name, p.id).ok()
            } else {
                None
            };
            parts.push(serde_json::json!({
                "id": p.id,
                "member": p.member,
                "addr": p.addr,
                "alive": up,
                "status": p.status.as_str(),
                "reason": p.status.reason(),
                "dropped_events": p.dropped_events,
                "first_offset": p.first_offset,
                "next_offset": p.next_offset,
                "replicas": p.replicas,
                "isr": p.isr,
                "epoch": p.epoch,
                "under_replicated": p.isr.len() < p.replicas.len(),
                "moving_to": p.moving_to,
                "replica_line": (!p.replicas.is_empty()).then(|| crate::topic::replica_line(p)),
                "consumers": consumers.map(|c| c.into_iter().map(|(n, o)| serde_json::json!({
                    "name": n, "committed": o, "lag": p.next_offset.saturating_sub(o)
                })).collect::<Vec<_>>()),
            }));
        }
        topics_json.push(serde_json::json!({
            "name": t.spec.name,
            "partition_type": t.spec.partition_type.as_str(),
            "ended": t.state.ended,
            "partitions": parts,
        }));
    }
    let members_json: Vec<_> = members
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.id,
                "addr": m.addr,
                "alive": m.alive,
                "last_seen_ms": m.last_seen_ms,
                "role": m.role,
                "draining": m.draining,
                "partitions": hosted.get(&m.id).copied().unwrap_or(0),
            })
        })
        .collect();
    let transforms = crate::transform::rows(&d);
    let survival = crate::survive::Survival::of(&members, &topics);
    let security = d.security_mode()?;
    if a.json {
        let v = serde_json::json!({
            "members": members_json, "survives": survival.to_json(), "security": security,
            "topics": topics_json, "transforms": transforms,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:>6} {:<24} {:>6} {:>10}  REGISTRY",
        "MEMBER", "ADDRESS", "ALIVE", "PARTITIONS"
    );
    for m in &members_json {
        println!(
            "{:>6} {:<24} {:>6} {:>10}  {}",
            m["id"].to_string(),
            m["addr"].as_str().unwrap_or(""),
            m["alive"].to_string(),
            m["partitions"].to_string(),
            match m["draining"].as_bool() {
                Some(true) => format!("{} draining", m["role"].as_str().unwrap_or("")),
                _ => m["role"].as_str().unwrap_or("").to_string(),
            }
            .trim()
        );
    }
    println!();
    println!("security: {}", security_line(security));
    for line in survival.lines() {
        println!("{line}");
    }
    for t in &topics_json {
        println!();
        println!(
            "topic {} ({}, ended={})",
            t["name"].as_str().unwrap_or(""),
            t["partition_type"].as_str().unwrap_or(""),
            t["ended"]
        );
        println!(
            "{:>9} {:>6} {:>11} {:>12} {:>12}  CONSUMERS (name=committed/lag)",
            "PARTITION", "MEMBER", "STATUS", "FIRST", "NEXT"
        );
        for p in t["partitions"].as_array().into_iter().flatten() {
            let consumers = match p["consumers"].as_array() {
                Some(c) => c
                    .iter()
                    .map(|c| {
                        format!(
                            "{}={}/{}",
                            c["name"].as_str().unwrap_or(""),
                            c["committed"],
                            c["lag"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                None => "(member down)".into(),
            };
            let consumers = match p["reason"].as_str().filter(|r| !r.is_empty()) {
                Some(reason) => format!("{consumers}  [{reason}]"),
                None => consumers,
            };
            println!(
                "{:>9} {:>6} {:>11} {:>12} {:>12}  {}",
                p["id"].to_string(),
                p["member"].to_string(),
                p["status"].as_str().unwrap_or(""),
                p["first_offset"].to_string(),
                p["next_offset"].to_string(),
                consumers
            );
            if let Some(line) = p["replica_line"].as_str() {
                println!("{:>9} {line}", "");
            }
        }
    }
    if !transforms.is_empty() {
        println!();
        crate::transform::print_rows(&transforms);
    }
    Ok(())
}

/// What `strom status` says of the registry master's security mode.
fn security_line(mode: &str) -> &'static str {
    match mode {
        "auth" => "auth (every connection authenticated, every request checked against the ACLs)",
        "protected" => "protected mode (no auth; serves loopback and same-node clients only)",
        "insecure" => {
            "INSECURE (no auth on network addresses: anyone who reaches a port may do anything)"
        }
        _ => "unknown (a server older than protocol version 9)",
    }
}
