//! The Kafka backend: the client's `Driver`, `Topic`, `Producer` and
//! `Consumer` API on a Kafka cluster, through librdkafka (the `rdkafka`
//! crate, librdkafka compiled from source). A driver connected with
//! `kafka://host:port` holds a [`KafkaDriver`]; topics, producers and
//! consumers made from it route here, while the native path stays as it
//! is. Events map to records as Strom's own Kafka front end maps them
//! (docs/kafka.md, "Client adapter"), so both agree. This module must
//! never depend on the server crates.

mod consumer;
mod mapping;
mod producer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::MetadataTopic;
use strom_proto::{ErrorCode, PartitionInfo, TopicInfo, TopicSpec};
use tokio::runtime::Handle;

use crate::error::{Error, Result};

use crate::backend::{Backend, ConsumerBackend, ProducerBackend};
use crate::consumer_options::ConsumerOptions;
use crate::driver::Driver;
use crate::membership::Membership;
use crate::push::ProducerOptions;
use crate::topic::Topic;
use producer::KafkaProducer;

/// Longest wait for the cluster's answer to an administrative request.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The backend's name in [`Error::Unsupported`].
const BACKEND: &str = "kafka";

/// What the Kafka backend cannot do, as a typed error.
pub(crate) fn unsupported(what: impl Into<String>) -> Error {
    Error::Unsupported {
        backend: BACKEND,
        what: what.into(),
    }
}

/// A librdkafka error as a Strom error: the closest [`ErrorCode`], with
/// librdkafka's (or the broker's) message after `context`.
pub(crate) fn kafka_error(context: impl std::fmt::Display, e: &KafkaError) -> Error {
    let code = e.rdkafka_error_code().map_or(ErrorCode::INTERNAL, code_of);
    Error::coded(code, format!("{context}: {e}"))
}

/// The Strom code closest to a Kafka error code.
pub(crate) fn code_of(c: RDKafkaErrorCode) -> ErrorCode {
    use RDKafkaErrorCode as K;
    match c {
        K::UnknownTopicOrPartition | K::UnknownTopic => ErrorCode::TOPIC_NOT_FOUND,
        K::UnknownPartition | K::InvalidPartitions => ErrorCode::PARTITION_NOT_FOUND,
        K::TopicAlreadyExists => ErrorCode::TOPIC_EXISTS,
        K::MessageSizeTooLarge | K::MessageBatchTooLarge => ErrorCode::BATCH_TOO_LARGE,
        // Strom's front end answers an append to an ended topic so.
        K::PolicyViolation => ErrorCode::TOPIC_CLOSED,
        K::OffsetOutOfRange => ErrorCode::OFFSET_OUT_OF_RANGE,
        K::MessageTimedOut | K::RequestTimedOut | K::OperationTimedOut => ErrorCode::TIMEOUT,
        K::AllBrokersDown
        | K::BrokerTransportFailure
        | K::BrokerNotAvailable
        | K::NetworkException
        | K::Resolve => ErrorCode::CONNECTION_FAILED,
        K::InvalidArgument | K::InvalidConfig | K::InvalidTopic | K::InvalidReplicationFactor => {
            ErrorCode::INVALID_ARGUMENT
        }
        K::InvalidRecord | K::InvalidMessage => ErrorCode::CORRUPT,
        _ => ErrorCode::INTERNAL,
    }
}

/// A connection to a Kafka cluster: administration (create, describe,
/// list, delete topics) and the settings every client of it shares.
pub(crate) struct KafkaDriver {
    bootstrap: String,
    handle: Handle,
    admin: Arc<AdminClient<DefaultClientContext>>,
    /// Metadata and watermarks.
    meta: BaseConsumer,
    /// The specs of topics created through this driver: their policies
    /// (partition selector, serializer) apply to their producers. Topics
    /// opened otherwise carry none, so `TopicSpec::new`'s apply.
    specs: Mutex<HashMap<String, TopicSpec>>,
}

impl KafkaDriver {
    /// Connects to the cluster behind `bootstrap` and checks that it
    /// answers (a metadata request).
    pub fn connect(bootstrap: &str, handle: Handle) -> Result<KafkaDriver> {
        if bootstrap.is_empty() {
            return Err(Error::InvalidArgument(
                "kafka:// needs a bootstrap address, e.g. kafka://127.0.0.1:9092".into(),
            ));
        }
        let base = base_config(bootstrap);
        let admin: AdminClient<DefaultClientContext> = base.create().map_err(|e| {
            kafka_error(
                format!("cannot create a Kafka admin client for {bootstrap}"),
                &e,
            )
        })?;
        let meta: BaseConsumer = base.create().map_err(|e| {
            kafka_error(format!("cannot create a Kafka client for {bootstrap}"), &e)
        })?;
        meta.fetch_metadata(None, ADMIN_TIMEOUT).map_err(|e| {
            let e = kafka_error(format!("cannot reach the Kafka cluster at {bootstrap}"), &e);
            Error::coded(ErrorCode::CONNECTION_FAILED, e.message())
        })?;
        tracing::info!(bootstrap, "connected to a Kafka cluster");
        Ok(KafkaDriver {
            bootstrap: bootstrap.to_string(),
            handle,
            admin: Arc::new(admin),
            meta,
            specs: Mutex::new(HashMap::new()),
        })
    }

    /// The settings every client of this cluster starts from.
    pub fn config(&self) -> ClientConfig {
        base_config(&self.bootstrap)
    }

