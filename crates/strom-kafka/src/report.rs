//! Tells the registry master about the Kafka groups this server
//! coordinates (`KafkaGroupView`), so that `strom group list` and
//! `strom group describe` show them beside native consumer groups: their
//! members, what each was assigned, and per partition the committed
//! offset (a Strom consumer offset under the group's name) and the lag.
//!
//! Every [`REPORT_EVERY`], each group with members is reported (the master
//! counts a view stale after its `KAFKA_VIEW_TTL`), and a group that lost
//! its last member is reported once more, empty. Only groups of Kafka's
//! `consumer` protocol reading exactly one topic map onto a Strom consumer
//! group (which is bound to one topic); others are left out, logged once.
//!
//! A group the coordinator forgot (empty past `kafka_group_retention_ms`)
//! is removed from the registry too, with its committed offsets, if this
//! reporter put it there: so a client cycling group ids cannot grow the
//! registry without bound.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, GroupConsumerInfo, Request};
use strom_server::ServerError;
use tokio::sync::watch;

use crate::consumer_protocol::{assigned_partitions, subscribed_topics};
use crate::groups::Described;
use crate::request::Ctx;

/// How often the groups are reported.
pub const REPORT_EVERY: Duration = Duration::from_secs(2);

/// What was last reported of one group.
#[derive(Default)]
struct Sent {
    topic: Option<String>,
    members: usize,
    /// The last failure, logged once until it changes.
    failure: Option<String>,
}

/// Reports until `stopped` changes.
pub(crate) async fn run(ctx: Arc<Ctx>, mut stopped: watch::Receiver<bool>) {
    let mut sent: HashMap<String, Sent> = HashMap::new();
    let mut adopted = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REPORT_EVERY) => {}
            _ = stopped.changed() => return,
        }
        if !adopted {
            adopted = adopt(&ctx, &mut sent).await;
        }
        report_all(&ctx, &mut sent).await;
    }
}

/// On the registry master: adopts the Kafka groups the registry kept from
/// before this listener started, as empty groups it reported, so that they
/// expire after the retention too. False while this server is not the
/// master (or not yet).
async fn adopt(ctx: &Ctx, sent: &mut HashMap<String, Sent>) -> bool {
    let Some(reg) = ctx.services.control.master_registry() else {
        return false;
    };
    for spec in reg.kafka_group_specs().await {
        if ctx.groups.adopt(&spec.name) {
            sent.insert(
                spec.name,
                Sent {
                    topic: Some(spec.topic),
                    ..Default::default()
                },
            );
        }
    }
    true
}

/// One round: every group that has members, or just lost its last one;
/// then the groups forgotten since the last round leave the registry.
async fn report_all(ctx: &Ctx, sent: &mut HashMap<String, Sent>) {
    for name in ctx.groups.take_expired() {
        let Some(topic) = sent.remove(&name).and_then(|s| s.topic) else {
            continue;
        };
        if ctx.groups.describe(&name).is_some() {
            continue; // joined again meanwhile: a new group of that name
        }
        match expire(ctx, &name, topic).await {
            Ok(()) => {
                tracing::info!(group = %name, "expired Kafka group removed from the registry")
            }
            Err(e) => {
                tracing::info!(group = %name, error = %e, "cannot remove an expired Kafka group from the registry")
            }
        }
    }
    let groups = ctx.groups.describe_all();
    sent.retain(|name, _| groups.iter().any(|(n, _)| n == name));
    for (name, d) in groups {
        let last = sent.entry(name.clone()).or_default();
        if d.members.is_empty() && last.members == 0 {
            continue;
        }
        let Some((spec, generation, consumers)) = view(&name, &d, last) else {
            continue;
        };
        let members = consumers.len();
        let result = send(ctx, spec.clone(), generation, consumers).await;
        match result {
            Ok(()) => {
                last.topic = Some(spec.topic);
                last.members = members;
                last.failure = None;
            }
            Err(e) => {
                let why = e.to_string();
                if last.failure.as_ref() != Some(&why) {
                    tracing::info!(group = %name, error = %why, "cannot show a Kafka group among Strom's consumer groups");
                    last.failure = Some(why);
                }
            }
        }
    }
}

/// The group as a Strom consumer group: spec, generation and members;
/// `None` (logged once) if it does not map onto one.
fn view(
    name: &str,
    d: &Described,
    last: &mut Sent,
) -> Option<(ConsumerGroupSpec, u64, Vec<GroupConsumerInfo>)> {
    let skip = |last: &mut Sent, why: String| {
        if last.failure.as_ref() != Some(&why) {
            tracing::info!(group = %name, reason = %why, "Kafka group left out of Strom's consumer groups");
            last.failure = Some(why);
        }
        None
    };
    if d.protocol_type != "consumer" {
        return skip(
            last,
            format!("protocol type '{}' is not 'consumer'", d.protocol_type),
        );
    }
    let topics: BTreeSet<String> = d
        .members
        .iter()
        .filter_map(|m| subscribed_topics(&m.subscription))
        .flatten()
        .collect();
    let topic = match topics.len() {
        0 => last.topic.clone()?,
        1 => topics.into_iter().next()?,
        n => {
            return skip(
                last,
                format!("it reads {n} topics; a Strom consumer group reads one"),
            )
        }
    };
    let consumers = d
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| GroupConsumerInfo {
            id: i as u64 + 1,
            label: m.id.clone(),
            alive: true,
            last_seen_ms: m.idle.as_millis() as u64,
            partitions: assigned_partitions(&m.assignment)
                .and_then(|mut a| a.remove(&topic))
                .unwrap_or_default(),
        })
        .collect();
    let spec = ConsumerGroupSpec::new(name, topic, ConsumerGroupMode::Kafka);
    Some((spec, d.generation.max(0) as u64, consumers))
}

/// Removes an expired Kafka group from the registry: here if this server
/// is the master, else at the master (an empty view first, so that the
/// master does not count its last members as live, then the deletion).
async fn expire(ctx: &Ctx, name: &str, topic: String) -> Result<(), ServerError> {
    if let Some(reg) = ctx.services.control.master_registry() {
        return reg.expire_kafka_group(name).await;
    }
    let spec = ConsumerGroupSpec::new(name, topic, ConsumerGroupMode::Kafka);
    send(ctx, spec, 0, Vec::new()).await?;
    let req = Request::DeleteConsumerGroup {
        group: name.to_string(),
    };
    ctx.services.control.ask_registry(req).await.map(|_| ())
}

/// Hands the view to the registry: here if this server is the master,
/// else to the master.
async fn send(
    ctx: &Ctx,
    spec: ConsumerGroupSpec,
    generation: u64,
    consumers: Vec<GroupConsumerInfo>,
) -> Result<(), ServerError> {
    if let Some(reg) = ctx.services.control.master_registry() {
        return reg.kafka_group_view(spec, generation, consumers).await;
    }
    let req = Request::KafkaGroupView {
        spec,
        generation,
        consumers,
    };
    ctx.services.control.ask_registry(req).await.map(|_| ())
}
