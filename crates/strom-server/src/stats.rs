//! The metrics tap: counters and histograms that the service layer, the
//! native front end and the partition managers update as they work, and
//! plain snapshots of them for the front ends that show them (the HTTP
//! endpoint renders a [`ServerSnapshot`] as Prometheus metrics and as the
//! dashboard's JSON; `strom top` reads that JSON).
//!
//! Updates are relaxed atomic adds: no lock, no allocation, once per batch
//! or per request, never per event. Error counts are the exception (a map
//! behind a mutex), as errors are not the hot path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::health::{
    DiskSnapshot, GroupPartition, KafkaSnapshot, LeaseSnapshot, QuorumSnapshot, ReplicaSnapshot,
    SharedGroupSnapshot, TierSnapshot,
};

/// Bucket upper bounds of latency histograms, in nanoseconds (10 µs to 2.5 s).
const LATENCY_NS: &[u64] = &[
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// Bucket upper bounds of events per batch (1 to 64 Ki, powers of 4).
const BATCH_EVENTS: &[u64] = &[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536];

/// Bucket upper bounds of bytes per batch (256 B to 64 MiB, powers of 4).
const BATCH_BYTES: &[u64] = &[
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

/// A fixed-bucket histogram of non-negative integer observations.
pub struct Histogram {
    bounds: &'static [u64],
    /// One count per bound, plus the overflow (`+Inf`) bucket; not cumulative.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Cumulative counts per bound (Prometheus' `le` buckets), scaled by
    /// `scale` (1e-9 turns nanoseconds into seconds).
    fn snapshot(&self, scale: f64) -> HistogramSnapshot {
        let mut running = 0u64;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (bound, count) in self.bounds.iter().zip(self.counts.iter()) {
            running += count.load(Relaxed);
            buckets.push((*bound as f64 * scale, running));
        }
        let count = running + self.counts[self.bounds.len()].load(Relaxed);
        HistogramSnapshot {
            sum: self.sum.load(Relaxed) as f64 * scale,
            count,
            buckets,
        }
    }
}

/// A histogram at one moment: cumulative `(upper bound, count)` buckets
/// (the `+Inf` bucket is `count`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    pub sum: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

/// What one partition manager counts.
pub struct PartitionStats {
    events_in: AtomicU64,
    bytes_in: AtomicU64,
    batches_in: AtomicU64,
    append_errors: AtomicU64,
    sequence_gaps: AtomicU64,
    events_out: AtomicU64,
    bytes_out: AtomicU64,
    batch_events: Histogram,
    batch_bytes: Histogram,
    append_ns: Histogram,
    fsync_ns: Histogram,
}

impl Default for PartitionStats {
    fn default() -> Self {
        PartitionStats {
            events_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            batches_in: AtomicU64::new(0),
            append_errors: AtomicU64::new(0),
            sequence_gaps: AtomicU64::new(0),
            events_out: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            batch_events: Histogram::new(BATCH_EVENTS),
            batch_bytes: Histogram::new(BATCH_BYTES),
            append_ns: Histogram::new(LATENCY_NS),
            fsync_ns: Histogram::new(LATENCY_NS),
        }
    }
}

impl PartitionStats {
    /// A batch of `events` events and `bytes` bytes (metadata and data) was
    /// appended in `took`.
    pub fn appended(&self, events: u32, bytes: u64, took: Duration) {
        self.events_in.fetch_add(u64::from(events), Relaxed);
        self.bytes_in.fetch_add(bytes, Relaxed);
        self.batches_in.fetch_add(1, Relaxed);
        self.batch_events.observe(u64::from(events));
        self.batch_bytes.observe(bytes);
        self.append_ns.observe_duration(took);
    }

    pub fn append_failed(&self) {
        self.append_errors.fetch_add(1, Relaxed);
    }

    /// An idempotent producer's restarted sequence skipped batches.
    pub fn sequence_gap(&self) {
        self.sequence_gaps.fetch_add(1, Relaxed);
    }

    /// One fdatasync of the partition took `took`.
    pub fn synced(&self, took: Duration) {
        self.fsync_ns.observe_duration(took);
    }

    /// `events` events' metadata (`bytes` bytes) went to a reader.
    pub fn delivered(&self, events: u64, bytes: u64) {
        self.events_out.fetch_add(events, Relaxed);
        self.bytes_out.fetch_add(bytes, Relaxed);
    }

    /// `bytes` bytes of data parts were fetched by a reader.
    pub fn fetched(&self, bytes: u64) {
        self.bytes_out.fetch_add(bytes, Relaxed);
    }
}

/// What the server as a whole counts (the front ends update it).
#[derive(Default)]
pub struct ServerStats {
    connections_open: AtomicI64,
    connections_total: AtomicU64,
    /// Error answers sent, by error code.
    errors: Mutex<BTreeMap<u16, u64>>,
    /// Producer leases that ran out (the registry master's lease loop).
    leases_expired: AtomicU64,
    /// The Kafka front end's counts (empty without a Kafka listener).
    pub kafka: KafkaStats,
}

/// What the Kafka front end counts: requests and errors by API (a map
/// behind a mutex: one uncontended lock per request, not per record), and
/// its groups and their members as of its last tick.
#[derive(Default)]
pub struct KafkaStats {
    enabled: std::sync::atomic::AtomicBool,
    requests: Mutex<BTreeMap<&'static str, u64>>,
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    groups: AtomicU64,
    members: AtomicU64,
}

impl KafkaStats {
    /// A Kafka listener runs on this server.
    pub fn enable(&self) {
        self.enabled.store(true, Relaxed);
    }

    /// One request of `api` arrived.
    pub fn request(&self, api: &'static str) {
        *self.requests.lock().entry(api).or_default() += 1;
    }

    /// A request of `api` (or one partition or group in it) failed with
    /// the Kafka error `error`.
    pub fn error(&self, api: &'static str, error: &'static str) {
        *self.errors.lock().entry((api, error)).or_default() += 1;
    }

    /// The groups the front end coordinates and their members, now.
    pub fn set_groups(&self, groups: u64, members: u64) {
        self.groups.store(groups, Relaxed);
        self.members.store(members, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> crate::health::KafkaSnapshot {
        use crate::health::ApiCount;
        let count = |api: &str, error: &str, count: u64| ApiCount {
            api: api.to_string(),
            error: error.to_string(),
            count,
        };
        crate::health::KafkaSnapshot {
            enabled: self.enabled.load(Relaxed),
            requests: (self.requests.lock().iter())
                .map(|(api, n)| count(api, "", *n))
                .collect(),
            errors: (self.errors.lock().iter())
                .map(|((api, e), n)| count(api, e, *n))
                .collect(),
            groups: self.groups.load(Relaxed),
            members: self.members.load(Relaxed),
        }
    }
}

impl ServerStats {
    pub fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Relaxed);
        self.connections_total.fetch_add(1, Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections_open.fetch_sub(1, Relaxed);
    }

    /// An error answer with this code went to a client.
    pub fn error(&self, code: u16) {
        *self.errors.lock().entry(code).or_default() += 1;
    }

    pub(crate) fn errors(&self) -> Vec<ErrorCount> {
        self.errors
            .lock()
            .iter()
            .map(|(code, count)| ErrorCount {
                code: *code,
                name: strom_proto::ErrorCode(*code).name().to_string(),
                count: *count,
            })
            .collect()
    }

    /// `n` producer leases ran out.
    pub fn leases_expired(&self, n: usize) {
        self.leases_expired.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn expired_leases(&self) -> u64 {
        self.leases_expired.load(Relaxed)
    }

    pub(crate) fn connections(&self) -> (u64, u64) {
        (
            self.connections_open.load(Relaxed).max(0) as u64,
            self.connections_total.load(Relaxed),
        )
    }
}

/// Error answers with one code.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorCount {
    pub code: u16,
    /// The code's stable name (`TOPIC_NOT_FOUND`).
    pub name: String,
    pub count: u64,
}

/// One consumer name's position on a partition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConsumerLag {
    pub name: String,
    pub committed: u64,
    /// Events past the committed offset (`next_offset - committed`).
    pub lag: u64,
}

/// One hosted partition at one moment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartitionSnapshot {
    pub topic: String,
    pub partition: u32,
    /// `memory` or `file`.
    pub partition_type: String,
    pub first_offset: u64,
    pub next_offset: u64,
    pub storage_bytes: u64,
    pub segments: u32,
    pub dropped_events: u64,
    pub sealed: bool,
    pub events_in: u64,
    pub bytes_in: u64,
    pub batches_in: u64,
    pub append_errors: u64,
    /// Restarted producer sequences that skipped batches never received
    /// (acknowledged by a leader alone, then lost with it).
    #[serde(default)]
    pub sequence_gaps: u64,
    pub events_out: u64,
    pub bytes_out: u64,
    pub batch_events: HistogramSnapshot,
    pub batch_bytes: HistogramSnapshot,
    pub append_seconds: HistogramSnapshot,
    pub fsync_seconds: HistogramSnapshot,
    pub consumers: Vec<ConsumerLag>,
    /// Its copy's place among the replicas (replicated partitions only).
    #[serde(default)]
    pub replica: Option<ReplicaSnapshot>,
    /// Shared consumer groups reading it here, by name.
    #[serde(default)]
    pub shared_groups: Vec<SharedGroupSnapshot>,
    /// Its tier, when it has one.
    #[serde(default)]
    pub tier: Option<TierSnapshot>,
}

impl PartitionSnapshot {
    /// Counters and histograms of `s`; the caller fills in the rest.
    pub fn counters(s: &PartitionStats) -> Self {
        PartitionSnapshot {
            topic: String::new(),
            partition: 0,
            partition_type: String::new(),
            first_offset: 0,
            next_offset: 0,
            storage_bytes: 0,
            segments: 0,
            dropped_events: 0,
            sealed: false,
            events_in: s.events_in.load(Relaxed),
            bytes_in: s.bytes_in.load(Relaxed),
            batches_in: s.batches_in.load(Relaxed),
            append_errors: s.append_errors.load(Relaxed),
            sequence_gaps: s.sequence_gaps.load(Relaxed),
            events_out: s.events_out.load(Relaxed),
            bytes_out: s.bytes_out.load(Relaxed),
            batch_events: s.batch_events.snapshot(1.0),
            batch_bytes: s.batch_bytes.snapshot(1.0),
            append_seconds: s.append_ns.snapshot(1e-9),
            fsync_seconds: s.fsync_ns.snapshot(1e-9),
            consumers: Vec::new(),
            replica: None,
            shared_groups: Vec::new(),
            tier: None,
        }
    }
}

/// One group member as this server knows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberSnapshot {
    pub id: u32,
    pub addr: String,
    pub alive: bool,
}