    /// Creates a topic of `spec.partitions` partitions (replication factor
    /// 1). Other parts of the spec (partition type, durability, retention)
    /// have no Kafka counterpart here and are not sent; its policies are
    /// kept for this driver's producers.
    pub fn create_topic(&self, spec: TopicSpec, member: Option<u32>) -> Result<TopicInfo> {
        if member.is_some() {
            return Err(unsupported(
                "placing a topic's partitions on one member (Kafka places them)",
            ));
        }
        let partitions = i32::try_from(spec.partitions).map_err(|_| {
            Error::InvalidArgument(format!("{} partitions are too many", spec.partitions))
        })?;
        let (admin, name) = (self.admin.clone(), spec.name.clone());
        let results = crate::driver::wait(&self.handle, async move {
            let topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
            let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
            admin.create_topics([&topic], &opts).await
        })?
        .map_err(|e| kafka_error(format!("cannot create topic '{}'", spec.name), &e))?;
        for r in results {
            if let Err((name, code)) = r {
                return Err(Error::coded(
                    code_of(code),
                    format!("cannot create topic '{name}': {code}"),
                ));
            }
        }
        self.specs.lock().insert(spec.name.clone(), spec.clone());
        self.describe(&spec.name)
    }

    /// The topic's partitions with their first and next offsets.
    pub fn describe(&self, name: &str) -> Result<TopicInfo> {
        let md = self
            .meta
            .fetch_metadata(Some(name), ADMIN_TIMEOUT)
            .map_err(|e| kafka_error(format!("cannot describe topic '{name}'"), &e))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                Error::coded(ErrorCode::TOPIC_NOT_FOUND, format!("no topic '{name}'"))
            })?;
        let mut info = self.topic_info(t)?;
        for p in &mut info.partitions {
            let (low, high) = self
                .meta
                .fetch_watermarks(name, p.id as i32, ADMIN_TIMEOUT)
                .map_err(|e| {
                    kafka_error(format!("cannot read the offsets of '{name}'/{}", p.id), &e)
                })?;
            p.first_offset = low.max(0) as u64;
            p.next_offset = high.max(0) as u64;
        }
        Ok(info)
    }

    /// Every topic of the cluster (offsets are not read: zero).
    pub fn list_topics(&self) -> Result<Vec<TopicInfo>> {
        let md = self
            .meta
            .fetch_metadata(None, ADMIN_TIMEOUT)
            .map_err(|e| kafka_error("cannot list topics", &e))?;
        md.topics().iter().map(|t| self.topic_info(t)).collect()
    }

    pub fn delete_topic(&self, name: &str) -> Result<()> {
        let (admin, owned) = (self.admin.clone(), name.to_string());
        let results = crate::driver::wait(&self.handle, async move {
            let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
            admin.delete_topics(&[owned.as_str()], &opts).await
        })?
        .map_err(|e| kafka_error(format!("cannot delete topic '{name}'"), &e))?;
        for r in results {
            if let Err((name, code)) = r {
                return Err(Error::coded(
                    code_of(code),
                    format!("cannot delete topic '{name}': {code}"),
                ));
            }
        }
        self.specs.lock().remove(name);
        Ok(())
    }

    /// A topic's description from its metadata (a topic-level error, such
    /// as an unknown topic, is an error).
    fn topic_info(&self, t: &MetadataTopic) -> Result<TopicInfo> {
        if let Some(e) = t.error() {
            let code = RDKafkaErrorCode::from(e);
            return Err(Error::coded(
                code_of(code),
                format!("topic '{}': {code}", t.name()),
            ));
        }
        let spec = self
            .specs
            .lock()
            .get(t.name())
            .cloned()
            .map(|s| TopicSpec {
                partitions: t.partitions().len() as u32,
                ..s
            })
            .unwrap_or_else(|| TopicSpec::new(t.name(), t.partitions().len() as u32));
        let mut partitions: Vec<PartitionInfo> = t
            .partitions()
            .iter()
            .map(|p| PartitionInfo {
                id: p.id().max(0) as u32,
                member: p.leader().max(0) as u32,
                addr: self.bootstrap.clone(),
                first_offset: 0,
                next_offset: 0,
                status: Default::default(),
                dropped_events: 0,
                replicas: p.replicas().iter().map(|r| (*r).max(0) as u32).collect(),
                isr: p.isr().iter().map(|r| (*r).max(0) as u32).collect(),
                epoch: 0,
                moving_to: Vec::new(),
            })
            .collect();
        partitions.sort_by_key(|p| p.id);
        Ok(TopicInfo {
            spec,
            partitions,
            state: Default::default(),
        })
    }
}

impl Backend for KafkaDriver {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn is_native(&self) -> bool {
        false
    }

    fn create_topic(&self, _: &Driver, spec: TopicSpec, member: Option<u32>) -> Result<TopicInfo> {
        KafkaDriver::create_topic(self, spec, member)
    }

    fn describe(&self, _: &Driver, name: &str) -> Result<TopicInfo> {
        KafkaDriver::describe(self, name)
    }

    fn list_topics(&self, _: &Driver) -> Result<Vec<TopicInfo>> {
        KafkaDriver::list_topics(self)
    }

    fn delete_topic(&self, _: &Driver, name: &str) -> Result<()> {
        KafkaDriver::delete_topic(self, name)
    }

    fn producer(&self, topic: Topic, opts: ProducerOptions) -> Result<Box<dyn ProducerBackend>> {
        Ok(Box::new(KafkaProducer::new(self, topic, opts)?))
    }

    /// A Kafka consumer reads as its name's Kafka group; Strom consumer
    /// groups (`group`) are refused earlier, at their registration with
    /// the registry master, which a Kafka driver has not.
    fn consumer(
        &self,
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        _group: Option<Arc<Membership>>,
    ) -> Result<Box<dyn ConsumerBackend>> {
        consumer::consumer(self, topic, name, opts)
    }
}

fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", "strom-client");
    c
}
