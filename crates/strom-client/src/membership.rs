//! One consumer's membership of a consumer group: join at the registry
//! master, heartbeats from the driver's runtime so a busy application
//! keeps its place, rejoin after its session expired, leave when dropped.
//! The options and the factory that joins are `group.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, Request, Response};

use crate::error::{unexpected, Error, Result};
use crate::topic::Topic;

/// Told when a partitioned group's member gains or loses partitions. Both
/// run on the thread that pulls, inside `pull`, `pull_many` or the
/// iterator (with the consumer's queue locked: do not pull from them):
/// `on_assigned` before any event of those partitions is returned,
/// `on_revoked` at the first pull after the partitions were given up
/// (their queued events dropped, their last commit settled).
pub trait RebalanceListener: Send + Sync {
    fn on_revoked(&self, _partitions: &[u32]) {}
    fn on_assigned(&self, _partitions: &[u32]) {}
}

/// One consumer's membership of a consumer group.
pub(crate) struct Membership {
    pub spec: ConsumerGroupSpec,
    consumer: AtomicU64,
    label: String,
    pub topic: Topic,
    pub listener: Option<Arc<dyn RebalanceListener>>,
    /// Set once the consumer left: never rejoin after that.
    left: AtomicBool,
}

impl Membership {
    pub fn is_shared(&self) -> bool {
        self.spec.mode == ConsumerGroupMode::Shared
    }

    pub fn consumer(&self) -> u64 {
        self.consumer.load(Ordering::Acquire)
    }

    /// Joins at the master; the stored spec comes back and wins.
    pub(crate) async fn join(
        topic: &Topic,
        spec: ConsumerGroupSpec,
        label: String,
        listener: Option<Arc<dyn RebalanceListener>>,
    ) -> Result<Membership> {
        if topic.driver.master_version().await? < 2 {
            return Err(Error::coded(
                ErrorCode::UNSUPPORTED_VERSION,
                "consumer groups need protocol version 2; upgrade the server",
            ));
        }
        let (consumer, spec) = join_call(topic, spec, None, &label).await?;
        Ok(Membership {
            spec,
            consumer: AtomicU64::new(consumer),
            label,
            topic: topic.clone(),
            listener,
            left: AtomicBool::new(false),
        })
    }

    pub fn has_left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    /// Joins again under a new id (a partitioned member that lost its
    /// partitions); returns the new id.
    pub async fn rejoin_fresh(&self) -> Result<u64> {
        let (c, _) = join_call(&self.topic, self.spec.clone(), None, &self.label).await?;
        self.consumer.store(c, Ordering::Release);
        tracing::info!(group = %self.spec.name, consumer = c, "joined the consumer group again");
        Ok(c)
    }

    /// Heartbeats every third of the session; rejoins under the same id if
    /// the master forgot it (its session expired or the master restarted).
    pub(crate) async fn heartbeats(weak: Weak<Membership>) {
        loop {
            let every = match weak.upgrade() {
                Some(m) => Duration::from_millis(u64::from(m.spec.session_ms / 3).max(100)),
                None => return,
            };
            tokio::time::sleep(every).await;
            let Some(m) = weak.upgrade() else { return };
            let req = Request::ConsumerHeartbeat {
                group: m.spec.name.clone(),
                consumer: m.consumer(),
                owned: Vec::new(),
                done: Vec::new(),
            };
            match m.topic.driver.master_call(req).await {
                Ok(_) => {}
                Err(e) if e.code() == ErrorCode::UNKNOWN_CONSUMER => {
                    let id = m.consumer();
                    match join_call(&m.topic, m.spec.clone(), Some(id), &m.label).await {
                        Ok((c, _)) => {
                            m.consumer.store(c, Ordering::Release);
                            tracing::info!(group = %m.spec.name, consumer = c, "rejoined the consumer group");
                        }
                        Err(e) => {
                            tracing::warn!(group = %m.spec.name, error = %e, "could not rejoin the consumer group")
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(group = %m.spec.name, error = %e, "consumer heartbeat failed")
                }
            }
        }
    }

    /// Leaves the group without waiting (best effort: the session would
    /// expire anyway).
    pub fn leave(&self) {
        self.left.store(true, Ordering::Release);
        self.topic
            .driver
            .master_oneway(&Request::LeaveConsumerGroup {
                group: self.spec.name.clone(),
                consumer: self.consumer(),
            });
    }
}

async fn join_call(
    topic: &Topic,
    spec: ConsumerGroupSpec,
    rejoin: Option<u64>,
    label: &str,
) -> Result<(u64, ConsumerGroupSpec)> {
    let req = Request::JoinConsumerGroup {
        stream: 0,
        spec,
        consumer: rejoin,
        label: label.to_string(),
    };
    match topic.driver.master_call(req).await? {
        Response::ConsumerJoined { consumer, spec, .. } => Ok((consumer, spec)),
        other => Err(unexpected(other)),
    }
}