/// A member the master could not get a snapshot from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Unreachable {
    pub id: u32,
    pub addr: String,
    pub error: String,
}

/// Every member's snapshot, as the master gathers them (a server that is
/// not the master knows only itself).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupSnapshot {
    pub servers: Vec<ServerSnapshot>,
    pub unreachable: Vec<Unreachable>,
}

/// One server process at one moment: what `/metrics` and the dashboard show.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerSnapshot {
    pub member: u32,
    pub addr: String,
    /// Whether this server holds the registry.
    pub master: bool,
    /// The group's members (all of them on the master; this one elsewhere).
    pub members: Vec<MemberSnapshot>,
    pub connections_open: u64,
    pub connections_total: u64,
    pub errors: Vec<ErrorCount>,
    /// Resident set size of the process, when the OS tells it.
    pub rss_bytes: Option<u64>,
    /// Microseconds since the Unix epoch when the snapshot was taken.
    pub taken_us: u64,
    pub partitions: Vec<PartitionSnapshot>,
    /// The metadata quorum as this member sees it.
    #[serde(default)]
    pub quorum: QuorumSnapshot,
    /// The data directory's file system, when `statvfs` answers.
    #[serde(default)]
    pub disk: Option<DiskSnapshot>,
    /// Every partition of the group as the registry records it (on the
    /// registry master; empty elsewhere).
    #[serde(default)]
    pub group_partitions: Vec<GroupPartition>,
    /// Producer leases (open ones on the registry master only).
    #[serde(default)]
    pub leases: LeaseSnapshot,
    /// The Kafka front end, when this server runs one.
    #[serde(default)]
    pub kafka: KafkaSnapshot,
    /// The audit trail.
    #[serde(default)]
    pub audit: crate::health::AuditSnapshot,
    /// The quota table this server enforces, and what it throttled.
    #[serde(default)]
    pub quotas: crate::quota::QuotaSnapshot,
}

