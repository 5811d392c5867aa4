//! A topic handle: its description (partitions and where they live), its
//! policies, and the calls that end its stream. The factories for its
//! producers and consumers are beside those types (`producer/mod.rs`,
//! `consumer/mod.rs`).

use std::sync::Arc;
use std::time::Duration;

/// How often producers and consumers look for added partitions.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

use parking_lot::RwLock;
use strom_policy::TopicPolicy;
use strom_proto::{Request, TopicInfo};

use crate::driver::Driver;
use crate::error::Result;
use strom_proto::TopicSpec;

#[derive(Clone)]
pub struct Topic {
    pub(crate) driver: Driver,
    pub(crate) name: Arc<str>,
    info: Arc<RwLock<TopicInfo>>,
}

impl Topic {
    pub(crate) fn new(driver: Driver, info: TopicInfo) -> Result<Topic> {
        Ok(Topic {
            driver,
            name: info.spec.name.as_str().into(),
            info: Arc::new(RwLock::new(info)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description as last fetched.
    pub fn info(&self) -> TopicInfo {
        self.info.read().clone()
    }

    /// Fetches a fresh description (offsets, stream state) from the server.
    pub fn describe(&self) -> Result<TopicInfo> {
        let info = self.driver.describe(&self.name)?;
        *self.info.write() = info.clone();
        Ok(info)
    }

    /// Fetches the description from the registry master (async, for the
    /// background tasks that follow partition additions).
    pub(crate) async fn refresh(&self) -> Result<TopicInfo> {
        let req = Request::DescribeTopic {
            name: self.name.to_string(),
            offsets: false,
        };
        match self.driver.master_call(req).await? {
            strom_proto::Response::Topic(info) => {
                *self.info.write() = info.clone();
                Ok(info)
            }
            other => Err(crate::error::unexpected(other)),
        }
    }

    pub fn partitions(&self) -> u32 {
        self.info.read().partitions.len() as u32
    }

    /// The topic's validator, selector and serializer, as every client builds them.
    pub fn policy(&self) -> Result<TopicPolicy> {
        let s = &self.info.read().spec;
        Ok(TopicPolicy::new(
            &s.validator,
            s.schema.as_deref(),
            &s.selector,
            &s.serializer,
        )?)
    }

    /// Refreshes partition placement (blocking) before a producer or
    /// consumer is built on it.
    pub(crate) fn refresh_blocking(&self) -> Result<TopicInfo> {
        let t = self.clone();
        self.driver.block_on(async move { t.refresh().await })
    }

    /// Closes producer `id`'s part of the stream on its behalf, for a
    /// producer that died without closing (its id is [`Producer::id`]).
    pub fn close_producer(&self, id: u64) -> Result<()> {
        let d = self.driver.clone();
        let req = Request::CloseProducer {
            topic: self.name.to_string(),
            producer: id,
        };
        self.driver
            .block_on(async move { d.master_call(req).await })
            .map(|_| ())
    }

    /// Ends the stream explicitly: consumers get end-of-stream after every
    /// event written before this call, and producing fails from now on.
    pub fn complete(&self) -> Result<()> {
        let d = self.driver.clone();
        let name = self.name.to_string();
        self.driver
            .block_on(async move { d.master_call(Request::CompleteTopic { name }).await })
            .map(|_| ())
    }
}

/// The member owning a partition and its address; follows restarts.
pub(crate) struct Owner {
    pub member: u32,
    pub addr: String,
}

impl Driver {
    /// Creates a topic; its partitions are spread over the group's live members.
    pub fn create_topic(&self, spec: TopicSpec) -> Result<Topic> {
        self.create_topic_on(spec, None)
    }

    /// Creates a topic with every partition on one member (`Some(id)`), or
    /// spread round-robin (`None`).
    pub fn create_topic_on(&self, spec: TopicSpec, member: Option<u32>) -> Result<Topic> {
        Topic::new(
            self.clone(),
            self.inner.backend.create_topic(self, spec, member)?,
        )
    }

    pub fn open_topic(&self, name: &str) -> Result<Topic> {
        Topic::new(self.clone(), self.describe(name)?)
    }
}
