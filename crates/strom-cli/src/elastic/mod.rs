//! `strom member ...`, `strom partition move` and `strom rebalance`: move
//! replicated partitions between the members of a running group
//! (docs/elasticity.md). The registry carries every move out; these
//! commands start moves and, unless `--no-wait`, show them until done.
//! `strom regulate` (`regulate/`) runs them by itself from the group's load.

pub(crate) mod rebalance;
pub(crate) mod regulate;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use strom_client::Driver;

pub use rebalance::RebalanceArgs;

#[derive(Subcommand)]
pub enum MemberCmd {
    /// List the group's members.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Move every partition off a live member while traffic continues;
    /// the member then leaves the group and its server stops.
    Drain(DrainArgs),
    /// Re-create a dead member's copies on the others from the in-sync
    /// copies left; the member leaves the group for good.
    Remove(DrainArgs),
}

#[derive(Args)]
pub struct DrainArgs {
    /// The member's id (see `strom member list`).
    member: u32,
    #[command(flatten)]
    wait: WaitArgs,
}

#[derive(Args, Clone)]
pub struct WaitArgs {
    /// Return once the moves are recorded; do not wait for them to end.
    #[arg(long)]
    no_wait: bool,
    /// Give up waiting after this many seconds (the moves go on).
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
}

#[derive(Subcommand)]
pub enum PartitionCmd {
    /// Move one partition's copy from a member to another, online (any
    /// topic; producers ride through it without errors when idempotent).
    Move(MoveArgs),
}

#[derive(Args)]
pub struct MoveArgs {
    /// TOPIC/PARTITION, e.g. `runs/3`.
    partition: String,
    /// The member that takes the copy.
    #[arg(long)]
    to: u32,
    /// The member whose copy moves (default: the leader's).
    #[arg(long)]
    from: Option<u32>,
    #[command(flatten)]
    wait: WaitArgs,
}

pub fn run_member(cmd: MemberCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    match cmd {
        MemberCmd::List { json } => list(&d, json),
        MemberCmd::Drain(a) => drain(&d, a, false),
        MemberCmd::Remove(a) => drain(&d, a, true),
    }
}

fn list(d: &Driver, json: bool) -> anyhow::Result<()> {
    let members = d.members()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&members)?);
        return Ok(());
    }
    println!(
        "{:>6} {:<28} {:<6} {:<8} ROLE",
        "MEMBER", "ADDRESS", "ALIVE", "DRAINING"
    );
    for m in members {
        println!(
            "{:>6} {:<28} {:<6} {:<8} {}",
            m.id, m.addr, m.alive, m.draining, m.role
        );
    }
    Ok(())
}

fn drain(d: &Driver, a: DrainArgs, dead: bool) -> anyhow::Result<()> {
    let what = if dead { "remove" } else { "drain" };
    d.drain_member(a.member, dead)
        .with_context(|| format!("{what} member {}", a.member))?;
    eprintln!("member {}: {what} started", a.member);
    if a.wait.no_wait {
        return Ok(());
    }
    let start = Instant::now();
    wait_until(&a.wait, || {
        let gone = !d.members()?.iter().any(|m| m.id == a.member);
        Ok(gone)
    })?;
    eprintln!(
        "member {} left the group after {:.1} s",
        a.member,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn run_partition(cmd: PartitionCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let PartitionCmd::Move(a) = cmd;
    let (topic, p) = parse_partition(&a.partition)?;
    let info = d.describe(topic)?;
    let part = info
        .partitions
        .get(p as usize)
        .with_context(|| format!("topic '{topic}' has no partition {p}"))?;
    // A partition of a topic without replication has one copy: its owner.
    let replicas = match part.replicas.is_empty() {
        true => vec![part.member],
        false => part.replicas.clone(),
    };
    let from = a.from.unwrap_or(part.member);
    let target = moved(&replicas, part.member, from, a.to)?;
    d.move_partition(topic, p, target.clone())?;
    eprintln!(
        "{topic}/{p}: moving from {replicas:?} to {target:?} (leader {})",
        target[0]
    );
    if a.wait.no_wait {
        return Ok(());
    }
    let start = Instant::now();
    wait_for_moves(&d, &a.wait, &[(topic.to_string(), p)])?;
    eprintln!(
        "{topic}/{p}: moved in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `replicas` (leader `leader` first) with `from` replaced by `to`; the
/// moved copy leads if `from` did.
fn moved(replicas: &[u32], leader: u32, from: u32, to: u32) -> anyhow::Result<Vec<u32>> {
    if !replicas.contains(&from) {
        bail!("member {from} holds no copy of the partition (its copies: {replicas:?})");
    }
    if replicas.contains(&to) {
        bail!("member {to} holds a copy of the partition already (its copies: {replicas:?})");
    }
    let mut target: Vec<u32> = std::iter::once(leader)
        .chain(replicas.iter().copied().filter(|m| *m != leader))
        .map(|m| if m == from { to } else { m })
        .collect();
    target.dedup();
    Ok(target)
}

fn parse_partition(s: &str) -> anyhow::Result<(&str, u32)> {
    let (topic, p) = s
        .rsplit_once('/')
        .with_context(|| format!("'{s}' is not TOPIC/PARTITION"))?;
    let p = p
        .parse()
        .with_context(|| format!("'{p}' in '{s}' is not a partition number"))?;
    Ok((topic, p))
}

/// Waits until none of `moves` is moving any more.
pub(crate) fn wait_for_moves(
    d: &Driver,
    w: &WaitArgs,
    moves: &[(String, u32)],
) -> anyhow::Result<()> {
    let mut topics: Vec<&str> = moves.iter().map(|(t, _)| t.as_str()).collect();
    topics.dedup();
    wait_until(w, || {
        for t in &topics {
            let info = d.describe(t)?;
            let moving = moves.iter().filter(|(name, _)| name == t).any(|(_, p)| {
                info.partitions
                    .get(*p as usize)
                    .is_some_and(|x| !x.moving_to.is_empty())
            });
            if moving {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

/// Polls `done` every 200 ms until it is true or the timeout passes.
fn wait_until(w: &WaitArgs, mut done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(w.timeout);
    loop {
        // A registry failover in the middle is not the end of the wait.
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "checking progress failed; retrying"),
        }
        if Instant::now() >= deadline {
            bail!(
                "still moving after {} s; the moves go on (see `strom status`)",
                w.timeout
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::{moved, parse_partition};

    #[test]
    fn a_moved_copy_takes_the_place_of_the_one_it_replaces() {
        assert_eq!(moved(&[1, 2, 3], 1, 1, 4).unwrap(), [4, 2, 3]);
        assert_eq!(moved(&[1, 2, 3], 1, 3, 4).unwrap(), [1, 2, 4]);
        assert_eq!(moved(&[2, 1, 3], 1, 2, 0).unwrap(), [1, 0, 3]);
        assert!(moved(&[1, 2, 3], 1, 5, 4).is_err());
        assert!(moved(&[1, 2, 3], 1, 1, 2).is_err());
    }

    #[test]
    fn a_partition_is_named_topic_slash_number() {
        assert_eq!(parse_partition("a/b/3").unwrap(), ("a/b", 3));
        assert!(parse_partition("runs").is_err());
        assert!(parse_partition("runs/x").is_err());
        assert!(parse_partition("runs/-1").is_err());
    }
}
