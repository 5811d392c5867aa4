//! `strom rebalance`: spreads partitions (every copy) and their leaders
//! evenly over the live members, weighing each copy by the bytes it
//! stores and each leadership by its recent write traffic (sampled twice,
//! a second apart), not just by counts. The plan is printed first;
//! `--dry-run` stops there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use strom_client::Driver;

use super::{wait_for_moves, WaitArgs};

#[derive(Args)]
pub struct RebalanceArgs {
    /// Show the plan; move nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    wait: WaitArgs,
}

/// Every copy and leadership weighs at least this, so partitions that
/// hold nothing yet still spread by count.
const FLOOR: f64 = (1 << 20) as f64;

/// Seconds of write traffic a leadership weighs as.
const TRAFFIC_WINDOW: f64 = 60.0;

/// One partition as the plan sees it.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    pub topic: String,
    pub partition: u32,
    /// Its copies, the leader first.
    pub replicas: Vec<u32>,
    /// Bytes stored (its largest copy).
    pub bytes: u64,
    /// Bytes written per second lately.
    pub rate: f64,
}

impl Part {
    fn disk(&self) -> f64 {
        self.bytes as f64 + FLOOR
    }
    fn traffic(&self) -> f64 {
        self.rate * TRAFFIC_WINDOW + FLOOR
    }
}

/// The new copies of each partition that moves (the wanted leader first),
/// by index in `parts`: copies go from the member that stores the most to
/// the one that stores the least while that narrows the gap, then
/// leaderships go to the copy whose member leads the least traffic.
pub(crate) fn plan(members: &[u32], parts: &[Part]) -> Vec<(usize, Vec<u32>)> {
    let mut now: Vec<Vec<u32>> = parts.iter().map(|p| p.replicas.clone()).collect();
    let movable = |r: &[u32]| r.iter().all(|m| members.contains(m));
    for _ in 0..parts.len() * 4 {
        let disk = load(members, parts, &now, |_, p, _| p.disk());
        let (hi, lo) = extremes(&disk);
        let gap = disk[&hi] - disk[&lo];
        let best = (0..parts.len())
            .filter(|i| movable(&now[*i]) && now[*i].contains(&hi) && !now[*i].contains(&lo))
            .filter(|i| parts[*i].disk() < gap)
            .min_by(|a, b| {
                let score = |i: &usize| (gap - 2.0 * parts[*i].disk()).abs();
                score(a).total_cmp(&score(b))
            });
        let Some(i) = best else { break };
        for m in now[i].iter_mut().filter(|m| **m == hi) {
            *m = lo;
        }
    }
    for _ in 0..parts.len() * 4 {
        let lead = load(
            members,
            parts,
            &now,
            |k, p, _| if k == 0 { p.traffic() } else { 0.0 },
        );
        let (hi, _) = extremes(&lead);
        let best = (0..parts.len())
            .filter(|i| movable(&now[*i]) && now[*i][0] == hi)
            .filter_map(|i| {
                let r = *now[i][1..]
                    .iter()
                    .min_by(|a, b| lead[a].total_cmp(&lead[b]))?;
                (lead[&r] + parts[i].traffic() < lead[&hi]).then_some((i, r))
            })
            .min_by(|(a, ra), (b, rb)| {
                let after =
                    |i: usize, r: u32| (lead[&hi] - lead[&r] - 2.0 * parts[i].traffic()).abs();
                after(*a, *ra).total_cmp(&after(*b, *rb))
            });
        let Some((i, r)) = best else { break };
        let at = now[i].iter().position(|m| *m == r).unwrap_or(0);
        now[i][..=at].rotate_right(1);
    }
    now.into_iter()
        .enumerate()
        .filter(|(i, r)| *r != parts[*i].replicas)
        .collect()
}

/// Each member's load: `w(k, part, member)` summed over every copy, `k`
/// being the copy's place (0: the leader).
fn load(
    members: &[u32],
    parts: &[Part],
    now: &[Vec<u32>],
    w: impl Fn(usize, &Part, u32) -> f64,
) -> BTreeMap<u32, f64> {
    let mut l: BTreeMap<u32, f64> = members.iter().map(|m| (*m, 0.0)).collect();
    for (p, r) in parts.iter().zip(now) {
        for (k, m) in r.iter().enumerate() {
            if let Some(x) = l.get_mut(m) {
                *x += w(k, p, *m);
            }
        }
    }
    l
}

