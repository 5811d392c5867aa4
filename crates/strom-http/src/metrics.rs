//! `/metrics`: a [`ServerSnapshot`] rendered by `prometheus-client` in the
//! OpenMetrics text format, which Prometheus scrapes (and `promtool check
//! metrics` accepts). Names follow Prometheus conventions: a `strom_`
//! prefix, base units (`_bytes`, `_seconds`) and `_total` on counters.
//!
//! The snapshot is taken per scrape and handed to a one-off registry
//! through a [`Collector`], so nothing here keeps state between scrapes.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use strom_server::stats::{HistogramSnapshot, PartitionSnapshot, ServerSnapshot};

/// The content type of OpenMetrics text, what Prometheus asks for first.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the classic Prometheus text format (0.0.4), served
/// to scrapers and tools (curl, `promtool check metrics`) that do not ask
/// for OpenMetrics.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The snapshot as OpenMetrics text.
pub fn render(snapshot: ServerSnapshot) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(snapshot)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// OpenMetrics text as the classic Prometheus text format. The two differ
/// only in framing: a counter family is named without `_total` in
/// OpenMetrics' `HELP`/`TYPE` lines and with it in Prometheus', and
/// Prometheus has no `UNIT` or `EOF` lines. Samples are the same.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[derive(Debug)]
struct SnapshotCollector(ServerSnapshot);

pub(crate) type Labels = Vec<(&'static str, String)>;

fn partition_labels(p: &PartitionSnapshot) -> Labels {
    vec![
        ("topic", p.topic.clone()),
        ("partition", p.partition.to_string()),
        ("type", p.partition_type.clone()),
    ]
}

/// A value as one metric kind, for [`family`].
pub(crate) enum Value<'a> {
    Counter(u64),
    Gauge(i64),
    GaugeF(f64),
    Histogram(&'a HistogramSnapshot),
}

impl Value<'_> {
    fn encode(&self, mut m: MetricEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Value::Counter(v) => m.encode_counter::<Labels, _, u64>(v, None),
            Value::Gauge(v) => m.encode_gauge(v),
            Value::GaugeF(v) => m.encode_gauge(v),
            Value::Histogram(h) => {
                // The encoder wants per-bucket counts and adds them up
                // itself; the snapshot's are cumulative.
                let mut buckets = Vec::with_capacity(h.buckets.len() + 1);
                let mut below = 0;
                for (bound, cumulative) in &h.buckets {
                    buckets.push((*bound, cumulative - below));
                    below = *cumulative;
                }
                buckets.push((f64::INFINITY, h.count - below));
                m.encode_histogram::<Labels>(h.sum, h.count, &buckets, None)
            }
        }
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Value::Counter(_) => MetricType::Counter,
            Value::Gauge(_) | Value::GaugeF(_) => MetricType::Gauge,
            Value::Histogram(_) => MetricType::Histogram,
        }
    }
}

/// One metric family: a descriptor, then one sample (set) per label set.
/// Families with no samples are left out.
pub(crate) fn family<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels, Value<'a>)>,
) -> Result<(), std::fmt::Error> {
    let mut rows = rows.into_iter().peekable();
    let Some((_, first)) = rows.peek() else {
        return Ok(());
    };
    let kind = first.metric_type();
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, value) in rows {
        if labels.is_empty() {
            // A family without labels has this one sample.
            return value.encode(m);
        }
        value.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A family with one row per partition, `value` picking what it shows.
fn per_partition<'a>(
    enc: &mut DescriptorEncoder,
    parts: &'a [PartitionSnapshot],
    (name, help, unit): (&str, &str, Option<Unit>),
    value: impl Fn(&'a PartitionSnapshot) -> Value<'a>,
) -> Result<(), std::fmt::Error> {
    family(
        enc,
        name,
        help,
        unit,
        parts.iter().map(|p| (partition_labels(p), value(p))),
    )
}

pub(crate) fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        server_metrics(&mut enc, s)?;
        partition_counters(&mut enc, &s.partitions)?;
        partition_histograms(&mut enc, &s.partitions)?;
        partition_storage(&mut enc, &s.partitions)?;
        consumer_metrics(&mut enc, &s.partitions)?;
        crate::metrics_ops::encode(&mut enc, s)?;
        crate::metrics_work::encode(&mut enc, s)
    }
}