/// The process's resident set size, from `/proc/self/statm` (Linux).
pub(crate) fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_count_the_overflow() {
        let h = Histogram::new(&[10, 100]);
        for v in [1, 10, 11, 100, 1000] {
            h.observe(v);
        }
        let s = h.snapshot(1.0);
        assert_eq!(s.buckets, vec![(10.0, 2), (100.0, 4)]);
        assert_eq!(s.count, 5);
        assert_eq!(s.sum, 1122.0);
    }

    #[test]
    fn latency_histograms_report_seconds() {
        let s = PartitionStats::default();
        s.appended(3, 300, Duration::from_micros(40));
        let snap = PartitionSnapshot::counters(&s);
        assert_eq!(snap.events_in, 3);
        assert_eq!(snap.bytes_in, 300);
        assert_eq!(snap.append_seconds.count, 1);
        assert!((snap.append_seconds.sum - 40e-6).abs() < 1e-12);
        // 40 µs falls in the 50 µs bucket, not in the 25 µs one.
        assert_eq!(snap.append_seconds.buckets[1], (25e-6, 0));
        assert_eq!(snap.append_seconds.buckets[2].1, 1);
    }

    #[test]
    fn errors_are_counted_by_code_with_their_names() {
        let s = ServerStats::default();
        s.error(strom_proto::ErrorCode::TOPIC_NOT_FOUND.0);
        s.error(strom_proto::ErrorCode::TOPIC_NOT_FOUND.0);
        let e = s.errors();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].count, 2);
        assert_eq!(e[0].name, "TOPIC_NOT_FOUND");
    }
}
