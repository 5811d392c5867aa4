//! Data operations on the partitions this server hosts: produce, the start
//! position of a subscription, fetch data ranges, commit and list consumer
//! offsets, scrub. Typed functions over domain values; blocking file work
//! runs on the blocking pool, never on an async worker's read loop.
//!
//! Streaming the metadata of a subscription to a reader is the front end's
//! job (the native push is in `native/stream.rs`); it parks in the
//! partition's `Waiters` as a [`crate::sink::BatchSink`].

use std::sync::Arc;

use bytes::Bytes;
use strom_proto::message::DataItem;
use strom_proto::{ErrorCode, StartPos};
use strom_storage::VerifyReport;

use super::validate::{CheckError, Validation};
use crate::batch::ValidBatch;
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::host::Host;
use crate::partition::{AppendReply, PartitionManager};
use crate::quota::{QuotaKey, Quotas};

/// Batches with more data than this are appended under `block_in_place`.
const BLOCKING_APPEND: u64 = 256 << 10;

/// Bytes a response frame needs besides its bulk payload.
const FRAME_OVERHEAD: u64 = 64;

pub struct DataService {
    host: Arc<Host>,
    max_frame_bytes: u32,
    max_prefetch_events: u32,
    /// Topics' validators, checked on every produced batch (`validate.rs`).
    validation: Validation,
    /// The quota table: storage quotas refuse appends here.
    quotas: Arc<Quotas>,
}

fn internal(e: impl std::fmt::Display) -> ServerError {
    ServerError::coded(ErrorCode::INTERNAL, e.to_string())
}

/// The reply of an append `p` admits now; a refusal is answered at once.
fn admit(p: &PartitionManager, acks_all: bool, done: AppendReply) -> Option<AppendReply> {
    match p.admit(acks_all, done) {
        Ok(done) => Some(done),
        Err((done, e)) => {
            done(Err(e));
            None
        }
    }
}

