//! Kafka consumer groups in the registry: a Kafka listener's group
//! coordinator reports each group it runs (`KafkaGroupView`), and the
//! master keeps it as a consumer group of mode `kafka`, so `group list`,
//! `group describe` and `group delete` cover Kafka groups like native ones.
//!
//! The group's spec is a registry command (it persists, as do its
//! committed offsets, which are consumer offsets on the partitions). Its
//! members and generation are volatile: the Kafka protocol owns them, and
//! the coordinator refreshes the view every few seconds. A view not
//! refreshed within [`KAFKA_VIEW_TTL`] shows its members as gone (the
//! coordinator's broker stopped).
//!
//! A Kafka group its coordinator forgot (empty past
//! `kafka_group_retention_ms`) is deleted here too
//! ([`Registry::expire_kafka_group`]), with its committed offsets.

use std::time::{Duration, Instant};

use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, GroupConsumerInfo};

use super::Registry;
use crate::error::ServerError;

/// How long a reported view stands without a refresh.
pub const KAFKA_VIEW_TTL: Duration = Duration::from_secs(10);

/// The most members a view may list.
const MAX_MEMBERS: usize = 10_000;

/// The last view of one Kafka group, as its coordinator reported it.
pub(super) struct KafkaView {
    generation: u64,
    consumers: Vec<GroupConsumerInfo>,
    at: Instant,
}

impl KafkaView {
    /// The members as of now: gone once the view is stale.
    pub(super) fn consumers(&self, now: Instant) -> Vec<GroupConsumerInfo> {
        let age = now.duration_since(self.at);
        let fresh = age <= KAFKA_VIEW_TTL;
        self.consumers
            .iter()
            .map(|c| GroupConsumerInfo {
                alive: c.alive && fresh,
                last_seen_ms: c.last_seen_ms.saturating_add(age.as_millis() as u64),
                ..c.clone()
            })
            .collect()
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Members the coordinator still counts, if the view is fresh.
    pub(super) fn live_members(&self, now: Instant) -> usize {
        self.consumers(now).iter().filter(|c| c.alive).count()
    }
}

impl Registry {
    /// Records what a Kafka coordinator reports of one group, creating the
    /// group (mode `kafka`) on first sight. A native group of that name, or
    /// a Kafka group of another topic, is `CONSUMER_GROUP_MISMATCH`.
    pub async fn kafka_group_view(
        &self,
        spec: ConsumerGroupSpec,
        generation: u64,
        consumers: Vec<GroupConsumerInfo>,
    ) -> Result<(), ServerError> {
        if spec.mode != ConsumerGroupMode::Kafka {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "a Kafka group view must name mode kafka, not {}",
                    spec.mode.as_str()
                ),
            ));
        }
        if consumers.len() > MAX_MEMBERS {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "a Kafka group view lists {} members; at most {MAX_MEMBERS}",
                    consumers.len()
                ),
            ));
        }
        let existing = self
            .inner
            .lock()
            .await
            .state
            .consumer_groups
            .get(&spec.name)
            .map(|m| m.spec.clone());
        match existing {
            Some(s) if s.mode != spec.mode || s.topic != spec.topic => {
                return Err(ServerError::coded(
                    ErrorCode::CONSUMER_GROUP_MISMATCH,
                    format!(
                        "consumer group '{}' is a {} group of topic '{}'; the Kafka group of that name reads topic '{}'",
                        spec.name,
                        s.mode.as_str(),
                        s.topic,
                        spec.topic
                    ),
                ));
            }
            Some(_) => {}
            None => self.create_group(spec.clone()).await?,
        }
        let view = KafkaView {
            generation,
            consumers,
            at: Instant::now(),
        };
        self.coord.lock().kafka.insert(spec.name, view);
        Ok(())
    }

    /// `(members, generation)` of a Kafka group as last reported.
    pub(super) fn kafka_members(&self, name: &str) -> (Vec<GroupConsumerInfo>, u64) {
        let coord = self.coord.lock();
        match coord.kafka.get(name) {
            Some(v) => (v.consumers(Instant::now()), v.generation()),
            None => (Vec::new(), 0),
        }
    }

    /// Refuses to delete a Kafka group that still has live members (as
    /// Kafka refuses `NON_EMPTY_GROUP`); forgets its view otherwise.
    pub(super) fn forget_kafka_group(&self, name: &str) -> Result<(), ServerError> {
        let mut coord = self.coord.lock();
        let live = coord
            .kafka
            .get(name)
            .map_or(0, |v| v.live_members(Instant::now()));
        if live > 0 {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("Kafka group '{name}' has {live} live member(s); stop its consumers before deleting it"),
            ));
        }
        coord.kafka.remove(name);
        Ok(())
    }

    /// Deletes the Kafka group `name`, which its coordinator forgot after
    /// it stayed empty for the retention: a native group of that name, or
    /// none, is left alone.
    pub async fn expire_kafka_group(&self, name: &str) -> Result<(), ServerError> {
        let kafka = self
            .inner
            .lock()
            .await
            .state
            .consumer_groups
            .get(name)
            .is_some_and(|m| m.spec.mode == ConsumerGroupMode::Kafka);
        if !kafka {
            return Ok(());
        }
        // The coordinator knows it has no members; its last view may not
        // have said so yet.
        self.coord.lock().kafka.remove(name);
        self.delete_group(name).await
    }

    /// The specs of every Kafka-mode group the registry holds (a
    /// restarted coordinator adopts them, so they expire as well).
    pub async fn kafka_group_specs(&self) -> Vec<ConsumerGroupSpec> {
        self.inner
            .lock()
            .await
            .state
            .consumer_groups
            .values()
            .filter(|m| m.spec.mode == ConsumerGroupMode::Kafka)
            .map(|m| m.spec.clone())
            .collect()
    }
}
