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

/// Room kept before the offset table for the count word and a stamp, so a
/// finished section's head is the table's own buffer.
const HEAD_ROOM: usize = 4 + STAMP_LEN;

/// A finished batch metadata section in the two pieces it was built in:
/// the head (count word, stamp and offset table) and the tail (the events'
/// metadata and descriptors). A sender writes both pieces as they are
/// (`writev`), so the events' metadata is not copied again after
/// [`BatchBuilder::push`]. A section that arrives whole is all head.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Section {
    head: Bytes,
    tail: Bytes,
}

impl Section {
    /// Bytes of the whole section.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The non-empty pieces, in order (the buffers are shared, not copied).
    pub fn pieces(&self) -> Vec<Bytes> {
        [&self.head, &self.tail]
            .into_iter()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect()
    }

    /// The section in one buffer: a copy, unless it is in one piece.
    pub fn to_bytes(&self) -> Bytes {
        if self.tail.is_empty() {
            return self.head.clone();
        }
        let mut out = BytesMut::with_capacity(self.len());
        out.put_slice(&self.head);
        out.put_slice(&self.tail);
        out.freeze()
    }

    /// The section with its stamp (if it has one) marked as a restart;
    /// only the head is copied.
    pub fn with_restart(&self) -> Section {
        let mut head = BytesMut::from(&self.head[..]);
        if head.len() >= 4 && head[3] & 0x80 != 0 {
            head[3] |= 0x40;
        }
        Section {
            head: head.freeze(),
            tail: self.tail.clone(),
        }
    }
}

impl From<Bytes> for Section {
    fn from(whole: Bytes) -> Self {
        Section {
            head: whole,
            tail: Bytes::new(),
        }
    }
}

/// Accumulates events into a batch metadata section. Each event's metadata
/// and descriptor are copied once, into the tail; finishing joins nothing.
#[derive(Default)]
pub struct BatchBuilder {
    /// [`HEAD_ROOM`] bytes, then the offset table (empty until the first
    /// push or finish).
    table: BytesMut,
    payload: BytesMut,
    count: u32,
    data_len: u64,
    /// Bytes of the last finished batch's table and payload: what the next
    /// batch reserves at its first push, so it does not grow by copying.
    last: (usize, usize),
}

impl BatchBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one event. `metadata` and `descriptor` are copied into the batch.
    pub fn push(&mut self, metadata: &[u8], descriptor: &[u8], data_len: u64) {
        self.make_head_room();
        self.table.put_u32_le(metadata.len() as u32);
        self.table.put_u32_le(descriptor.len() as u32);
        self.table.put_u64_le(data_len);
        self.payload.put_slice(metadata);
        self.payload.put_slice(descriptor);
        self.count += 1;
        self.data_len += data_len;
    }

    fn make_head_room(&mut self) {
        if self.table.is_empty() {
            self.table.reserve(self.last.0.max(HEAD_ROOM + ENTRY_LEN));
            self.table.put_bytes(0, HEAD_ROOM);
            self.payload.reserve(self.last.1);
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of the metadata section once finished without a stamp.
    pub fn meta_len(&self) -> usize {
        4 + self.table.len().saturating_sub(HEAD_ROOM) + self.payload.len()
    }

    /// Sum of the events' data lengths.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Produces the section in one buffer and resets the builder for reuse.
    pub fn finish(&mut self) -> Bytes {
        self.finish_stamped(None)
    }

    /// Produces the section with `stamp` (if any), in one buffer, and
    /// resets the builder.
    pub fn finish_stamped(&mut self, stamp: Option<ProducerStamp>) -> Bytes {
        self.finish_section(stamp).to_bytes()
    }

    /// Produces the section with `stamp` (if any) in its two pieces, without
    /// copying either, and resets the builder.
    pub fn finish_section(&mut self, stamp: Option<ProducerStamp>) -> Section {
        self.make_head_room();
        let start = match stamp {
            None => {
                self.table[HEAD_ROOM - 4..HEAD_ROOM].copy_from_slice(&self.count.to_le_bytes());
                HEAD_ROOM - 4
            }
            Some(s) => {
                let restart = if s.restart { RESTART } else { 0 };
                let word = self.count | STAMPED | restart;
                self.table[0..4].copy_from_slice(&word.to_le_bytes());
                self.table[4..12].copy_from_slice(&s.producer.to_le_bytes());
                self.table[12..16].copy_from_slice(&s.sequence.to_le_bytes());
                0
            }
        };
        self.last = (self.table.len(), self.payload.len());
        let head = self.table.split().freeze().slice(start..);
        let tail = self.payload.split().freeze();
        self.count = 0;
        self.data_len = 0;
        Section { head, tail }
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
        let restarted = Section::from(section.clone()).with_restart();
        let r = BatchView::parse(restarted.to_bytes()).unwrap();
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

    /// The two pieces of a finished section are the bytes of the joined
    /// one, stamped or not, across reuses of the builder and when empty.
    #[test]
    fn a_section_in_pieces_is_the_joined_section() {
        let stamp = ProducerStamp {
            producer: 9,
            sequence: 3,
            restart: false,
        };
        let mut b = BatchBuilder::new();
        let empty = b.finish_section(None);
        assert_eq!(BatchView::parse(empty.to_bytes()).unwrap().count(), 0);
        for round in 0..3u32 {
            for s in [None, Some(stamp)] {
                let (mut pieces, mut joined) = (BatchBuilder::new(), BatchBuilder::new());
                for i in 0..round + 2 {
                    let meta = vec![i as u8; i as usize * 100];
                    for x in [&mut pieces, &mut joined, &mut b] {
                        x.push(&meta, b"d", u64::from(i));
                    }
                }
                let whole = joined.finish_stamped(s);
                let section = pieces.finish_section(s);
                assert_eq!(section.len(), whole.len());
                let glued: Vec<u8> = section.pieces().iter().flatten().copied().collect();
                assert_eq!(glued, &whole[..]);
                assert_eq!(b.finish_section(s).to_bytes(), whole, "reused builder");
                let v = BatchView::parse(section.with_restart().to_bytes()).unwrap();
                assert_eq!(v.stamp().map(|s| s.restart), s.map(|_| true));
                assert_eq!(v.count(), round + 2);
            }
        }
    }
}
