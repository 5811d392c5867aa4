//! The batch metadata section: many events' metadata with one offset table
//! and no per-event framing beyond it.
//!
//! ```text
//! u32 count                     (bits 0..29; bit 31 set: a producer stamp
//!                                follows; bit 30: the stamp restarts the
//!                                producer's sequence)
//! [u64 producer, u32 sequence]  (the stamp, when bit 31 is set)
//! count × entry { u32 meta_len, u32 desc_len, u64 data_len }   (16 bytes each)
//! payload: for each event, its metadata bytes then its descriptor bytes
//! ```
//!
//! The *producer stamp* names the idempotent producer that sent the batch
//! and the batch's sequence number within its partition (0, 1, 2, ...).
//! A *restart* stamp tells the partition that every earlier batch of the
//! producer is settled (acknowledged), so a gap before it is not one to
//! wait for: batches acknowledged by a leader that died before its
//! followers copied them (`acks=leader`) are gone for good.
//! It travels and is stored with the batch, so any replica that holds the
//! batch knows it was appended and answers a retry of it without a second
//! append (docs/replication.md).
//!
//! The events' data parts are not in this section: they travel as the frame's
//! bulk payload and are stored in the partition's data store, back to back in
//! event order, so event *i*'s data starts at the sum of the earlier
//! `data_len`s. The *descriptor* is a small optional per-event blob that
//! describes the data (for example the dtype and shape of an array).
//! Storage keeps this section verbatim; the server pushes it to consumers as is.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtoError;

const ENTRY_LEN: usize = 16;
/// Bit 31 of the count word: a producer stamp follows it.
const STAMPED: u32 = 1 << 31;
/// Bit 30 of the count word (with bit 31): the stamp restarts the sequence.
const RESTART: u32 = 1 << 30;
const STAMP_LEN: usize = 12;
/// Most events in one batch (the count word's bits 0..29).
pub const MAX_EVENTS: u32 = RESTART - 1;

/// Which idempotent producer sent a batch, and the batch's sequence number
/// among that producer's batches to the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProducerStamp {
    pub producer: u64,
    pub sequence: u32,
    /// Every earlier batch of the producer to the partition is settled:
    /// the partition takes this sequence even after a gap.
    pub restart: bool,
}

/// `section` (a stamped batch) with its stamp marked as a restart; a copy
/// of the section, not of the data.
pub fn with_restart(section: &Bytes) -> Bytes {
    let mut out = BytesMut::from(&section[..]);
    if out.len() >= 4 && out[3] & 0x80 != 0 {
        out[3] |= 0x40;
    }
    out.freeze()
}

/// The stamp of a batch metadata section, from its first 16 bytes alone;
/// `None` when it has none (or is too short to hold one).
pub fn stamp_of(section: &[u8]) -> Option<ProducerStamp> {
    let word = u32::from_le_bytes(section.get(0..4)?.try_into().ok()?);
    if word & STAMPED == 0 {
        return None;
    }
    let producer = u64::from_le_bytes(section.get(4..12)?.try_into().ok()?);
    let sequence = u32::from_le_bytes(section.get(12..16)?.try_into().ok()?);
    Some(ProducerStamp {
        producer,
        sequence,
        restart: word & RESTART != 0,
    })
}

/// Accumulates events into a batch metadata section.
#[derive(Default)]
pub struct BatchBuilder {
    table: BytesMut,
    payload: BytesMut,
    count: u32,
    data_len: u64,
}

