//! How many member failures a group survives right now, for `strom
//! status`: its metadata registry's (a quorum needs a majority of its
//! voters alive; a registry without a quorum lives on one member) and each
//! topic's (a partition keeps its acknowledged events while one in-sync
//! copy is left on a live member). The group survives the least of them.

use std::collections::BTreeMap;

use strom_proto::{MemberInfo, TopicInfo};

/// One part of the group and the failures it survives now, with why.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    pub survives: u32,
    pub why: String,
}

/// The failures the group survives now: the registry's, each topic's, and
/// the least of them.
#[derive(Debug)]
pub struct Survival {
    pub group: u32,
    pub registry: Part,
    pub topics: Vec<(String, Part)>,
}

impl Survival {
    pub fn of(members: &[MemberInfo], topics: &[TopicInfo]) -> Survival {
        let registry = registry(members);
        let alive: BTreeMap<u32, bool> = members.iter().map(|m| (m.id, m.alive)).collect();
        let topics: Vec<(String, Part)> = topics
            .iter()
            .map(|t| (t.spec.name.clone(), topic(t, &alive)))
            .collect();
        let group = topics
            .iter()
            .map(|(_, p)| p.survives)
            .fold(registry.survives, u32::min);
        Survival {
            group,
            registry,
            topics,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let topics: serde_json::Map<String, serde_json::Value> = self
            .topics
            .iter()
            .map(|(name, p)| (name.clone(), part_json(p)))
            .collect();
        serde_json::json!({
            "member_failures": self.group,
            "registry": part_json(&self.registry),
            "topics": topics,
        })
    }

    /// The lines `strom status` prints.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "survives {} now: registry {} ({})",
            failures(self.group),
            self.registry.survives,
            self.registry.why
        )];
        for (name, p) in &self.topics {
            out.push(format!("  topic {name}: {} ({})", p.survives, p.why));
        }
        out
    }
}

fn part_json(p: &Part) -> serde_json::Value {
    serde_json::json!({"survives": p.survives, "why": p.why})
}

fn failures(n: u32) -> String {
    match n {
        1 => "1 member failure".into(),
        n => format!("{n} member failures"),
    }
}

/// The registry: a quorum survives as many voter deaths as leave a
/// majority of its voters alive; a registry without one survives none of
/// its member's.
fn registry(members: &[MemberInfo]) -> Part {
    let voters: Vec<&MemberInfo> = members
        .iter()
        .filter(|m| m.role == "leader" || m.role == "voter")
        .collect();
    if voters.is_empty() {
        let who = members
            .iter()
            .find(|m| m.role == "master")
            .map_or("one member".to_string(), |m| format!("member {}", m.id));
        return Part {
            survives: 0,
            why: format!(
                "kept by {who} alone, no metadata quorum: start the group with --meta-voters 3"
            ),
        };
    }
    let v = voters.len() as u32;
    let alive = voters.iter().filter(|m| m.alive).count() as u32;
    let majority = v / 2 + 1;
    Part {
        survives: alive.saturating_sub(majority),
        why: format!("metadata quorum: {alive} of {v} voters alive, {majority} needed"),
    }
}

/// A topic: each partition survives one death fewer than it has in-sync
/// copies on live members (an unreplicated partition: its one copy); the
/// topic, its weakest partition.
fn topic(t: &TopicInfo, alive: &BTreeMap<u32, bool>) -> Part {
    let live = |m: &u32| alive.get(m).copied().unwrap_or(false);
    let weakest = t
        .partitions
        .iter()
        .map(|p| {
            let copies = if p.replicas.is_empty() {
                u32::from(live(&p.member))
            } else {
                p.isr.iter().filter(|m| live(m)).count() as u32
            };
            (copies, p.id)
        })
        .min();
    match weakest {
        None => Part {
            survives: u32::MAX,
            why: "no partitions".into(),
        },
        Some((0, id)) => Part {
            survives: 0,
            why: format!("partition {id} has no in-sync copy on a live member"),
        },
        Some((copies, id)) => Part {
            survives: copies - 1,
            why: format!("partition {id}: {copies} in-sync copies on live members"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strom_proto::{PartitionInfo, TopicSpec};

    fn member(id: u32, role: &str, alive: bool) -> MemberInfo {
        MemberInfo {
            id,
            addr: format!("127.0.0.1:{}", 7000 + id),
            alive,
            last_seen_ms: 0,
            addrs: Vec::new(),
            role: role.into(),
            draining: false,
        }
    }

    fn partition(id: u32, member: u32, replicas: &[u32], isr: &[u32]) -> PartitionInfo {
        PartitionInfo {
            id,
            member,
            addr: String::new(),
            first_offset: 0,
            next_offset: 0,
            status: Default::default(),
            dropped_events: 0,
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            epoch: 0,
            moving_to: Vec::new(),
        }
    }

    fn topic_of(name: &str, parts: Vec<PartitionInfo>) -> TopicInfo {
        TopicInfo {
            spec: TopicSpec::new(name, parts.len() as u32),
            partitions: parts,
            state: Default::default(),
        }
    }

    #[test]
    fn a_quorum_of_three_survives_one_voter_and_then_none() {
        let mut ms = vec![
            member(0, "leader", true),
            member(1, "voter", true),
            member(2, "voter", true),
        ];
        assert_eq!(registry(&ms).survives, 1);
        ms[0].alive = false;
        assert_eq!(registry(&ms).survives, 0);
        let five: Vec<_> = (0..5).map(|i| member(i, "voter", true)).collect();
        assert_eq!(registry(&five).survives, 2);
    }

    #[test]
    fn a_registry_without_a_quorum_survives_nothing_and_says_how_to_get_one() {
        let ms = vec![member(0, "master", true), member(1, "", true)];
        let r = registry(&ms);
        assert_eq!(r.survives, 0);
        assert!(r.why.contains("member 0 alone") && r.why.contains("--meta-voters 3"));
    }

    #[test]
    fn a_topic_survives_one_death_fewer_than_its_weakest_partitions_live_copies() {
        let ms = vec![
            member(0, "leader", true),
            member(1, "voter", true),
            member(2, "voter", false),
        ];
        let alive = ms.iter().map(|m| (m.id, m.alive)).collect();
        let rf3 = topic_of(
            "r",
            vec![
                partition(0, 0, &[0, 1, 2], &[0, 1, 2]),
                partition(1, 1, &[1, 2, 0], &[1, 0]),
            ],
        );
        // Member 2 is dead: partition 0 has two live in-sync copies.
        assert_eq!(topic(&rf3, &alive).survives, 1);
        let plain = topic_of("p", vec![partition(0, 2, &[], &[])]);
        assert_eq!(topic(&plain, &alive).survives, 0);
        let s = Survival::of(&ms, &[rf3, plain]);
        assert_eq!(s.group, 0, "the least of registry and topics");
        assert_eq!(s.to_json()["topics"]["r"]["survives"], 1);
    }
}
