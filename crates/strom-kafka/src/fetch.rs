//! `Fetch` with long polling, and `ListOffsets`.
//!
//! A fetch reads whole stored batches from each requested partition, up to
//! the visible offset (consumers see only what the topic's durability made
//! visible), within `partition_max_bytes`, the request's `max_bytes` and
//! the server's `max_frame_bytes` (at least one batch, as Kafka does). Each
//! stored batch becomes one Kafka record batch (v2, uncompressed) with the
//! same offsets (`encode.rs`). When fewer than `min_bytes` are ready, the fetch parks a
//! [`BatchSink`] in each partition's `Waiters`: the appender wakes it the
//! moment a batch becomes visible (or at seal or deletion), and it reads
//! again, until `max_wait_ms` has passed.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_proto::BatchView;
use strom_server::{Appended, BatchSink, PartitionManager, ServerError, StoredBatch};
use tokio::sync::Notify;

use crate::error::{kafka_code, kcode, FrameError};
use crate::guard;
use crate::mapping::event_record;
use crate::request::{decode, Ctx, Reply};
use crate::throttle;
use strom_server::quota::Limit;

/// Most metadata bytes read from a log per step.
const READ_META: usize = 1 << 20;
/// Room left in a response frame for everything but the records.
const RESPONSE_OVERHEAD: u64 = 64 << 10;
/// Longest long poll, whatever the client asks.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// A fetch waiting for the next visible batch of any of its partitions.
struct Waiter(Notify);

impl BatchSink for Waiter {
    fn offer(&self, _partition: u32, _a: &Appended, _meta: &Bytes) -> bool {
        true
    }
    fn wake(&self) {
        self.0.notify_one();
    }
}

/// What one partition of a fetch answered.
struct Part {
    error: i16,
    high_watermark: i64,
    log_start: i64,
    records: Bytes,
}

impl Part {
    fn error(code: i16) -> Self {
        Part {
            error: code,
            high_watermark: -1,
            log_start: -1,
            records: Bytes::new(),
        }
    }
}

fn storage_code(e: &ServerError) -> i16 {
    match e.code() {
        strom_proto::ErrorCode::OFFSET_OUT_OF_RANGE => kcode::OFFSET_OUT_OF_RANGE,
        _ => kcode::KAFKA_STORAGE_ERROR,
    }
}

/// Reads whole batches of `p` from `offset` up to its visible offset,
/// within `budget` bytes (at least one batch), as Kafka record batches.
/// Blocking file reads: run on the blocking pool.
fn read_part(p: &PartitionManager, offset: i64, budget: u64, unframe: Option<u64>) -> Part {
    let visible = *p.watch_visible().borrow();
    let first = p.first_offset();
    let mut part = Part {
        error: kcode::NONE,
        high_watermark: visible as i64,
        log_start: first as i64,
        records: Bytes::new(),
    };
    if offset < first as i64 || offset > visible as i64 {
        part.error = kcode::OFFSET_OUT_OF_RANGE;
        return part;
    }
    let mut pos = offset as u64;
    let mut out = BytesMut::new();
    let mut used = 0u64;
    'read: while pos < visible {
        let batches = match p.read_visible(pos, READ_META) {
            Ok(b) => b,
            Err(e) => {
                if out.is_empty() {
                    tracing::warn!(topic = %p.topic, partition = p.id, offset = pos, error = %e, "Kafka fetch: read failed");
                    part.error = storage_code(&e);
                }
                break;
            }
        };
        if batches.is_empty() {
            break;
        }
        for b in batches {
            if b.base_offset >= visible {
                break 'read;
            }
            let size = b.meta.len() as u64 + b.data_len;
            if used > 0 && used + size > budget {
                break 'read;
            }
            match encode_batch(p, &b, &mut out, unframe) {
                Ok(()) => {}
                Err(code) => {
                    if out.is_empty() {
                        part.error = code;
                    }
                    break 'read;
                }
            }
            // What was encoded (decoded values of a compressed topic are
            // larger than the stored frames).
            used = used.max(out.len() as u64);
            pos = b.base_offset + u64::from(b.count);
        }
    }
    part.records = out.freeze();
    part
}

