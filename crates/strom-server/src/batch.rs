//! A produced batch, checked once where it enters the server: its table
//! must agree with its event count and with the data that came with it.
//! Everything after the front end takes a [`ValidBatch`], so nothing parses
//! the table again.

use bytes::Bytes;
use strom_proto::{BatchView, ProducerStamp, ProtoError};

/// A batch whose metadata table matches its count and data.
pub struct ValidBatch {
    meta: Bytes,
    count: u32,
    data: Vec<Bytes>,
    stamp: Option<ProducerStamp>,
}

impl ValidBatch {
    /// Checks `meta`'s table against `count` and the data segments.
    pub fn check(count: u32, meta: Bytes, data: Vec<Bytes>) -> Result<Self, ProtoError> {
        let view = BatchView::parse(meta.clone())?;
        let data_len: u64 = data.iter().map(|b| b.len() as u64).sum();
        if count == 0 || view.count() != count || view.data_len() != data_len {
            return Err(ProtoError::Invalid {
                what: "produce batch",
                detail: format!(
                    "header says {count} events, the table {} events and {} data bytes, {data_len} data bytes were sent",
                    view.count(),
                    view.data_len()
                ),
            });
        }
        let stamp = view.stamp();
        Ok(ValidBatch {
            meta,
            count,
            data,
            stamp,
        })
    }

    /// The idempotent producer's stamp, if the batch carries one.
    pub fn stamp(&self) -> Option<ProducerStamp> {
        self.stamp
    }

    pub fn meta(&self) -> &Bytes {
        &self.meta
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn data(&self) -> &[Bytes] {
        &self.data
    }

    /// Metadata plus data bytes.
    pub fn size(&self) -> u64 {
        self.meta.len() as u64 + self.data.iter().map(|d| d.len() as u64).sum::<u64>()
    }
}
