//! Dead letters: an event delivered `max_deliveries` times without an ack
//! is written to the group's dead-letter topic by the owner of its
//! partition (the owner holds the authoritative count and the bytes; the
//! worker that held it may well have crashed on it), and only then marked
//! resolved (`DeadLettered`, fsynced). A crash between the two writes
//! gives one duplicate in the dead-letter topic: at least once.
//!
//! The dead-letter topic has the source topic's placement (created with
//! the group), so partition `p` dead-letters into its own partition `p`
//! on the same server: no network hop. Its event keeps the original
//! descriptor and data; its metadata is the JSON envelope `{"topic",
//! "partition", "offset", "group", "deliveries", "metadata"}` (the
//! original metadata if it is JSON, else `"metadata_b64"`). If the write
//! fails, the event stays parked (neither redelivered nor resolved) and
//! is retried on the next round.

use std::sync::Arc;

use strom_proto::{BatchBuilder, BatchView};
use strom_storage::{DeadLetter, LedgerRecord};
use tokio::sync::oneshot;

use super::ShareCursor;
use crate::batch::ValidBatch;
use crate::error::ServerError;
use crate::partition::{AppendReply, PartitionManager};

/// Dead letters written per round, at most.
const PER_ROUND: usize = 64;

impl ShareCursor {
    pub(super) async fn dead_letter_due(self: &Arc<Self>, pm: &Arc<PartitionManager>) {
        let due: Vec<(u64, u32)> = {
            let st = self.state.lock();
            st.dead_due
                .iter()
                .take(PER_ROUND)
                .map(|(o, d)| (*o, *d))
                .collect()
        };
        for (offset, deliveries) in due {
            if let Err(e) = self.dead_letter(pm, offset, deliveries).await {
                tracing::warn!(group = %self.spec.name, partition = pm.id, offset, error = %e, "could not write a dead letter; it stays parked and is retried");
                return;
            }
            tracing::info!(group = %self.spec.name, partition = pm.id, offset, deliveries, "event sent to the dead-letter topic");
        }
    }

    async fn dead_letter(
        self: &Arc<Self>,
        pm: &Arc<PartitionManager>,
        offset: u64,
        deliveries: u32,
    ) -> Result<(), ServerError> {
        let topic = self.spec.dead_letter.clone().unwrap_or_default();
        let dlq = self.dead_letter_partition(&topic, pm.id)?;
        let batch = self.envelope(pm, offset, deliveries)?;
        let (tx, rx) = oneshot::channel();
        let reply: AppendReply = Box::new(move |r| {
            let _ = tx.send(r);
        });
        let size = batch.size();
        if size > 256 << 10 {
            tokio::task::block_in_place(|| dlq.append(batch, reply));
        } else {
            dlq.append(batch, reply);
        }
        let appended = rx.await.map_err(|_| {
            ServerError::coded(
                strom_proto::ErrorCode::SHUTTING_DOWN,
                "the dead-letter partition closed",
            )
        })??;
        let record = LedgerRecord::DeadLettered {
            offset,
            letter: DeadLetter {
                deliveries,
                dlq_partition: dlq.id,
                dlq_offset: appended.base_offset,
            },
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.flush_dead(record))
            .await
            .map_err(|e| ServerError::coded(strom_proto::ErrorCode::INTERNAL, e.to_string()))?
    }

    /// The dead-letter partition this server writes to: the one with the
    /// source's index if it is here (the default placement), else one of
    /// the dead-letter topic's partitions hosted here.
    fn dead_letter_partition(
        &self,
        topic: &str,
        source: u32,
    ) -> Result<Arc<PartitionManager>, ServerError> {
        let host = self.host.upgrade().ok_or_else(|| {
            ServerError::coded(
                strom_proto::ErrorCode::SHUTTING_DOWN,
                "the server is stopping",
            )
        })?;
        if let Ok(p) = host.partition(topic, source) {
            return Ok(p);
        }
        let mut local = host.partitions_of(topic);
        local.sort_by_key(|p| p.id);
        match local.len() {
            0 => Err(ServerError::coded(
                strom_proto::ErrorCode::PARTITION_UNAVAILABLE,
                format!("this server hosts no partition of the dead-letter topic '{topic}'"),
            )),
            n => Ok(local.swap_remove(source as usize % n)),
        }
    }

    /// The dead letter of `offset`: one event, the envelope as metadata,
    /// the original descriptor and data.
    fn envelope(
        &self,
        pm: &PartitionManager,
        offset: u64,
        deliveries: u32,
    ) -> Result<ValidBatch, ServerError> {
        let b = pm.read(offset, 1)?.into_iter().next().ok_or_else(|| {
            ServerError::coded(
                strom_proto::ErrorCode::OFFSET_OUT_OF_RANGE,
                format!("offset {offset} is not in the log"),
            )
        })?;
        let view = BatchView::parse(b.meta.clone())
            .map_err(|e| ServerError::coded(strom_proto::ErrorCode::CORRUPT, e.to_string()))?;
        let index = (offset - b.base_offset) as usize;
        let e = view.iter().nth(index).ok_or_else(|| {
            ServerError::coded(
                strom_proto::ErrorCode::CORRUPT,
                format!("batch at {} has no event {offset}", b.base_offset),
            )
        })?;
        let mut data = Vec::new();
        if e.data_len > 0 {
            pm.read_data(b.base_offset, &[(e.data_pos, e.data_len)], &mut data)?;
        }
        let mut env = serde_json::json!({
            "topic": pm.topic,
            "partition": pm.id,
            "offset": offset,
            "group": self.spec.name,
            "deliveries": deliveries,
        });
        match serde_json::from_slice::<serde_json::Value>(&e.metadata) {
            Ok(v) => env["metadata"] = v,
            Err(_) => env["metadata_b64"] = base64(&e.metadata).into(),
        }
        let meta_json = serde_json::to_vec(&env).unwrap_or_default();
        let mut builder = BatchBuilder::new();
        builder.push(&meta_json, &e.descriptor, e.data_len);
        ValidBatch::check(1, builder.finish(), data)
            .map_err(|e| ServerError::coded(strom_proto::ErrorCode::INTERNAL, e.to_string()))
    }
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(&[0xff, 0x00, 0x10, 0x7f]), "/wAQfw==");
    }
}
