//! The part of `/metrics` about work in flight: shared consumer groups
//! (pending, redelivered and dead-lettered events, per group and per
//! consumer), producer leases, transforms' lag and the Kafka front end's
//! requests, errors, groups and members, the audit trail's counts, and
//! the answers rate quotas held.
//! docs/observability.md lists them.

use prometheus_client::encoding::DescriptorEncoder;
use strom_server::health::SharedGroupSnapshot;
use strom_server::stats::{PartitionSnapshot, ServerSnapshot};

use crate::metrics::{family, gauge, Labels, Value};

type Fmt = Result<(), std::fmt::Error>;

/// The consumer name prefix a transform reads its source under
/// (`transform.NAME`, docs/transforms.md).
const TRANSFORM_CONSUMER: &str = "transform.";

/// Every metric of this part.
pub(crate) fn encode(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    shared_groups(enc, &s.partitions)?;
    leases(enc, s)?;
    transforms(enc, &s.partitions)?;
    kafka(enc, s)?;
    audit(enc, s)?;
    quotas(enc, s)
}

/// How long rate quotas held answers, per quota (docs/quotas.md).
fn quotas(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    let rows = || {
        s.quotas.throttled.iter().map(|t| {
            let labels = vec![("kind", t.kind.clone()), ("quota", t.key.clone())];
            (labels, t)
        })
    };
    family(
        enc,
        "strom_quota_throttled_answers",
        "Answers a rate quota held (produce or consume), per quota.",
        None,
        rows().map(|(l, t)| (l, Value::Counter(t.answers))),
    )?;
    family(
        enc,
        "strom_quota_throttled_seconds",
        "Time answers were held by a rate quota, in all, per quota.",
        None,
        rows().map(|(l, t)| (l, Value::GaugeF(t.micros as f64 / 1e6))),
    )
}

fn group_labels(p: &PartitionSnapshot, g: &SharedGroupSnapshot) -> Labels {
    vec![
        ("topic", p.topic.clone()),
        ("partition", p.partition.to_string()),
        ("group", g.group.clone()),
    ]
}

fn groups(
    parts: &[PartitionSnapshot],
) -> impl Iterator<Item = (Labels, &PartitionSnapshot, &SharedGroupSnapshot)> + Clone {
    parts.iter().flat_map(|p| {
        p.shared_groups
            .iter()
            .map(move |g| (group_labels(p, g), p, g))
    })
}

fn shared_groups(enc: &mut DescriptorEncoder, parts: &[PartitionSnapshot]) -> Fmt {
    let rows = || groups(parts);
    family(
        enc,
        "strom_shared_group_pending_events",
        "Events a shared consumer group delivered and has not had acked yet.",
        None,
        rows().map(|(l, _, g)| (l, Value::Gauge(gauge(g.pending)))),
    )?;
    family(
        enc,
        "strom_shared_group_lag_events",
        "Events of the partition past the shared group's lowest unresolved offset.",
        None,
        rows().map(|(l, p, g)| {
            let lag = p.next_offset.saturating_sub(g.committed);
            (l, Value::Gauge(gauge(lag)))
        }),
    )?;
    family(
        enc,
        "strom_shared_group_redelivered_events",
        "Deliveries after an event's first (visibility timeouts, nacks, members that left).",
        None,
        rows().map(|(l, _, g)| (l, Value::Counter(g.redelivered))),
    )?;
    family(
        enc,
        "strom_shared_group_dead_lettered_events",
        "Events sent to the group's dead-letter topic after max_deliveries.",
        None,
        rows().map(|(l, _, g)| (l, Value::Counter(g.dead_lettered))),
    )?;
    family(
        enc,
        "strom_shared_group_consumer_pending_events",
        "Events each member stream of a shared group holds unacked.",
        None,
        rows().flat_map(|(l, _, g)| {
            g.pending_by_consumer.iter().map(move |(consumer, n)| {
                let mut l = l.clone();
                l.push(("consumer", consumer.to_string()));
                (l, Value::Gauge(gauge(*n)))
            })
        }),
    )
}

fn leases(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    if s.master {
        family(
            enc,
            "strom_producer_leases",
            "Producers holding a lease now (on the registry master).",
            None,
            [(Labels::new(), Value::Gauge(gauge(s.leases.open)))],
        )?;
    }
    family(
        enc,
        "strom_producer_leases_expired",
        "Producer leases that ran out here; each ends its producer's part of the stream.",
        None,
        [(Labels::new(), Value::Counter(s.leases.expired))],
    )
}

fn transforms(enc: &mut DescriptorEncoder, parts: &[PartitionSnapshot]) -> Fmt {
    family(
        enc,
        "strom_transform_lag_events",
        "Events of a source partition a transform has not committed yet (on the partition's host).",
        None,
        parts.iter().flat_map(|p| {
            p.consumers.iter().filter_map(move |c| {
                let name = c.name.strip_prefix(TRANSFORM_CONSUMER)?;
                let labels = vec![
                    ("transform", name.to_string()),
                    ("topic", p.topic.clone()),
                    ("partition", p.partition.to_string()),
                ];
                Some((labels, Value::Gauge(gauge(c.lag))))
            })
        }),
    )
}

fn audit(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    let a = &s.audit;
    family(
        enc,
        "strom_audit_records",
        "Audit records made here (changes and refusals; each is a strom::audit log line).",
        None,
        [(Labels::new(), Value::Counter(a.recorded))],
    )?;
    if !a.to_topic {
        return Ok(());
    }
    family(
        enc,
        "strom_audit_written",
        "Audit records appended to this member's partition of strom.audit.",
        None,
        [(Labels::new(), Value::Counter(a.written))],
    )?;
    family(
        enc,
        "strom_audit_dropped",
        "Audit records left out of strom.audit because its queue was full (still logged).",
        None,
        [(Labels::new(), Value::Counter(a.dropped))],
    )
}

fn kafka(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    let k = &s.kafka;
    if !k.enabled {
        return Ok(());
    }
    family(
        enc,
        "strom_kafka_requests",
        "Kafka requests received, by API.",
        None,
        k.requests
            .iter()
            .map(|r| (vec![("api", r.api.clone())], Value::Counter(r.count))),
    )?;
    family(
        enc,
        "strom_kafka_errors",
        "Error codes in Kafka responses, by API and Kafka error (each partition's, topic's or group's counts, as Kafka's ErrorsPerSec).",
        None,
        k.errors.iter().map(|e| {
            let l = vec![("api", e.api.clone()), ("error", e.error.clone())];
            (l, Value::Counter(e.count))
        }),
    )?;
    family(
        enc,
        "strom_kafka_groups",
        "Kafka consumer groups this server coordinates.",
        None,
        [(Labels::new(), Value::Gauge(gauge(k.groups)))],
    )?;
    family(
        enc,
        "strom_kafka_group_members",
        "Members of the Kafka consumer groups this server coordinates.",
        None,
        [(Labels::new(), Value::Gauge(gauge(k.members)))],
    )
}
