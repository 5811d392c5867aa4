//! What the regulator measures: the members (from the registry), every
//! live member's metrics snapshot (the same `ServerSnapshot` `strom top`
//! and the dashboard show) and the topics' copies. Rates come from two
//! snapshots' counters (`rates`, pure); the rest from one.

use std::collections::{BTreeMap, BTreeSet};

use strom_client::Driver;
use strom_proto::MemberInfo;
use strom_server::stats::ServerSnapshot;

use super::decide::{Candidate, Load, Observed};

/// Counters of one member's snapshot: when it was taken, and per
/// partition `(bytes_in, bytes_out)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub taken_us: u64,
    pub parts: BTreeMap<(String, u32), (u64, u64)>,
}

impl Counters {
    fn of(s: &ServerSnapshot) -> Counters {
        Counters {
            taken_us: s.taken_us,
            parts: s
                .partitions
                .iter()
                .map(|p| ((p.topic.clone(), p.partition), (p.bytes_in, p.bytes_out)))
                .collect(),
        }
    }
}

/// Bytes produced and consumed per second over the group between two
/// samples of its members' counters. A member or partition seen once
/// (it just joined, or its copy just moved there) or whose counters went
/// back (its server restarted) adds nothing.
pub fn rates(prev: &BTreeMap<u32, Counters>, now: &BTreeMap<u32, Counters>) -> (f64, f64) {
    let (mut produce, mut consume) = (0.0, 0.0);
    for (m, c) in now {
        let Some(p) = prev.get(m) else { continue };
        let dt = c.taken_us.saturating_sub(p.taken_us) as f64 / 1e6;
        if dt <= 0.0 {
            continue;
        }
        for (key, (bin, bout)) in &c.parts {
            let Some((pin, pout)) = p.parts.get(key) else {
                continue;
            };
            if bin >= pin && bout >= pout {
                produce += (bin - pin) as f64 / dt;
                consume += (bout - pout) as f64 / dt;
            }
        }
    }
    (produce, consume)
}

/// One sample: the decision's input, plus the counters for the next.
pub struct Sample {
    pub observed: Observed,
    pub counters: BTreeMap<u32, Counters>,
    /// Every member id in the group now (draining and down ones too).
    pub members: BTreeSet<u32>,
}

/// Asks the group. `started` are the members the regulator started, the
/// latest last; `prev` the counters of the previous sample.
pub fn take(
    d: &Driver,
    now_s: f64,
    started: &[u32],
    prev: &BTreeMap<u32, Counters>,
) -> anyhow::Result<Sample> {
    let members = d.members()?;
    let topics = d.list_topics()?;
    let mut down: Vec<u32> = members.iter().filter(|m| !m.alive).map(|m| m.id).collect();
    let mut counters = BTreeMap::new();
    let (mut lag, mut disk) = (0.0, 0.0);
    for m in members.iter().filter(|m| m.alive) {
        let snap = d
            .server_snapshot_at(&m.addr)
            .map_err(anyhow::Error::from)
            .and_then(|j| Ok(serde_json::from_str::<ServerSnapshot>(&j)?));
        let s = match snap {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(member = m.id, addr = %m.addr, error = %e, "no snapshot");
                down.push(m.id);
                continue;
            }
        };
        for p in &s.partitions {
            disk += p.storage_bytes as f64;
            // Lag counts once per partition: where it leads (or is alone).
            if p.replica.as_ref().is_none_or(|r| r.role == "leader") {
                lag += p.consumers.iter().map(|c| c.lag as f64).sum::<f64>();
            }
        }
        counters.insert(m.id, Counters::of(&s));
    }
    let load = (!prev.is_empty()).then(|| {
        let (produce, consume) = rates(prev, &counters);
        Load {
            produce_bytes_per_s: produce,
            consume_bytes_per_s: consume,
            lag_events: lag,
            disk_bytes: disk,
        }
    });
    let mut max_copies = 1u32;
    let mut moving = false;
    let mut under: BTreeMap<u32, u32> = BTreeMap::new();
    for t in &topics {
        for p in &t.partitions {
            let copies = (p.replicas.len() as u32).max(t.spec.replicas());
            max_copies = max_copies.max(copies);
            moving |= !p.moving_to.is_empty();
            if p.isr.len() < p.replicas.len() {
                for m in &p.replicas {
                    *under.entry(*m).or_default() += 1;
                }
            }
        }
    }
    down.sort_unstable();
    let observed = Observed {
        now_s,
        active: members.iter().filter(|m| m.alive && !m.draining).count() as u32,
        draining: members.iter().filter(|m| m.draining).count() as u32,
        down,
        moving,
        max_copies,
        load,
        candidates: candidates(&members, started, &under),
    };
    Ok(Sample {
        observed,
        counters,
        members: members.iter().map(|m| m.id).collect(),
    })
}

/// The live members that are not draining, the preferred to drain first:
/// those the regulator started, latest first; then the others, highest id
/// first.
fn candidates(
    members: &[MemberInfo],
    started: &[u32],
    under: &BTreeMap<u32, u32>,
) -> Vec<Candidate> {
    let rank = |id: u32| match started.iter().position(|s| *s == id) {
        Some(i) => (0, usize::MAX - i, 0),
        None => (1, 0, u32::MAX - id),
    };
    let mut c: Vec<Candidate> = members
        .iter()
        .filter(|m| m.alive && !m.draining)
        .map(|m| Candidate {
            id: m.id,
            started: started.contains(&m.id),
            keeps_registry: matches!(m.role.as_str(), "master" | "leader" | "voter"),
            under_replicated: under.get(&m.id).copied().unwrap_or(0),
        })
        .collect();
    c.sort_by_key(|c| rank(c.id));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(taken_us: u64, parts: &[(u32, u64, u64)]) -> Counters {
        Counters {
            taken_us,
            parts: parts
                .iter()
                .map(|(p, i, o)| (("t".to_string(), *p), (*i, *o)))
                .collect(),
        }
    }

    #[test]
    fn rates_come_from_counters_seen_twice_and_never_go_negative() {
        let prev = BTreeMap::from([
            (0, counters(1_000_000, &[(0, 1000, 0), (1, 500, 100)])),
            (1, counters(1_000_000, &[(2, 9000, 9000)])),
        ]);
        let now = BTreeMap::from([
            // 2 s later: +2000 and +1000 in, +400 out.
            (0, counters(3_000_000, &[(0, 3000, 0), (1, 1500, 500)])),
            // Restarted: its counters went back; adds nothing.
            (1, counters(3_000_000, &[(2, 10, 10)])),
            // Joined since: adds nothing yet.
            (2, counters(3_000_000, &[(3, 5000, 0)])),
        ]);
        let (p, c) = rates(&prev, &now);
        assert_eq!(p, 1500.0);
        assert_eq!(c, 200.0);
    }

    #[test]
    fn the_members_the_regulator_started_last_are_drained_first() {
        let m = |id: u32, role: &str| MemberInfo {
            id,
            addr: String::new(),
            alive: true,
            last_seen_ms: 0,
            addrs: Vec::new(),
            role: role.into(),
            draining: false,
        };
        let members = [m(0, "master"), m(1, ""), m(2, ""), m(3, ""), m(4, "")];
        let under = BTreeMap::from([(2, 1)]);
        let c = candidates(&members, &[2, 4], &under);
        let ids: Vec<u32> = c.iter().map(|c| c.id).collect();
        assert_eq!(ids, [4, 2, 3, 1, 0]);
        assert!(c[0].started && c[1].started && !c[2].started);
        assert_eq!(c[1].under_replicated, 1);
        assert!(c[4].keeps_registry);
    }
}