/// Runs blocking file work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServerError> + Send + 'static,
) -> Result<T, ServerError> {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

impl DataService {
    pub fn new(host: Arc<Host>, config: &ServerConfig, quotas: Arc<Quotas>) -> Self {
        DataService {
            host,
            max_frame_bytes: config.max_frame_bytes,
            max_prefetch_events: config.max_prefetch_events,
            validation: Validation::default(),
            quotas,
        }
    }

    /// The partitions this server hosts.
    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// A hosted partition, or why it cannot be served.
    pub fn partition(&self, topic: &str, id: u32) -> Result<Arc<PartitionManager>, ServerError> {
        self.host.get(topic, id)
    }

    /// Whether appending `batch` to `p` means a long file write, better run
    /// off the async workers. Memory partitions keep the batch's buffers as
    /// they are (a full `block` partition holds the batch rather than
    /// wait), so their appends are always short.
    fn is_large(p: &PartitionManager, batch: &ValidBatch) -> bool {
        p.partition_type() == "file" && batch.size() > BLOCKING_APPEND
    }

    /// Produces a checked batch into `p`, for every front end: the topic's
    /// validator first (every batch, whichever client sent it: a refusal is
    /// returned and `done` never runs), then admission
    /// (a replicated partition takes appends only on its leader, and
    /// `acks_all` ones only with enough copies in sync, answered once every
    /// in-sync copy has them), then the append; `done` runs once the batch
    /// is stored as the partition and `acks_all` promise, or refused. Calls
    /// order the offsets. A large batch to a file partition is written
    /// with the runtime told to move other work off this worker meanwhile.
    pub fn produce(
        &self,
        p: &PartitionManager,
        batch: ValidBatch,
        acks_all: bool,
        done: AppendReply,
    ) -> Result<(), CheckError> {
        self.validate(p, &batch)?;
        let Some(done) = admit(p, acks_all, done) else {
            return Ok(());
        };
        if Self::is_large(p, &batch) {
            tokio::task::block_in_place(|| p.append(batch, done));
        } else {
            p.append(batch, done);
        }
        Ok(())
    }

    /// [`DataService::produce`], but a large batch to a file partition is
    /// written on the blocking pool and its handle returned, so that the
    /// caller can read its next request meanwhile. The caller must await
    /// the handle before it produces anything else, so that its batches
    /// keep their order.
    pub fn produce_pipelined(
        &self,
        p: Arc<PartitionManager>,
        batch: ValidBatch,
        acks_all: bool,
        done: AppendReply,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, CheckError> {
        self.validate(&p, &batch)?;
        let Some(done) = admit(&p, acks_all, done) else {
            return Ok(None);
        };
        if Self::is_large(&p, &batch) {
            return Ok(Some(tokio::task::spawn_blocking(move || {
                p.append(batch, done)
            })));
        }
        p.append(batch, done);
        Ok(None)
    }

    /// Checks `batch` against the validator of `p`'s topic, then the
    /// topic's storage quota.
    fn validate(&self, p: &PartitionManager, batch: &ValidBatch) -> Result<(), CheckError> {
        if let Some(spec) = self.host.spec(&p.topic) {
            self.validation.check(&spec, batch)?;
        }
        Ok(self.check_stored(&p.topic)?)
    }

    /// `QUOTA_EXCEEDED` if `topic`'s stored-bytes quota is used up on this
    /// member: the bytes of the topic (or of every topic of the prefix)
    /// in this member's logs reached it.
    pub fn check_stored(&self, topic: &str) -> Result<(), ServerError> {
        let Some(q) = self.quotas.stored_limit(topic) else {
            return Ok(());
        };
        let stored = self.stored_bytes(&q.key);
        if stored < q.limit {
            return Ok(());
        }
        tracing::info!(topic = %topic, quota = %q.key, stored, limit = q.limit, "append refused: storage quota used up");
        Err(ServerError::coded(
            ErrorCode::QUOTA_EXCEEDED,
            format!("topic '{topic}' may not grow: {} stores {stored} bytes on this member, at or above its quota of {} bytes; delete or expire data (retention_bytes, retention_ms) or raise the quota (strom quota set)", q.key, q.limit),
        ))
    }

    /// Bytes the logs of this member hold for a topic key's topics.
    fn stored_bytes(&self, key: &QuotaKey) -> u64 {
        let parts = match key {
            QuotaKey::Topic(t) => self.host.partitions_of(t),
            QuotaKey::TopicPrefix(prefix) => {
                let mut all = self.host.all();
                all.retain(|p| p.topic.starts_with(prefix.as_str()));
                all
            }
            QuotaKey::User(_) => Vec::new(),
        };
        parts.iter().map(|p| p.log_stats().bytes).sum()
    }

    /// Where a subscription of `consumer` starting at `start` begins. Not
    /// raised to the log's first offset: a reader asking for dropped events
    /// sees the first batch start past its position, an explicit gap.
    pub fn subscribe_at(&self, p: &PartitionManager, consumer: &str, start: StartPos) -> u64 {
        let first = p.first_offset();
        let next = p.next_offset();
        let pos = match start {
            StartPos::Committed => p.committed(consumer).unwrap_or(first),
            StartPos::Beginning => first,
            StartPos::End => next,
            StartPos::Offset(o) => o,
            StartPos::Timestamp(t) => p.offset_for_timestamp(t),
        }
        .min(next);
        p.consumer_at(consumer, pos);
        pos
    }

    /// The prefetch a subscription gets: what it asked for, within the
    /// server's `max_prefetch_events`.
    pub fn prefetch(&self, requested: u32) -> u32 {
        requested.clamp(1, self.max_prefetch_events)
    }

    /// Total bytes a fetch asks for, or `FRAME_TOO_LARGE` if they cannot
    /// fit one response. Checked before anything is read.
    pub fn fetch_size(&self, items: &[DataItem]) -> Result<u64, ServerError> {
        let wanted = items
            .iter()
            .flat_map(|(_, ranges)| ranges.iter())
            .fold(0u64, |acc, (_, len)| acc.saturating_add(*len));
        self.fits_frame(wanted)?;
        Ok(wanted)
    }

    fn fits_frame(&self, bytes: u64) -> Result<(), ServerError> {
        let max = self.max_frame_bytes;
        if bytes.saturating_add(FRAME_OVERHEAD) > u64::from(max) {
            return Err(ServerError::coded(
                ErrorCode::FRAME_TOO_LARGE,
                format!("{bytes} bytes requested in one fetch exceed the maximum frame of {max} bytes; fetch fewer ranges at a time"),
            ));
        }
        Ok(())
    }

    /// Reads the requested data ranges of `p`, in order.
    pub async fn fetch(
        &self,
        p: Arc<PartitionManager>,
        items: Vec<DataItem>,
    ) -> Result<Vec<Bytes>, ServerError> {
        self.fetch_size(&items)?;
        let p_stats = p.stats.clone();
        let out = blocking(move || {
            let mut out = Vec::new();
            for (base, ranges) in &items {
                p.read_data(*base, ranges, &mut out)?;
            }
            Ok(out)
        })
        .await?;
        let bytes = out.iter().map(|b| b.len() as u64).sum();
        self.fits_frame(bytes)?;
        p_stats.fetched(bytes);
        Ok(out)
    }

    /// Durably records that `consumer` has processed `p` below `offset`.
    pub async fn commit(
        &self,
        p: Arc<PartitionManager>,
        consumer: String,
        offset: u64,
    ) -> Result<(), ServerError> {
        blocking(move || {
            crate::fence::refuse_plain(&p, &consumer)?;
            p.commit_offset(&consumer, offset)?;
            // Acked events free room in a full `block` partition.
            p.consumer_at(&consumer, offset);
            Ok(())
        })
        .await
    }

    /// Every consumer's committed offset on `p`.
    pub fn offsets(&self, p: &PartitionManager) -> Vec<(String, u64)> {
        let mut all = p.committed_all();
        all.retain(|(name, _)| !crate::fence::is_reserved(name));
        all
    }

    /// Reads all of `p` and checks every checksum (quarantining damage).
    pub async fn scrub(&self, p: Arc<PartitionManager>) -> Result<VerifyReport, ServerError> {
        blocking(move || p.verify()).await
    }
}
