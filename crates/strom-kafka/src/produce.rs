//! `Produce`: each partition's record batches become one Strom batch (one
//! event per record, see `mapping.rs`), appended through `DataService` in
//! the order the requests arrived. The answer waits for every append's
//! reply, which comes once the batch is durable as the topic promises
//! (`acks` 1 and -1 alike); `acks = 0` gets no answer, as in Kafka.
//!
//! An idempotent producer's batch is stamped with its producer id, epoch
//! and base sequence (`strom_server::kafka_stamp`) and stored with that
//! stamp, so the partition's durable producer table (the one native
//! idempotent producers use, rebuilt from the log on restart and copied to
//! followers) recognises a retry across restarts and failovers: it is
//! answered with the first append's offset, a gap with
//! `OUT_OF_ORDER_SEQUENCE_NUMBER`, an older epoch with
//! `INVALID_PRODUCER_EPOCH`.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use strom_proto::BatchBuilder;
use strom_server::{kafka_stamp, CheckError, ValidBatch};
use tokio::sync::oneshot;

use crate::error::{kafka_code, kcode, FrameError};
use crate::guard;
use crate::mapping::record_meta;
use crate::records;
use crate::request::{decode, Ctx, Reply};
use crate::throttle;
use strom_policy::frame::FrameCodec;
use strom_server::quota::Limit;

/// How one partition's part of a request ends: an offset, or an error.
enum Outcome {
    Now(i16),
    /// Refused by the service (a storage quota): the code and why.
    Refused(i16, String),
    /// Refused by the topic's validator.
    Invalid(strom_server::Invalid),
    Pending(oneshot::Receiver<Result<u64, i16>>),
}

/// Builds the Strom batch for one partition's record set, stamped when it
/// comes from an idempotent producer.
fn batch(
    records: Bytes,
    max_bytes: u64,
    codec: Option<FrameCodec>,
) -> Result<Option<ValidBatch>, i16> {
    let batches = records::parse(records, max_bytes).map_err(|e| {
        tracing::info!(error = %e, "Kafka produce: refused record set");
        match e {
            records::RecordError::TooLarge(_) => kcode::MESSAGE_TOO_LARGE,
            _ => kcode::CORRUPT_MESSAGE,
        }
    })?;
    let mut b = BatchBuilder::new();
    let mut data = Vec::new();
    for r in batches.iter().flat_map(|b| b.records.iter()) {
        let mut value = r.value.clone().unwrap_or_default();
        if let Some(c) = codec {
            value = Bytes::from(strom_policy::frame::pack(c, &value));
        }
        b.push(&record_meta(r), &[], value.len() as u64);
        if !value.is_empty() {
            data.push(value);
        }
    }
    if b.is_empty() {
        return Ok(None);
    }
    let count = b.count();
    let stamp = batches
        .first()
        .filter(|f| f.producer_id >= 0)
        .and_then(|f| kafka_stamp(f.producer_id, f.producer_epoch, f.base_sequence));
    ValidBatch::check(count, b.finish_stamped(stamp), data)
        .map(Some)
        .map_err(|_| kcode::CORRUPT_MESSAGE)
}

