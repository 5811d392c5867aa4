//! Consumer groups on the client: the options, the factory that joins one
//! (the membership itself is `membership.rs`), and the driver's calls
//! that describe, list and delete groups.
//!
//! A *partitioned* group's member starts with no partitions and follows the
//! assignment its heartbeats bring back (`partitioned.rs`).
//!
//! A *shared* group's member subscribes to every partition with
//! `GroupSubscribe`; the owners push it events no other member holds, and
//! it acks them one by one (`share.rs`). Everything else (pull, pull_many,
//! iteration, process, selectors, brokers, end of stream) is the ordinary
//! [`Consumer`].

use std::sync::Arc;
use std::time::Duration;

use strom_proto::{ConsumerGroupInfo, ConsumerGroupSpec, Request, Response, StartPos};

pub use strom_proto::ConsumerGroupMode;

use crate::consumer::{Consumer, ConsumerOptions};
use crate::error::{unexpected, Error, Result};
use crate::membership::Membership;
pub use crate::membership::RebalanceListener;
use crate::topic::Topic;

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
