//! What a principal that may not describe the cluster sees of `/api/*`
//! (docs/security.md, "HTTP"): the topics it may describe, and nothing of
//! the others (their partitions, consumers, shared groups, replication
//! records and rates). Members, the quorum and the server's own counts stay:
//! they name no topic.

use std::collections::BTreeMap;
use std::sync::Arc;

use strom_server::stats::ServerSnapshot;
use strom_server::Services;

use crate::access::Sees;
use crate::history::{History, Point};

/// Removes from `snap` every topic `sees` does not show.
pub fn server(svc: &Services, sees: &Sees, snap: &mut ServerSnapshot) {
    if matches!(sees, Sees::All) {
        return;
    }
    snap.partitions.retain(|p| sees.topic(svc, &p.topic));
    snap.group_partitions.retain(|p| sees.topic(svc, &p.topic));
}

/// `h` with only the topics `sees` shows (and without the sum of the
/// topics past the busiest, which may hold hidden ones).
pub fn history(svc: &Services, sees: &Sees, h: History) -> History {
    if matches!(sees, Sees::All) {
        return h;
    }
    let mut shown: BTreeMap<String, bool> = BTreeMap::new();
    let points = h
        .points
        .iter()
        .map(|p| {
            let topics = p
                .topics
                .iter()
                .filter(|(name, _)| {
                    *shown
                        .entry((*name).clone())
                        .or_insert_with(|| sees.topic(svc, name))
                })
                .map(|(n, r)| (n.clone(), *r))
                .collect();
            Arc::new(Point {
                t_ms: p.t_ms,
                topics,
            })
        })
        .collect();
    History {
        period_ms: h.period_ms,
        points,
    }
}
