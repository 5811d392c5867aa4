//! The native backend: a driver's topics, producers and consumers on Strom
//! servers, over the Strom protocol. Administration goes to the registry
//! master (`Driver::leader_call*`, `leader.rs`); producers and consumers
//! are `producer/native.rs` and `consumer/queue.rs` over the partition
//! subscriptions of `subscription.rs`.

use std::sync::Arc;

use strom_proto::{ErrorCode, Request, Response, TopicInfo, TopicSpec};

use crate::backend::{Backend, ConsumerBackend, ProducerBackend};
use crate::consumer::queue::QueueConsumer;
use crate::consumer_options::ConsumerOptions;
use crate::driver::Driver;
use crate::error::{unexpected, Result};
use crate::membership::Membership;
use crate::producer::NativeProducer;
use crate::push::ProducerOptions;
use crate::topic::Topic;

/// Strom servers: the backend of every driver not connected to Kafka.
pub(crate) struct Native;

impl Backend for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    fn is_native(&self) -> bool {
        true
    }

    fn create_topic(&self, d: &Driver, spec: TopicSpec, member: Option<u32>) -> Result<TopicInfo> {
        let req = Request::CreateTopic {
            spec: spec.clone(),
            member,
        };
        let d2 = d.clone();
        let (answer, resent) = d.block_on(async move { Ok(d2.leader_call_resent(&req).await) })?;
        match answer {
            Ok(Response::Topic(info)) => Ok(info),
            Ok(other) => Err(unexpected(other)),
            // Sent again after the master died before answering: the
            // first attempt may have created it.
            Err(e) if resent && e.code() == ErrorCode::TOPIC_EXISTS => {
                match self.describe(d, &spec.name) {
                    Ok(info) if info.spec == spec => Ok(info),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    fn describe(&self, d: &Driver, name: &str) -> Result<TopicInfo> {
        match d.admin(Request::DescribeTopic {
            name: name.into(),
            offsets: true,
        })? {
            Response::Topic(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    fn list_topics(&self, d: &Driver) -> Result<Vec<TopicInfo>> {
        match d.admin(Request::ListTopics)? {
            Response::Topics(t) => Ok(t),
            other => Err(unexpected(other)),
        }
    }

    fn delete_topic(&self, d: &Driver, name: &str) -> Result<()> {
        d.admin(Request::DeleteTopic { name: name.into() })
            .map(|_| ())
    }

    fn producer(&self, topic: Topic, opts: ProducerOptions) -> Result<Box<dyn ProducerBackend>> {
        Ok(Box::new(NativeProducer::new(topic, opts)?))
    }

    fn consumer(
        &self,
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        group: Option<Arc<Membership>>,
    ) -> Result<Box<dyn ConsumerBackend>> {
        Ok(Box::new(QueueConsumer::native(topic, name, opts, group)?))
    }
}
