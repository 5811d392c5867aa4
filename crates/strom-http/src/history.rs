//! Rates over the last minutes, for the dashboard's charts and `strom
//! top`: a sampler takes a snapshot of the group (on the master: every
//! live member; elsewhere: this server) every period, turns the counter
//! deltas into per-topic rates, and keeps the newest points in a bounded
//! ring.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use strom_server::stats::GroupSnapshot;
use strom_server::Services;

/// Per-second rates of one topic (summed over this server's partitions).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Rates {
    pub in_events: f64,
    pub in_bytes: f64,
    pub out_events: f64,
    pub out_bytes: f64,
}

/// Rates of every topic over one sampling period, ending at `t_ms`.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Milliseconds since the Unix epoch.
    pub t_ms: u64,
    pub topics: BTreeMap<String, Rates>,
}

/// The newest points, oldest first.
#[derive(Clone, Debug, Serialize)]
pub struct History {
    pub period_ms: u64,
    pub points: Vec<Point>,
}

/// Counter totals of one topic.
#[derive(Clone, Copy, Default)]
struct Totals {
    in_events: u64,
    in_bytes: u64,
    out_events: u64,
    out_bytes: u64,
}

fn totals(s: &GroupSnapshot) -> BTreeMap<String, Totals> {
    let mut out: BTreeMap<String, Totals> = BTreeMap::new();
    for p in s.servers.iter().flat_map(|s| &s.partitions) {
        let t = out.entry(p.topic.clone()).or_default();
        t.in_events += p.events_in;
        t.in_bytes += p.bytes_in;
        t.out_events += p.events_out;
        t.out_bytes += p.bytes_out;
    }
    out
}

/// Rates between two totals `secs` apart. A counter that went down (a
/// topic deleted and created again) counts from zero.
fn rates(before: Option<&Totals>, now: &Totals, secs: f64) -> Rates {
    let b = before.copied().unwrap_or_default();
    let per_s = |now: u64, then: u64| {
        let d = if now >= then { now - then } else { now };
        d as f64 / secs
    };
    Rates {
        in_events: per_s(now.in_events, b.in_events),
        in_bytes: per_s(now.in_bytes, b.in_bytes),
        out_events: per_s(now.out_events, b.out_events),
        out_bytes: per_s(now.out_bytes, b.out_bytes),
    }
}

/// When the last sample was taken (µs since the epoch), and its totals.
type Baseline = Option<(u64, BTreeMap<String, Totals>)>;

/// The ring of points and the totals of the last sample.
pub struct Recorder {
    period: Duration,
    capacity: usize,
    inner: Mutex<(VecDeque<Point>, Baseline)>,
}

impl Recorder {
    pub fn new(period: Duration, capacity: usize) -> Self {
        Recorder {
            period,
            capacity: capacity.max(1),
            inner: Mutex::new((VecDeque::new(), None)),
        }
    }

    /// Adds the rates since the previous snapshot of the group (the first
    /// one only sets the baseline). Timed by this server's snapshot.
    pub fn record(&self, s: &GroupSnapshot) {
        let now = totals(s);
        let t_us = s.servers.first().map_or(0, |s| s.taken_us);
        let mut inner = self.inner.lock();
        let (ring, last) = &mut *inner;
        if let Some((then_us, before)) = last.as_ref() {
            let secs = t_us.saturating_sub(*then_us) as f64 / 1e6;
            if secs > 0.0 {
                let topics = now
                    .iter()
                    .map(|(name, t)| (name.clone(), rates(before.get(name), t, secs)))
                    .collect();
                if ring.len() == self.capacity {
                    ring.pop_front();
                }
                ring.push_back(Point {
                    t_ms: t_us / 1000,
                    topics,
                });
            }
        }
        *last = Some((t_us, now));
    }

    pub fn history(&self) -> History {
        History {
            period_ms: self.period.as_millis() as u64,
            points: self.inner.lock().0.iter().cloned().collect(),
        }
    }

    /// Samples `services` every period until `stop` turns true.
    pub async fn run(
        self: Arc<Self>,
        services: Arc<Services>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.record(&services.group_snapshot().await),
                _ = stop.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strom_server::stats::ServerSnapshot;

    fn snap(taken_us: u64, topic: &str, events_in: u64, bytes_in: u64) -> GroupSnapshot {
        let mut s = empty(taken_us);
        let mut p = strom_server::stats::PartitionSnapshot::counters(&Default::default());
        p.topic = topic.into();
        p.events_in = events_in;
        p.bytes_in = bytes_in;
        s.partitions.push(p);
        GroupSnapshot {
            servers: vec![s],
            unreachable: vec![],
        }
    }

    fn empty(taken_us: u64) -> ServerSnapshot {
        ServerSnapshot {
            member: 0,
            addr: "a".into(),
            master: true,
            members: vec![],
            connections_open: 0,
            connections_total: 0,
            errors: vec![],
            rss_bytes: None,
            taken_us,
            partitions: vec![],
        }
    }

    #[test]
    fn rates_are_counter_deltas_per_second_and_the_ring_is_bounded() {
        let r = Recorder::new(Duration::from_secs(1), 2);
        r.record(&snap(1_000_000, "t", 100, 1000));
        assert!(
            r.history().points.is_empty(),
            "the first sample is the baseline"
        );
        r.record(&snap(3_000_000, "t", 300, 5000));
        let h = r.history();
        assert_eq!(h.points.len(), 1);
        let rates = h.points[0].topics["t"];
        assert_eq!(rates.in_events, 100.0);
        assert_eq!(rates.in_bytes, 2000.0);
        r.record(&snap(4_000_000, "t", 310, 5000));
        r.record(&snap(5_000_000, "t", 320, 5000));
        let h = r.history();
        assert_eq!(h.points.len(), 2, "capacity 2 keeps the newest two");
        assert_eq!(h.points[1].t_ms, 5000);
        assert_eq!(h.points[1].topics["t"].in_events, 10.0);
    }

    #[test]
    fn a_counter_that_restarts_counts_from_zero() {
        let r = Recorder::new(Duration::from_secs(1), 10);
        r.record(&snap(1_000_000, "t", 500, 0));
        r.record(&snap(2_000_000, "t", 20, 0));
        assert_eq!(r.history().points[0].topics["t"].in_events, 20.0);
    }
}
