//! Consumer groups on the client: the options, and the membership of one
//! consumer (join at the registry master, heartbeats from the driver's
//! runtime so a busy application keeps its place, rejoin after its session
//! expired, leave when dropped).
//!
//! A *partitioned* group's member starts with no partitions and follows the
//! assignment its heartbeats bring back (`partitioned.rs`).
//!
//! A *shared* group's member subscribes to every partition with
//! `GroupSubscribe`; the owners push it events no other member holds, and
//! it acks them one by one (`share.rs`). Everything else (pull, pull_many,
//! iteration, process, selectors, brokers, end of stream) is the ordinary
//! [`Consumer`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use strom_proto::{ConsumerGroupInfo, ConsumerGroupSpec, ErrorCode, Request, Response, StartPos};

pub use strom_proto::ConsumerGroupMode;

use crate::consumer::{Consumer, ConsumerOptions};
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

/// How a consumer joins a consumer group.
#[derive(Clone)]
pub struct GroupOptions {
    pub mode: ConsumerGroupMode,
    /// Shown in `strom group describe`; default `host:pid`.
    pub label: Option<String>,
    /// Where a *new* group begins: `Beginning` (default), `End` or a
    /// `Timestamp`.
    pub start: StartPos,
    /// A member not heard from this long leaves the group.
    pub session_timeout: Duration,
    /// Shared: an event not acked this long after it was delivered goes to
    /// another member.
    pub visibility_timeout: Duration,
    /// Shared: deliveries before an event goes to the dead-letter topic;
    /// `None` retries for ever.
    pub max_deliveries: Option<u32>,
    /// Shared: the dead-letter topic; default `<topic>.<group>.dlq`.
    pub dead_letter: Option<String>,
    /// Partitioned: told of partitions assigned and revoked.
    pub listener: Option<Arc<dyn RebalanceListener>>,
    /// Prefetch (default 64 events per partition), data budget, selector
    /// and broker. `partitions` must be `None`; `start` is ignored.
    pub consumer: ConsumerOptions,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            mode: ConsumerGroupMode::Partitioned,
            label: None,
            start: StartPos::Beginning,
            session_timeout: Duration::from_secs(10),
            visibility_timeout: Duration::from_secs(30),
            max_deliveries: None,
            dead_letter: None,
            listener: None,
            consumer: ConsumerOptions {
                prefetch: 64,
                ..ConsumerOptions::default()
            },
        }
    }
}

impl GroupOptions {
    /// Options for a shared group (a work queue).
    pub fn shared() -> Self {
        GroupOptions {
            mode: ConsumerGroupMode::Shared,
            ..Default::default()
        }
    }

    fn spec(&self, group: &str, topic: &str) -> Result<ConsumerGroupSpec> {
        let ms = |d: Duration, what: &str| {
            u32::try_from(d.as_millis())
                .map_err(|_| Error::InvalidArgument(format!("{what} of {d:?} is too long")))
        };
        if self.consumer.partitions.is_some() {
            return Err(Error::InvalidArgument(
                "a consumer group reads every partition; leave `partitions` unset".into(),
            ));
        }
        let mut spec = ConsumerGroupSpec::new(group, topic, self.mode);
        spec.start = self.start;
        spec.session_ms = ms(self.session_timeout, "session timeout")?;
        spec.visibility_ms = ms(self.visibility_timeout, "visibility timeout")?;
        spec.max_deliveries = self.max_deliveries.unwrap_or(0);
        spec.dead_letter = self.dead_letter.clone();
        Ok(spec)
    }
}

fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}:{}", std::process::id())
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
    async fn join(
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
    async fn heartbeats(weak: Weak<Membership>) {
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

impl Topic {
    /// A consumer that joins consumer group `group` of this topic (created
    /// on first use with `opts`; later members get the stored options).
    /// In a *partitioned* group the members split the partitions: this
    /// consumer reads those assigned to it (see [`Consumer::assignment`]),
    /// from the group's committed offsets, and acks cumulatively.
    /// In a *shared* group every member may receive any event, each event
    /// goes to one member at a time, and each is acked on its own.
    pub fn consumer_group(&self, group: &str, opts: GroupOptions) -> Result<Consumer> {
        let spec = opts.spec(group, self.name())?;
        let label = opts.label.clone().unwrap_or_else(default_label);
        let topic = self.clone();
        let listener = opts.listener.clone();
        let m = self
            .driver
            .block_on(async move { Membership::join(&topic, spec, label, listener).await })?;
        let m = Arc::new(m);
        // A partitioned member heartbeats from the task that follows its
        // assignment (started by the consumer).
        if m.is_shared() {
            self.driver
                .inner
                .handle
                .spawn(Membership::heartbeats(Arc::downgrade(&m)));
        }
        let copts = ConsumerOptions {
            start: StartPos::Committed,
            ..opts.consumer
        };
        Consumer::with_group(self.clone(), group, copts, Some(m))
    }
}

impl crate::driver::Driver {
    /// A consumer group: its spec, members and, per partition, the
    /// committed position, pending and redelivered events.
    pub fn describe_group(&self, group: &str) -> Result<ConsumerGroupInfo> {
        let req = Request::DescribeConsumerGroup {
            group: group.to_string(),
        };
        match self.admin(req)? {
            Response::ConsumerGroup(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    pub fn list_groups(&self) -> Result<Vec<ConsumerGroupInfo>> {
        match self.admin(Request::ListConsumerGroups)? {
            Response::ConsumerGroups(infos) => Ok(infos),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes a consumer group and its state on every partition.
    pub fn delete_group(&self, group: &str) -> Result<()> {
        let req = Request::DeleteConsumerGroup {
            group: group.to_string(),
        };
        match self.admin(req)? {
            Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