/// Appends one stored batch to `out` as a Kafka record batch; with
/// `unframe`, each record's value is what its compression frame holds.
fn encode_batch(
    p: &PartitionManager,
    b: &StoredBatch,
    out: &mut BytesMut,
    unframe: Option<u64>,
) -> Result<(), i16> {
    let view = BatchView::parse(b.meta.clone()).map_err(|_| kcode::CORRUPT_MESSAGE)?;
    let whole = p.read_all_data(b).map_err(|e| {
        tracing::warn!(topic = %p.topic, partition = p.id, offset = b.base_offset, error = %e, "Kafka fetch: data read failed");
        kcode::KAFKA_STORAGE_ERROR
    })?;
    let ts_ms = (b.timestamp_us / 1000) as i64;
    let mut records = Vec::with_capacity(view.count() as usize);
    for e in view.iter() {
        let start = e.data_pos as usize;
        let end = start + e.data_len as usize;
        if end > whole.len() {
            return Err(kcode::CORRUPT_MESSAGE);
        }
        let mut value = whole.slice(start..end);
        if let Some(cap) = unframe {
            match strom_policy::frame::unpack(&value, cap) {
                Ok(v) => value = Bytes::from(v),
                Err(err) => {
                    // Not written by a producer of this compressed topic:
                    // handed over as stored, as a native consumer is told.
                    tracing::warn!(topic = %p.topic, partition = p.id, offset = b.base_offset, error = %err, "Kafka fetch: a data part of a compressed topic is not a frame; sent as stored");
                }
            }
        }
        records.push(event_record(&e.metadata, value));
    }
    out.reserve(crate::encode::batch_len_bound(&records));
    crate::encode::batch(out, b.base_offset, ts_ms, &records);
    Ok(())
}

/// One requested partition: its name, index, offset and byte limit.
struct Want {
    topic: usize,
    index: i32,
    offset: i64,
    max_bytes: i32,
    pm: Result<Arc<PartitionManager>, i16>,
    /// The topic is compressed: data parts are frames, and record values
    /// are what they hold (at most this many bytes).
    unframe: Option<u64>,
}

/// Reads every wanted partition once: the answers and the bytes read.
async fn gather(wants: &Arc<Vec<Want>>, max_bytes: u64) -> (Vec<Part>, u64) {
    let wants = wants.clone();
    tokio::task::spawn_blocking(move || {
        let mut left = max_bytes;
        let mut total = 0u64;
        let parts = wants
            .iter()
            .map(|w| match &w.pm {
                Err(code) => Part::error(*code),
                Ok(p) => {
                    let budget = (w.max_bytes.max(0) as u64).min(left);
                    let part = read_part(p, w.offset, budget, w.unframe);
                    let n = part.records.len() as u64;
                    left = left.saturating_sub(n);
                    total += n;
                    part
                }
            })
            .collect();
        (parts, total)
    })
    .await
    .unwrap_or_else(|_| (Vec::new(), 0))
}

pub fn fetch(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: FetchRequest = decode("Fetch", guard::FETCH, v, false, body)?;
    let svc = &ctx.services;
    let mut names = Vec::with_capacity(req.topics.len());
    let mut wants = Vec::new();
    for t in &req.topics {
        let name = t.topic.0.as_str().to_string();
        let refused = ctx.topic_code(strom_auth::Operation::Read, &name);
        for fp in &t.partitions {
            let pm = u32::try_from(fp.partition)
                .map_err(|_| kcode::UNKNOWN_TOPIC_OR_PARTITION)
                .and_then(|i| match refused {
                    kcode::NONE => Ok(i),
                    code => Err(code),
                })
                .and_then(|i| svc.data.partition(&name, i).map_err(|e| kafka_code(&e)));
            wants.push(Want {
                topic: names.len(),
                index: fp.partition,
                offset: fp.fetch_offset,
                max_bytes: fp.partition_max_bytes,
                pm,
                unframe: crate::mapping::topic_codec(svc, &name)
                    .map(|_| svc.config.max_batch_bytes),
            });
        }
        names.push(name);
    }
    let frame_room = u64::from(svc.config.max_frame_bytes).saturating_sub(RESPONSE_OVERHEAD);
    let max_bytes = (req.max_bytes.max(0) as u64).min(frame_room);
    let min_bytes = req.min_bytes.max(0) as u64;
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    let wants = Arc::new(wants);
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let deadline = tokio::time::Instant::now() + wait;
        let waiter = Arc::new(Waiter(Notify::new()));
        let sink: Arc<dyn BatchSink> = waiter.clone();
        let parts = loop {
            // Park first, so a batch made visible during the read wakes us.
            for p in wants.iter().filter_map(|w| w.pm.as_ref().ok()) {
                p.park(&sink);
            }
            let (parts, bytes) = gather(&wants, max_bytes).await;
            let errored = parts.iter().any(|p| p.error != kcode::NONE);
            let done = bytes >= min_bytes.max(1) || errored;
            let timed_out = done
                || tokio::time::timeout_at(deadline, waiter.0.notified())
                    .await
                    .is_err();
            for p in wants.iter().filter_map(|w| w.pm.as_ref().ok()) {
                p.unpark(&sink);
            }
            if done {
                break parts;
            }
            if timed_out {
                break gather(&wants, max_bytes).await.0;
            }
        };
        let mut topics: Vec<FetchableTopicResponse> = names
            .iter()
            .map(|n| {
                FetchableTopicResponse::default().with_topic(kafka_protocol::messages::TopicName(
                    StrBytes::from_string(n.clone()),
                ))
            })
            .collect();
        for (w, part) in wants.iter().zip(parts) {
            let mut pd = PartitionData::default()
                .with_partition_index(w.index)
                .with_error_code(part.error)
                .with_high_watermark(part.high_watermark)
                .with_last_stable_offset(part.high_watermark)
                .with_records(Some(part.records));
            if v >= 5 {
                pd = pd.with_log_start_offset(part.log_start);
            }
            topics[w.topic].partitions.push(pd);
        }
        // Fetch quotas meter what is sent, and throttle the answer.
        let sizes: Vec<(String, u64)> = topics
            .iter()
            .map(|t| {
                let n = t
                    .partitions
                    .iter()
                    .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
                    .sum();
                (t.topic.0.as_str().to_string(), n)
            })
            .collect();
        let wait = throttle::delay(&ctx.services.quotas, &ctx.who, Limit::Consume, &sizes);
        ctx.mute.hold(wait);
        let throttle_ms = throttle::answer(ApiKey::Fetch, v, wait).await;
        let mut resp = FetchResponse::default().with_responses(topics);
        if v >= 1 {
            resp = resp.with_throttle_time_ms(throttle_ms);
        }
        Some(ctx.respond(ApiKey::Fetch, v, c, &resp))
    }))
}