fn server_metrics(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Result<(), std::fmt::Error> {
    let info = vec![
        ("member", s.member.to_string()),
        ("addr", s.addr.clone()),
        ("master", s.master.to_string()),
    ];
    family(
        enc,
        "strom_server_info",
        "This server: its member id, address and whether it holds the registry (always 1).",
        None,
        [(info, Value::Gauge(1))],
    )?;
    family(
        enc,
        "strom_members",
        "Group members this server knows of (all of them on the master), by liveness.",
        None,
        [true, false].map(|alive| {
            let n = s.members.iter().filter(|m| m.alive == alive).count() as i64;
            (vec![("alive", alive.to_string())], Value::Gauge(n))
        }),
    )?;
    family(
        enc,
        "strom_connections",
        "Client and peer connections open now.",
        None,
        [(Labels::new(), Value::Gauge(gauge(s.connections_open)))],
    )?;
    family(
        enc,
        "strom_connections_opened",
        "Connections accepted since the server started.",
        None,
        [(Labels::new(), Value::Counter(s.connections_total))],
    )?;
    family(
        enc,
        "strom_errors",
        "Error answers sent to clients, by error code.",
        None,
        s.errors.iter().map(|e| {
            let labels = vec![("code", e.code.to_string()), ("name", e.name.clone())];
            (labels, Value::Counter(e.count))
        }),
    )?;
    family(
        enc,
        "process_resident_memory",
        "Resident memory of the server process.",
        Some(Unit::Bytes),
        s.rss_bytes.map(|b| (Labels::new(), Value::Gauge(gauge(b)))),
    )
}

fn partition_counters(
    enc: &mut DescriptorEncoder,
    parts: &[PartitionSnapshot],
) -> Result<(), std::fmt::Error> {
    use Value::Counter as C;
    let b = Some(Unit::Bytes);
    per_partition(
        enc,
        parts,
        ("strom_partition_in_events", "Events appended.", None),
        |p| C(p.events_in),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_in",
            "Bytes appended (metadata and data).",
            b.clone(),
        ),
        |p| C(p.bytes_in),
    )?;
    per_partition(
        enc,
        parts,
        ("strom_partition_in_batches", "Batches appended.", None),
        |p| C(p.batches_in),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_append_errors",
            "Appends that failed.",
            None,
        ),
        |p| C(p.append_errors),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_sequence_gaps",
            "Idempotent producers' resends that skipped batches this copy never got (acknowledged by a leader alone and lost with it).",
            None,
        ),
        |p| C(p.sequence_gaps),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_out_events",
            "Events delivered to readers (pushed metadata).",
            None,
        ),
        |p| C(p.events_out),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_out",
            "Bytes delivered to readers (metadata pushed and data fetched).",
            b,
        ),
        |p| C(p.bytes_out),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_dropped_events",
            "Events a memory partition's bound dropped unread (drop-oldest).",
            None,
        ),
        |p| C(p.dropped_events),
    )
}

fn partition_histograms(
    enc: &mut DescriptorEncoder,
    parts: &[PartitionSnapshot],
) -> Result<(), std::fmt::Error> {
    use Value::Histogram as H;
    let s = Some(Unit::Seconds);
    per_partition(
        enc,
        parts,
        (
            "strom_partition_batch_events",
            "Events per appended batch.",
            None,
        ),
        |p| H(&p.batch_events),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_batch",
            "Bytes per appended batch.",
            Some(Unit::Bytes),
        ),
        |p| H(&p.batch_bytes),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_append_latency",
            "Time to write one batch to the log (without fsync).",
            s.clone(),
        ),
        |p| H(&p.append_seconds),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_fsync_latency",
            "Time of one fdatasync of the partition (always and interval durability).",
            s,
        ),
        |p| H(&p.fsync_seconds),
    )
}

fn partition_storage(
    enc: &mut DescriptorEncoder,
    parts: &[PartitionSnapshot],
) -> Result<(), std::fmt::Error> {
    use Value::Gauge as G;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_storage",
            "Bytes the partition holds (metadata and data).",
            Some(Unit::Bytes),
        ),
        |p| G(gauge(p.storage_bytes)),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_segments",
            "Segments of the partition's log.",
            None,
        ),
        |p| G(i64::from(p.segments)),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_first_offset",
            "Offset of the oldest event kept.",
            None,
        ),
        |p| G(gauge(p.first_offset)),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_next_offset",
            "Offset the next appended event gets (last offset + 1).",
            None,
        ),
        |p| G(gauge(p.next_offset)),
    )?;
    per_partition(
        enc,
        parts,
        (
            "strom_partition_sealed",
            "1 once the topic has ended (every producer closed).",
            None,
        ),
        |p| G(i64::from(p.sealed)),
    )
}

fn consumer_metrics(
    enc: &mut DescriptorEncoder,
    parts: &[PartitionSnapshot],
) -> Result<(), std::fmt::Error> {
    let rows = || {
        parts.iter().flat_map(|p| {
            p.consumers.iter().map(move |c| {
                let mut labels = partition_labels(p);
                labels.push(("consumer", c.name.clone()));
                (labels, c)
            })
        })
    };
    family(
        enc,
        "strom_consumer_committed_offset",
        "The consumer name's committed offset: it has processed every event below it.",
        None,
        rows().map(|(l, c)| (l, Value::Gauge(gauge(c.committed)))),
    )?;
    family(
        enc,
        "strom_consumer_lag_events",
        "Events appended past the consumer name's committed offset.",
        None,
        rows().map(|(l, c)| (l, Value::Gauge(gauge(c.lag)))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_their_total_suffix_in_help_and_type_lines() {
        let om = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total 3\n\
                  # HELP b Bytes held.\n# TYPE b gauge\n# UNIT b bytes\nb 1\n# EOF\n";
        let text = to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total 3\n\
             # HELP b Bytes held.\n# TYPE b gauge\nb 1\n"
        );
    }
}
