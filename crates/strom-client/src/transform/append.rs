//! Appending one batch under a fixed producer stamp to one partition, at
//! whichever member leads it now. A transform writes each output batch
//! this way: the stamp is the same on every attempt and on every rerun
//! of the same source batch, so the partition's sequence table answers a
//! batch it already holds with its first offsets instead of appending it
//! again (docs/transforms.md). Attempts that a leader change or a lost
//! connection explains are repeated, at the leader the registry names
//! then, for up to [`RETRY_FOR`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use strom_proto::{Compression, ErrorCode, ProducerStamp, Request, Response};

use crate::error::{unexpected, Error, Result};
use crate::topic::Topic;

/// How long a batch keeps being retried through failovers.
pub const RETRY_FOR: Duration = Duration::from_secs(60);
const PAUSE: Duration = Duration::from_millis(200);

/// One output batch: its metadata section (stamped) and data parts.
pub(crate) struct OutBatch {
    pub meta: Bytes,
    pub count: u32,
    pub data: Vec<Bytes>,
}

/// What an idempotent producer resends on, and a registry without a
/// master for a moment (the leader lookup goes through it).
fn worth_retrying(e: &Error) -> bool {
    crate::producer::retry::worth_resending(e) || e.code() == ErrorCode::NOT_MASTER
}

/// The stamp of a transform's output batch: `producer` is fixed per
/// (transform, source partition), the sequence is the low 32 bits of the
/// offset of the source event the batch starts at, and every batch is a
/// *restart* (the sequences are not consecutive).
pub(crate) fn stamp(producer: u64, first_source_offset: u64) -> ProducerStamp {
    ProducerStamp {
        producer,
        sequence: first_source_offset as u32,
        restart: true,
    }
}

/// Appends `batch` to `partition` of `topic` with `acks=all`; returns its
/// base offset (the first append's, for a batch the partition held).
pub(crate) async fn append(
    topic: &Topic,
    partition: u32,
    compression: Compression,
    mut batch: OutBatch,
) -> Result<u64> {
    if !compression.is_none() {
        crate::compress::pack(compression, &mut batch.meta, &mut batch.data).await?;
    }
    let req = Request::Produce {
        topic: topic.name().to_string(),
        partition,
        count: batch.count,
        acks_all: true,
        meta: batch.meta,
    };
    let started = Instant::now();
    let mut addr = leader_of(topic, partition, false).await?;
    loop {
        let attempt = async {
            let conn = topic.driver.conn(&addr).await?;
            conn.call(&req, batch.data.clone()).await
        };
        let e = match attempt.await {
            Ok(Response::Produced {
                base_offset, count, ..
            }) => {
                if count != batch.count {
                    // Only a batch the partition already held is answered
                    // with another count: a rerun whose transform gave
                    // another output than the first time. The first stays.
                    tracing::warn!(topic = %topic.name(), partition, count, now = batch.count, "a rerun's output differs from what was written the first time (the transform is not deterministic); the first output is kept");
                }
                return Ok(base_offset);
            }
            Ok(other) => return Err(unexpected(other)),
            Err(e) => e,
        };
        if !worth_retrying(&e) || started.elapsed() > RETRY_FOR {
            return Err(e);
        }
        tracing::debug!(topic = %topic.name(), partition, error = %e, "transform output batch will be sent again");
        tokio::time::sleep(PAUSE).await;
        if let Ok(a) = leader_of(topic, partition, true).await {
            addr = a;
        }
    }
}

/// The address of the member leading `partition` (asked of the registry
/// when `fresh`, else as last described).
async fn leader_of(topic: &Topic, partition: u32, fresh: bool) -> Result<String> {
    let info = match fresh {
        true => topic.refresh().await?,
        false => topic.info(),
    };
    info.partitions
        .get(partition as usize)
        .map(|p| p.addr.clone())
        .ok_or_else(|| {
            Error::coded(
                ErrorCode::PARTITION_NOT_FOUND,
                format!("topic '{}' has no partition {partition}", topic.name()),
            )
        })
}