pub fn list_offsets(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: ListOffsetsRequest = decode("ListOffsets", guard::LIST_OFFSETS, v, false, body)?;
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let svc = &ctx.services;
        let mut topics = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let name = t.name.0.as_str().to_string();
            let mut parts = Vec::with_capacity(t.partitions.len());
            let refused = ctx.topic_code(strom_auth::Operation::Describe, &name);
            for lp in &t.partitions {
                let mut r = ListOffsetsPartitionResponse::default()
                    .with_partition_index(lp.partition_index);
                let pm = u32::try_from(lp.partition_index)
                    .map_err(|_| kcode::UNKNOWN_TOPIC_OR_PARTITION)
                    .and_then(|i| match refused {
                        kcode::NONE => Ok(i),
                        code => Err(code),
                    })
                    .and_then(|i| svc.data.partition(&name, i).map_err(|e| kafka_code(&e)));
                match pm {
                    Err(code) => r = r.with_error_code(code).with_offset(-1).with_timestamp(-1),
                    Ok(p) => {
                        let ts = lp.timestamp;
                        let (offset, timestamp) =
                            tokio::task::spawn_blocking(move || offset_for(&p, ts))
                                .await
                                .unwrap_or((-1, -1));
                        r = r.with_offset(offset).with_timestamp(timestamp);
                    }
                }
                if v >= 4 {
                    r = r.with_leader_epoch(0);
                }
                parts.push(r);
            }
            topics.push(
                ListOffsetsTopicResponse::default()
                    .with_name(kafka_protocol::messages::TopicName(StrBytes::from_string(
                        name,
                    )))
                    .with_partitions(parts),
            );
        }
        let resp = ListOffsetsResponse::default().with_topics(topics);
        Some(ctx.respond(ApiKey::ListOffsets, v, c, &resp))
    }))
}

/// `(offset, timestamp_ms)` for a ListOffsets timestamp: -1 latest, -2
/// earliest, else the first batch stamped at or after it (`-1, -1` if none).
fn offset_for(p: &PartitionManager, ts: i64) -> (i64, i64) {
    let visible = *p.watch_visible().borrow();
    match ts {
        -1 => (visible as i64, -1),
        -2 => (p.first_offset() as i64, -1),
        ts if ts >= 0 => {
            let o = p.offset_for_timestamp((ts as u64).saturating_mul(1000));
            if o >= visible {
                return (-1, -1);
            }
            let stamp = p
                .read_visible(o, 1)
                .ok()
                .and_then(|b| b.first().map(|b| (b.timestamp_us / 1000) as i64))
                .unwrap_or(ts);
            (o as i64, stamp)
        }
        _ => (-1, -1),
    }
}