impl BatchBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one event. `metadata` and `descriptor` are copied into the batch.
    pub fn push(&mut self, metadata: &[u8], descriptor: &[u8], data_len: u64) {
        self.table.put_u32_le(metadata.len() as u32);
        self.table.put_u32_le(descriptor.len() as u32);
        self.table.put_u64_le(data_len);
        self.payload.put_slice(metadata);
        self.payload.put_slice(descriptor);
        self.count += 1;
        self.data_len += data_len;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of the metadata section once finished.
    pub fn meta_len(&self) -> usize {
        4 + self.table.len() + self.payload.len()
    }

    /// Sum of the events' data lengths.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Produces the section and resets the builder for reuse.
    pub fn finish(&mut self) -> Bytes {
        self.finish_stamped(None)
    }

    /// Produces the section with `stamp` (if any) and resets the builder.
    pub fn finish_stamped(&mut self, stamp: Option<ProducerStamp>) -> Bytes {
        let mut out = BytesMut::with_capacity(self.meta_len() + STAMP_LEN);
        match stamp {
            None => out.put_u32_le(self.count),
            Some(s) => {
                let restart = if s.restart { RESTART } else { 0 };
                out.put_u32_le(self.count | STAMPED | restart);
                out.put_u64_le(s.producer);
                out.put_u32_le(s.sequence);
            }
        }
        out.put_slice(&self.table);
        out.put_slice(&self.payload);
        self.table.clear();
        self.payload.clear();
        self.count = 0;
        self.data_len = 0;
        out.freeze()
    }
}

/// One event of a parsed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventEntry {
    pub metadata: Bytes,
    pub descriptor: Bytes,
    /// Where the event's data starts within the batch's data section.
    pub data_pos: u64,
    pub data_len: u64,
}

/// A validated view of a batch metadata section.
#[derive(Clone, Debug)]
pub struct BatchView {
    section: Bytes,
    count: u32,
    data_len: u64,
    /// Where the offset table starts (after the count and the stamp).
    table: usize,
    stamp: Option<ProducerStamp>,
}

impl BatchView {
    /// Checks the whole section: the count against the bytes present, and the
    /// lengths in the table against the payload.
    pub fn parse(section: Bytes) -> Result<Self, ProtoError> {
        if section.len() < 4 {
            return Err(ProtoError::Truncated {
                what: "batch count",
                needed: 4,
                remaining: section.len(),
            });
        }
        let word = u32::from_le_bytes([section[0], section[1], section[2], section[3]]);
        let count = word & MAX_EVENTS;
        if word & (STAMPED | RESTART) == RESTART {
            return Err(ProtoError::invalid(
                "batch",
                "a sequence restart flag without a producer stamp",
            ));
        }
        let stamp = stamp_of(&section);
        let table = if word & STAMPED == 0 {
            4
        } else {
            4 + STAMP_LEN
        };
        if stamp.is_none() && table > 4 {
            return Err(ProtoError::Truncated {
                what: "batch producer stamp",
                needed: table as u64,
                remaining: section.len(),
            });
        }
        let table_len = count as u64 * ENTRY_LEN as u64;
        let body = section.len() as u64 - table as u64;
        if table_len > body {
            return Err(ProtoError::Truncated {
                what: "batch offset table",
                needed: table_len,
                remaining: body as usize,
            });
        }
        let mut payload: u64 = 0;
        let mut data_len: u64 = 0;
        for i in 0..count as usize {
            let e = table + i * ENTRY_LEN;
            let m = u32::from_le_bytes(section[e..e + 4].try_into().expect("4 bytes")) as u64;
            let d = u32::from_le_bytes(section[e + 4..e + 8].try_into().expect("4 bytes")) as u64;
            let dl = u64::from_le_bytes(section[e + 8..e + 16].try_into().expect("8 bytes"));
            payload += m + d;
            data_len = data_len
                .checked_add(dl)
                .ok_or_else(|| ProtoError::invalid("batch", "data lengths overflow"))?;
        }
        if payload != body - table_len {
            return Err(ProtoError::invalid(
                "batch",
                format!(
                    "offset table describes {payload} payload bytes but {} are present",
                    body - table_len
                ),
            ));
        }
        Ok(BatchView {
            section,
            count,
            data_len,
            table,
            stamp,
        })
    }

    /// The producer stamp, if the batch carries one.
    pub fn stamp(&self) -> Option<ProducerStamp> {
        self.stamp
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Total bytes of the batch's data section.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    pub fn section(&self) -> &Bytes {
        &self.section
    }

