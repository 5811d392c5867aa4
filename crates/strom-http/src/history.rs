//! Rates over the last minutes, for the dashboard's charts and `strom
//! top`: a sampler takes a snapshot of the group (on the master: every
//! live member; elsewhere: this server) every period, turns the counter
//! deltas into per-topic rates, and keeps the newest points in a bounded
//! ring: at most [`MAX_TOPICS`] topics per point (the busiest; the rest
//! summed under [`OTHER`]) and about [`MAX_BYTES`] in all (the oldest
//! points go first). Points are shared (`Arc`), so a request for the
//! history copies pointers, not the ring.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
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

/// Topics one point keeps: the busiest by bytes in and out.
pub const MAX_TOPICS: usize = 100;

/// The name the rates of the topics past [`MAX_TOPICS`] are summed under
/// (not a valid topic name).
pub const OTHER: &str = "(other)";

/// Bytes the ring may hold, as [`Point::weight`] estimates them.
pub const MAX_BYTES: usize = 8 << 20;

impl Point {
    /// About the memory it holds, in bytes.
    fn weight(&self) -> usize {
        64 + self.topics.keys().map(|k| k.len() + 96).sum::<usize>()
    }
}

/// The newest points, oldest first, shared with the ring.
#[derive(Clone, Debug)]
pub struct History {
    pub period_ms: u64,
    pub points: Vec<Arc<Point>>,
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Points<'a>(&'a [Arc<Point>]);
        impl Serialize for Points<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|p| &**p))
            }
        }
        let mut st = s.serialize_struct("History", 2)?;
        st.serialize_field("period_ms", &self.period_ms)?;
        st.serialize_field("points", &Points(&self.points))?;
        st.end()
    }
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

/// The busiest [`MAX_TOPICS`] - 1 topics, and the others summed under
/// [`OTHER`] (all of them if they fit).
fn busiest(mut topics: Vec<(String, Rates)>) -> BTreeMap<String, Rates> {
    if topics.len() <= MAX_TOPICS {
        return topics.into_iter().collect();
    }
    let load = |r: &Rates| r.in_bytes + r.out_bytes + r.in_events + r.out_events;
    topics.sort_by(|a, b| load(&b.1).total_cmp(&load(&a.1)));
    let rest = topics.split_off(MAX_TOPICS - 1);
    let mut other = Rates::default();
    for (_, r) in rest {
        other.in_events += r.in_events;
        other.in_bytes += r.in_bytes;
        other.out_events += r.out_events;
        other.out_bytes += r.out_bytes;
    }
    let mut out: BTreeMap<String, Rates> = topics.into_iter().collect();
    out.insert(OTHER.to_string(), other);
    out
}

/// When the last sample was taken (µs since the epoch), and its totals.
type Baseline = Option<(u64, BTreeMap<String, Totals>)>;

/// The ring, its weight in bytes, and the totals of the last sample.
struct Ring {
    points: VecDeque<Arc<Point>>,
    bytes: usize,
    last: Baseline,
}

/// The ring of points and the totals of the last sample.
pub struct Recorder {
    period: Duration,
    capacity: usize,
    inner: Mutex<Ring>,
}

impl Recorder {
    pub fn new(period: Duration, capacity: usize) -> Self {
        Recorder {
            period,
            capacity: capacity.max(1),
            inner: Mutex::new(Ring {
                points: VecDeque::new(),
                bytes: 0,
                last: None,
            }),
        }
    }

    /// Adds the rates since the previous snapshot of the group (the first
    /// one only sets the baseline). Timed by this server's snapshot.
    pub fn record(&self, s: &GroupSnapshot) {
        let now = totals(s);
        let t_us = s.servers.first().map_or(0, |s| s.taken_us);
        let mut ring = self.inner.lock();
        if let Some((then_us, before)) = ring.last.as_ref() {
            let secs = t_us.saturating_sub(*then_us) as f64 / 1e6;
            if secs > 0.0 {
                let topics = now
                    .iter()
                    .map(|(name, t)| (name.clone(), rates(before.get(name), t, secs)))
                    .collect();
                let point = Point {
                    t_ms: t_us / 1000,
                    topics: busiest(topics),
                };
                ring.bytes += point.weight();
                ring.points.push_back(Arc::new(point));
                while ring.points.len() > self.capacity || ring.bytes > MAX_BYTES {
                    let Some(old) = ring.points.pop_front() else {
                        break;
                    };
                    ring.bytes -= old.weight();
                }
            }
        }
        ring.last = Some((t_us, now));
    }

    /// The points, shared with the ring (no copy of their contents).
    pub fn history(&self) -> History {
        History {
            period_ms: self.period.as_millis() as u64,
            points: self.inner.lock().points.iter().cloned().collect(),
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
            quorum: Default::default(),
            disk: None,
            group_partitions: vec![],
            leases: Default::default(),
            kafka: Default::default(),
            audit: Default::default(),
            quotas: Default::default(),
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

    fn many(taken_us: u64, topics: usize, name_len: usize, scale: u64) -> GroupSnapshot {
        let mut s = empty(taken_us);
        for i in 0..topics {
            let mut p = strom_server::stats::PartitionSnapshot::counters(&Default::default());
            p.topic = format!("{i:0>name_len$}");
            p.events_in = scale * i as u64;
            p.bytes_in = scale * i as u64;
            s.partitions.push(p);
        }
        GroupSnapshot {
            servers: vec![s],
            unreachable: vec![],
        }
    }

    #[test]
    fn each_point_keeps_the_busiest_topics_and_sums_the_rest() {
        let r = Recorder::new(Duration::from_secs(1), 600);
        r.record(&many(1_000_000, 1000, 8, 0));
        r.record(&many(2_000_000, 1000, 8, 1));
        let h = r.history();
        let p = &h.points[0];
        assert_eq!(p.topics.len(), MAX_TOPICS);
        // Topic i moved i events: the busiest are the last ones.
        assert_eq!(p.topics[&format!("{:0>8}", 999)].in_events, 999.0);
        assert!(!p.topics.contains_key(&format!("{:0>8}", 0)));
        let all: f64 = (0..1000).map(f64::from).sum();
        let kept: f64 = p.topics.values().map(|r| r.in_events).sum();
        assert_eq!(kept, all, "the others are summed, not dropped");
        assert!(p.topics[OTHER].in_events > 0.0);
    }

    #[test]
    fn the_ring_is_bounded_in_bytes_and_requests_share_its_points() {
        let r = Recorder::new(Duration::from_secs(1), 600);
        for i in 0..600u64 {
            r.record(&many(1_000_000 * (i + 1), 150, 200, i));
        }
        let bytes = r.inner.lock().bytes;
        assert!(bytes <= MAX_BYTES, "{bytes} bytes held");
        let h1 = r.history();
        assert!(h1.points.len() < 599, "{} points kept", h1.points.len());
        let h2 = r.history();
        assert!(
            Arc::ptr_eq(&h1.points[0], &h2.points[0]),
            "a request shares the points"
        );
        let json = serde_json::to_value(&h1).unwrap();
        assert_eq!(json["points"].as_array().unwrap().len(), h1.points.len());
    }
}