pub fn produce(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: ProduceRequest = decode("Produce", guard::PRODUCE, v, false, body)?;
    let svc = &ctx.services;
    let max = svc.config.max_batch_bytes;
    // acks=-1 waits for every in-sync copy of a replicated partition.
    let acks_all = req.acks == -1;
    let mut topics = Vec::with_capacity(req.topic_data.len());
    let mut sizes = Vec::with_capacity(req.topic_data.len());
    for t in req.topic_data {
        let topic = t.name.0.as_str().to_string();
        let size = t
            .partition_data
            .iter()
            .filter_map(|pd| pd.records.as_ref().map(|r| r.len() as u64))
            .sum();
        sizes.push((topic.clone(), size));
        let mut parts = Vec::with_capacity(t.partition_data.len());
        let refused = ctx.topic_code(strom_auth::Operation::Write, &topic);
        for pd in t.partition_data {
            let outcome = match (u32::try_from(pd.index), pd.records) {
                _ if refused != kcode::NONE => Outcome::Now(refused),
                (Err(_), _) => Outcome::Now(kcode::UNKNOWN_TOPIC_OR_PARTITION),
                (_, None) => Outcome::Now(kcode::CORRUPT_MESSAGE),
                (Ok(index), Some(records)) => match svc.data.partition(&topic, index) {
                    Err(e) => {
                        tracing::info!(topic = %topic, partition = index, error = %e, "Kafka produce: partition not served here");
                        Outcome::Now(kafka_code(&e))
                    }
                    Ok(p) => match batch(records, max, crate::mapping::topic_codec(svc, &topic)) {
                        Err(code) => Outcome::Now(code),
                        Ok(None) => Outcome::Now(kcode::NONE),
                        Ok(Some(b)) => {
                            let (tx, rx) = oneshot::channel();
                            let t = topic.clone();
                            let reply: strom_server::AppendReply = Box::new(move |r| {
                                let r = r.map(|a| a.base_offset).map_err(|e| {
                                    tracing::info!(topic = %t, partition = index, error = %e, "Kafka produce: append refused or failed");
                                    kafka_code(&e)
                                });
                                let _ = tx.send(r);
                            });
                            match svc.data.produce(&p, b, acks_all, reply) {
                                Ok(()) => Outcome::Pending(rx),
                                Err(CheckError::Invalid(i)) => {
                                    tracing::info!(topic = %topic, partition = index, error = %i, "Kafka produce: refused by the topic's validator");
                                    Outcome::Invalid(i)
                                }
                                Err(CheckError::Server(e)) => {
                                    tracing::info!(topic = %topic, partition = index, error = %e, "Kafka produce: refused");
                                    Outcome::Refused(kafka_code(&e), e.to_string())
                                }
                            }
                        }
                    },
                },
            };
            parts.push((pd.index, outcome));
        }
        topics.push((topic, parts));
    }
    // Produce quotas meter what was sent, and throttle the answer.
    let wait = throttle::delay(&ctx.services.quotas, &ctx.who, Limit::Produce, &sizes);
    ctx.mute.hold(wait);
    if req.acks == 0 {
        return Ok(Box::pin(std::future::ready(None)));
    }
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut responses = Vec::with_capacity(topics.len());
        for (topic, parts) in topics {
            let mut prs = Vec::with_capacity(parts.len());
            for (index, outcome) in parts {
                let mut refused = None;
                let mut message = None;
                let r = match outcome {
                    Outcome::Now(code) => Err(code),
                    Outcome::Refused(code, why) => {
                        message = Some(why);
                        Err(code)
                    }
                    Outcome::Invalid(i) => {
                        refused = Some(i);
                        Err(kcode::INVALID_RECORD)
                    }
                    Outcome::Pending(rx) => rx.await.unwrap_or(Err(kcode::UNKNOWN_SERVER_ERROR)),
                };
                let mut pr = PartitionProduceResponse::default().with_index(index);
                match r {
                    Ok(base) => {
                        pr = pr.with_base_offset(base as i64);
                        if v >= 5 {
                            let first = u32::try_from(index)
                                .ok()
                                .and_then(|i| ctx.services.data.partition(&topic, i).ok())
                                .map(|p| p.first_offset() as i64)
                                .unwrap_or(0);
                            pr = pr.with_log_start_offset(first);
                        }
                    }
                    Err(code) => pr = pr.with_error_code(code).with_base_offset(-1),
                }
                if let (Some(m), true) = (message, v >= 8) {
                    pr = pr.with_error_message(Some(StrBytes::from_string(m)));
                }
                if let Some(i) = refused {
                    let message = format!("record {}: {}", i.index, i.reason);
                    pr = pr
                        .with_record_errors(vec![BatchIndexAndErrorMessage::default()
                            .with_batch_index(i.index as i32)
                            .with_batch_index_error_message(Some(StrBytes::from_string(
                                message.clone(),
                            )))])
                        .with_error_message(Some(StrBytes::from_string(message)));
                }
                prs.push(pr);
            }
            responses.push(
                TopicProduceResponse::default()
                    .with_name(TopicName(StrBytes::from_string(topic)))
                    .with_partition_responses(prs),
            );
        }
        let mut resp = ProduceResponse::default().with_responses(responses);
        let throttle_ms = throttle::answer(ApiKey::Produce, v, wait).await;
        if v >= 1 {
            resp = resp.with_throttle_time_ms(throttle_ms);
        }
        Some(ctx.respond(ApiKey::Produce, v, c, &resp))
    }))
}
