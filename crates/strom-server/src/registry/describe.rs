//! Topic descriptions: placement, replicas and the stream's state from the
//! registry, then each partition's offsets and status from the members
//! that lead them. The registry's lock is held only to copy what it knows;
//! the members are asked afterwards, all at once, so a slow or paused
//! member delays only the description that needs it.

use strom_proto::{PartitionInfo, PartitionStatus, Request, Response, TopicInfo};
use tokio::task::JoinSet;

use super::machine::TopicMeta;
use super::{Inner, Registry};

/// A description still missing the members' offsets.
pub(super) struct Described {
    info: TopicInfo,
    /// (member, address, partitions it leads) to ask for stats.
    asks: Vec<(u32, String, Vec<u32>)>,
}

impl Described {
    /// What the registry knows of `meta`; with `offsets`, whom to ask.
    pub(super) fn of(inner: &Inner, meta: &TopicMeta, offsets: bool) -> Described {
        let partitions = meta
            .placement
            .iter()
            .enumerate()
            .map(|(p, m)| {
                let set = meta.replicas.get(p);
                PartitionInfo {
                    id: p as u32,
                    member: *m,
                    addr: inner.addr_of(*m),
                    first_offset: 0,
                    next_offset: 0,
                    status: Default::default(),
                    dropped_events: 0,
                    replicas: set.map(|s| s.members.clone()).unwrap_or_default(),
                    isr: set.map(|s| s.isr.clone()).unwrap_or_default(),
                    epoch: set.map_or(0, |s| s.epoch),
                    moving_to: set.and_then(|s| s.target.clone()).unwrap_or_default(),
                }
            })
            .collect();
        let asks = match offsets {
            true => meta
                .by_member()
                .into_iter()
                .map(|(m, parts)| (m, inner.addr_of(m), parts))
                .collect(),
            false => Vec::new(),
        };
        Described {
            info: TopicInfo {
                spec: meta.spec.clone(),
                partitions,
                state: meta.state(),
            },
            asks,
        }
    }
}

/// What one member answered about some partitions of topic `t`.
type Answer = (usize, u32, String, Vec<u32>, Option<Vec<PartitionInfo>>);

impl Registry {
    /// Fills in the offsets and status of every partition, asking every
    /// member concurrently (without the registry's lock).
    pub(super) async fn with_stats(&self, mut all: Vec<Described>) -> Vec<TopicInfo> {
        let mut calls: JoinSet<Answer> = JoinSet::new();
        for (t, d) in all.iter().enumerate() {
            for (member, addr, parts) in &d.asks {
                let req = Request::PartitionStats {
                    topic: d.info.spec.name.clone(),
                    partitions: parts.clone(),
                };
                let (link, member, addr, parts) =
                    (self.link.clone(), *member, addr.clone(), parts.clone());
                calls.spawn(async move {
                    let stats = match link.call(member, &addr, req).await {
                        Ok(Response::Stats(stats)) => Some(stats),
                        Ok(_) => Some(Vec::new()),
                        Err(e) => {
                            tracing::debug!(member, error = %e, "no partition stats from member");
                            None
                        }
                    };
                    (t, member, addr, parts, stats)
                });
            }
        }
        while let Some(answer) = calls.join_next().await {
            if let Ok(answer) = answer {
                fill(&mut all, answer);
            }
        }
        all.into_iter().map(|d| d.info).collect()
    }
}

fn fill(all: &mut [Described], (t, member, addr, parts, stats): Answer) {
    let partitions = &mut all[t].info.partitions;
    let why = match &stats {
        Some(_) => format!("member {member} at {addr} does not serve it"),
        None => format!("member {member} at {addr} is down or unreachable"),
    };
    for p in &parts {
        if let Some(info) = partitions.get_mut(*p as usize) {
            info.status = PartitionStatus::Unavailable(why.clone());
        }
    }
    for s in stats.into_iter().flatten() {
        if let Some(p) = partitions.get_mut(s.id as usize) {
            p.first_offset = s.first_offset;
            p.next_offset = s.next_offset;
            p.status = s.status;
            p.dropped_events = s.dropped_events;
        }
    }
}