    /// Iterates the events in order (one pass over the table, no allocation).
    pub fn iter(&self) -> impl Iterator<Item = EventEntry> + '_ {
        let mut payload_pos = self.table + self.count as usize * ENTRY_LEN;
        let mut data_pos = 0u64;
        (0..self.count as usize).map(move |i| {
            let e = self.table + i * ENTRY_LEN;
            let t = &self.section[e..e + ENTRY_LEN];
            let m = u32::from_le_bytes(t[0..4].try_into().expect("4 bytes")) as usize;
            let d = u32::from_le_bytes(t[4..8].try_into().expect("4 bytes")) as usize;
            let dl = u64::from_le_bytes(t[8..16].try_into().expect("8 bytes"));
            let entry = EventEntry {
                metadata: self.section.slice(payload_pos..payload_pos + m),
                descriptor: self.section.slice(payload_pos + m..payload_pos + m + d),
                data_pos,
                data_len: dl,
            };
            payload_pos += m + d;
            data_pos += dl;
            entry
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_parses() {
        let mut b = BatchBuilder::new();
        b.push(b"{\"a\":1}", b"", 10);
        b.push(b"{}", b"desc", 0);
        b.push(b"", b"", 5);
        assert_eq!(b.data_len(), 15);
        let v = BatchView::parse(b.finish()).unwrap();
        assert!(b.is_empty());
        let ev: Vec<_> = v.iter().collect();
        assert_eq!(ev.len(), 3);
        assert_eq!(&ev[0].metadata[..], b"{\"a\":1}");
        assert_eq!(&ev[1].descriptor[..], b"desc");
        assert_eq!((ev[2].data_pos, ev[2].data_len), (10, 5));
        assert_eq!(v.data_len(), 15);
    }

    #[test]
    fn rejects_inconsistent_sections() {
        let mut b = BatchBuilder::new();
        b.push(b"abc", b"", 1);
        let good = b.finish();
        for cut in 0..good.len() {
            assert!(BatchView::parse(good.slice(..cut)).is_err(), "cut {cut}");
        }
        let mut bad = BytesMut::from(&good[..]);
        bad[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(BatchView::parse(bad.freeze()).is_err());
    }

    #[test]
    fn a_stamped_batch_reads_like_an_unstamped_one_and_names_its_producer() {
        let fill = |b: &mut BatchBuilder| {
            b.push(b"m0", b"d", 3);
            b.push(b"", b"", 4);
        };
        let (mut plain, mut stamped) = (BatchBuilder::new(), BatchBuilder::new());
        fill(&mut plain);
        fill(&mut stamped);
        let stamp = ProducerStamp {
            producer: 0x0102_0304_0506_0708,
            sequence: 77,
            restart: false,
        };
        let p = BatchView::parse(plain.finish()).unwrap();
        let section = stamped.finish_stamped(Some(stamp));
        assert_eq!(stamp_of(&section), Some(stamp));
        let s = BatchView::parse(section.clone()).unwrap();
        assert_eq!((p.stamp(), s.stamp()), (None, Some(stamp)));
        assert_eq!((s.count(), s.data_len()), (2, 7));
        assert_eq!(p.iter().collect::<Vec<_>>(), s.iter().collect::<Vec<_>>());
        for cut in 0..section.len() {
            assert!(BatchView::parse(section.slice(..cut)).is_err(), "cut {cut}");
        }
        assert_eq!(stamp_of(&section[..15]), None);
        let restarted = with_restart(&section);
        let r = BatchView::parse(restarted).unwrap();
        assert_eq!(
            r.stamp(),
            Some(ProducerStamp {
                restart: true,
                ..stamp
            })
        );
        assert_eq!(r.iter().collect::<Vec<_>>(), s.iter().collect::<Vec<_>>());
        let mut bad = BytesMut::from(&p.section()[..]);
        bad[3] |= 0x40;
        assert!(
            BatchView::parse(bad.freeze()).is_err(),
            "restart without a stamp"
        );
    }
}