/// The most and the least loaded member (ties by id).
fn extremes(l: &BTreeMap<u32, f64>) -> (u32, u32) {
    let hi = l
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(m, _)| *m);
    let lo = l
        .iter()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(m, _)| *m);
    (hi, lo)
}

pub fn run(a: RebalanceArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let members = placeable(&d)?;
    let parts = gather(&d)?;
    let moves = plan(&members, &parts);
    print_plan(&members, &parts, &moves);
    if a.dry_run || moves.is_empty() {
        return Ok(());
    }
    let started = start_moves(&d, &parts, &moves)?;
    eprintln!("{} partition moves started", started.len());
    if a.wait.no_wait {
        return Ok(());
    }
    let start = Instant::now();
    wait_for_moves(&d, &a.wait, &started)?;
    eprintln!("rebalanced in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The live members that are not being drained.
fn placeable(d: &Driver) -> anyhow::Result<Vec<u32>> {
    Ok(d.members()?
        .into_iter()
        .filter(|m| m.alive && !m.draining)
        .map(|m| m.id)
        .collect())
}

/// Starts `moves`; returns the partitions that move.
fn start_moves(
    d: &Driver,
    parts: &[Part],
    moves: &[(usize, Vec<u32>)],
) -> anyhow::Result<Vec<(String, u32)>> {
    let mut started = Vec::new();
    for (i, target) in moves {
        let p = &parts[*i];
        d.move_partition(&p.topic, p.partition, target.clone())?;
        started.push((p.topic.clone(), p.partition));
    }
    Ok(started)
}

/// The rebalance `strom regulate` runs after a member joins: plans as
/// `strom rebalance` does and starts the moves without printing the plan
/// or waiting; returns how many partitions move.
pub(crate) fn start(d: &Driver) -> anyhow::Result<usize> {
    let members = placeable(d)?;
    let parts = gather(d)?;
    let moves = plan(&members, &parts);
    Ok(start_moves(d, &parts, &moves)?.len())
}

/// Every partition with its size and recent write rate, from
/// two metrics snapshots of every live member a second apart.
fn gather(d: &Driver) -> anyhow::Result<Vec<Part>> {
    let topics = d.list_topics()?;
    let addrs: Vec<String> = d
        .members()?
        .into_iter()
        .filter(|m| m.alive)
        .map(|m| m.addr)
        .collect();
    let first = sample(d, &addrs);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let second = sample(d, &addrs);
    let secs = t0.elapsed().as_secs_f64();
    let mut parts = Vec::new();
    for t in topics {
        for p in &t.partitions {
            let key = (t.spec.name.clone(), p.id);
            let (bytes, b1) = second.get(&key).copied().unwrap_or((0, 0));
            let b0 = first.get(&key).map_or(b1, |x| x.1);
            let mut replicas = vec![p.member];
            replicas.extend(p.replicas.iter().filter(|m| **m != p.member));
            parts.push(Part {
                topic: key.0,
                partition: p.id,
                replicas,
                bytes,
                rate: b1.saturating_sub(b0) as f64 / secs,
            });
        }
    }
    Ok(parts)
}

/// (topic, partition) -> (largest stored bytes, largest bytes_in) over
/// the members that answered.
fn sample(d: &Driver, addrs: &[String]) -> BTreeMap<(String, u32), (u64, u64)> {
    let mut out: BTreeMap<(String, u32), (u64, u64)> = BTreeMap::new();
    for addr in addrs {
        let Ok(json) = d.server_snapshot_at(addr) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) else {
            continue;
        };
        for p in v["partitions"].as_array().into_iter().flatten() {
            let (Some(topic), Some(partition)) = (p["topic"].as_str(), p["partition"].as_u64())
            else {
                continue;
            };
            let e = out
                .entry((topic.to_string(), partition as u32))
                .or_default();
            e.0 = e.0.max(p["storage_bytes"].as_u64().unwrap_or(0));
            e.1 = e.1.max(p["bytes_in"].as_u64().unwrap_or(0));
        }
    }
    out
}

fn print_plan(members: &[u32], parts: &[Part], moves: &[(usize, Vec<u32>)]) {
    let mut after: Vec<Vec<u32>> = parts.iter().map(|p| p.replicas.clone()).collect();
    for (i, t) in moves {
        after[*i] = t.clone();
    }
    let before: Vec<Vec<u32>> = parts.iter().map(|p| p.replicas.clone()).collect();
    println!(
        "{:>6} {:>14} {:>14} {:>16} {:>16}",
        "MEMBER", "STORED NOW", "STORED AFTER", "LEADS NOW (B/s)", "LEADS AFTER"
    );
    let disk = |now: &[Vec<u32>]| load(members, parts, now, |_, p, _| p.bytes as f64);
    let lead = |now: &[Vec<u32>]| {
        load(
            members,
            parts,
            now,
            |k, p, _| if k == 0 { p.rate } else { 0.0 },
        )
    };
    let (d0, d1, l0, l1) = (disk(&before), disk(&after), lead(&before), lead(&after));
    for m in members {
        println!(
            "{m:>6} {:>14.0} {:>14.0} {:>16.0} {:>16.0}",
            d0[m], d1[m], l0[m], l1[m]
        );
    }
    if moves.is_empty() {
        println!("balanced: nothing to move");
    }
    for (i, t) in moves {
        let p = &parts[*i];
        println!(
            "move {}/{}: {:?} -> {t:?} (leader {} -> {})",
            p.topic, p.partition, p.replicas, p.replicas[0], t[0]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{plan, Part};

    fn part(i: u32, replicas: &[u32], bytes: u64, rate: f64) -> Part {
        Part {
            topic: "t".into(),
            partition: i,
            replicas: replicas.to_vec(),
            bytes,
            rate,
        }
    }

    fn apply(parts: &[Part], moves: &[(usize, Vec<u32>)]) -> Vec<Vec<u32>> {
        let mut now: Vec<Vec<u32>> = parts.iter().map(|p| p.replicas.clone()).collect();
        for (i, t) in moves {
            now[*i] = t.clone();
        }
        now
    }

    #[test]
    fn a_new_member_gets_a_fair_share_of_copies_and_leaders() {
        // 6 partitions, 3 copies each, on members 0-2; member 3 is new.
        let parts: Vec<Part> = (0..6)
            .map(|i| {
                let r: Vec<u32> = (0..3).map(|k| (i + k) % 3).collect();
                part(i, &r, 100 << 20, 1e6)
            })
            .collect();
        let after = apply(&parts, &plan(&[0, 1, 2, 3], &parts));
        for m in 0..4u32 {
            let copies = after.iter().filter(|r| r.contains(&m)).count();
            let leads = after.iter().filter(|r| r[0] == m).count();
            assert!(
                (4..=5).contains(&copies),
                "member {m}: {copies} copies in {after:?}"
            );
            assert!(
                (1..=2).contains(&leads),
                "member {m}: leads {leads} in {after:?}"
            );
        }
        for r in &after {
            let mut s = r.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(
                s.len(),
                3,
                "copies of one partition on distinct members: {r:?}"
            );
        }
    }

    #[test]
    fn bytes_weigh_more_than_counts() {
        // Member 0 holds one huge partition, member 1 ten small ones.
        let mut parts = vec![part(0, &[0, 2], 10 << 30, 0.0)];
        parts.extend((1..11).map(|i| part(i, &[1, 2], 1 << 20, 0.0)));
        let moves = plan(&[0, 1, 2, 3], &parts);
        let after = apply(&parts, &moves);
        // Member 3 takes a copy of the huge one (member 0's or 2's), not
        // a pile of small ones.
        assert!(after[0].contains(&3), "{after:?}");
    }

    #[test]
    fn a_balanced_group_moves_nothing() {
        let parts: Vec<Part> = (0..4)
            .map(|i| part(i, &[i % 2, (i + 1) % 2], 1 << 20, 10.0))
            .collect();
        assert!(plan(&[0, 1], &parts).is_empty());
    }

    #[test]
    fn traffic_moves_leaders_to_idle_copies() {
        // Member 0 leads both busy partitions; member 1 holds copies.
        let parts = vec![
            part(0, &[0, 1], 1 << 20, 5e7),
            part(1, &[0, 1], 1 << 20, 5e7),
        ];
        let after = apply(&parts, &plan(&[0, 1], &parts));
        let leads1 = after.iter().filter(|r| r[0] == 1).count();
        assert_eq!(leads1, 1, "{after:?}");
    }
}
