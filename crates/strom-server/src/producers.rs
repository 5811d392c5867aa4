//! Idempotent producers on one partition: for each producer id, the
//! sequence number its next batch must carry and where its recent batches
//! went. A batch whose stamp (`strom_proto::ProducerStamp`) was seen
//! before is answered with the offsets it got the first time instead of
//! being appended again; one that skips a sequence number is refused, so a
//! producer's batches land once each and in order. A *restart* stamp (the
//! producer's first resend after a failure, when every earlier batch of it
//! is settled) is taken even after a gap: batches a dead leader
//! acknowledged alone (`acks=leader`) are gone and never come again.
//!
//! The table is rebuilt from the batches themselves, which carry their
//! stamp: on open from the log's tail ([`TAIL_WINDOW`] offsets), on a
//! follower from each batch it copies, after a truncation from the tail
//! again. A leader elected from the in-sync followers therefore knows
//! every stamp an acknowledged batch carried.

use std::collections::{HashMap, VecDeque};

use strom_proto::ProducerStamp;
use strom_storage::{Appended, PartitionLog, SyncToken};

/// Batches remembered per producer: as many as an idempotent producer
/// keeps in flight per partition (its `max_batches` is at most 64), so
/// every batch it may resend after a failure is still known.
pub const RECENT: usize = 64;
/// Producers tracked per partition; past it the one idle longest (lowest
/// last offset) is forgotten.
pub const MAX_PRODUCERS: usize = 10_000;
/// How far back from the end of the log a reopened partition looks for
/// stamps: the batches a producer may still resend are at its tail.
pub const TAIL_WINDOW: u64 = 1 << 16;

/// Bit 63 of a stamp's producer word: the batch came from a Kafka
/// idempotent producer (see [`kafka_stamp`]).
pub const KAFKA_PRODUCER: u64 = 1 << 63;
/// Kafka producer ids are below this: they fill bits 16..62.
pub const KAFKA_MAX_PRODUCER_ID: i64 = 1 << 47;
/// Kafka sequences run from 0 to `i32::MAX` and wrap to 0.
const KAFKA_SEQ_MOD: u64 = 1 << 31;

/// The stamp of a Kafka idempotent producer's batch: producer id `pid`
/// (`0..KAFKA_MAX_PRODUCER_ID`), epoch and base sequence (non-negative);
/// `None` when they are out of range (the batch is then not idempotent).
pub fn kafka_stamp(pid: i64, epoch: i16, base_sequence: i32) -> Option<ProducerStamp> {
    if !(0..KAFKA_MAX_PRODUCER_ID).contains(&pid) || epoch < 0 || base_sequence < 0 {
        return None;
    }
    Some(ProducerStamp {
        producer: KAFKA_PRODUCER | (pid as u64) << 16 | epoch as u64,
        sequence: base_sequence as u32,
        restart: false,
    })
}

/// The table key and, for a Kafka stamp, the epoch.
fn key_of(s: &ProducerStamp) -> (u64, Option<u16>) {
    if s.producer & KAFKA_PRODUCER != 0 {
        (s.producer & !0xFFFF, Some(s.producer as u16))
    } else {
        (s.producer, None)
    }
}

/// What to do with a stamped batch.
#[derive(Debug)]
pub enum Check {
    /// Append it.
    Fresh,
    /// Append it, although it skips `skipped` batches: a restart stamp
    /// after batches a dead leader acknowledged alone (`acks=leader`).
    /// For an `acks=all` producer it means acknowledged batches were lost.
    AfterGap { skipped: u32 },
    /// Already in the log: answer with the first append's outcome.
    Duplicate(Appended),
    /// Out of order: refuse it with this reason.
    OutOfOrder(String),
    /// A Kafka batch of an epoch older than its producer's current one:
    /// refuse it with this reason.
    StaleEpoch(String),
}

#[derive(Default)]
struct Seqs {
    /// The Kafka producer epoch the sequences below belong to.
    epoch: u16,
    next: u32,
    /// (sequence, where it went), oldest first.
    recent: VecDeque<(u32, Appended)>,
}

/// The sequence table of one partition.
#[derive(Default)]
pub struct Producers {
    map: HashMap<u64, Seqs>,
}

impl Producers {
    /// Decides what a batch stamped `s` is.
    pub fn check(&self, s: ProducerStamp) -> Check {
        let (key, epoch) = key_of(&s);
        let Some(p) = self.map.get(&key) else {
            // Unknown producer (new, or its batches are older than the
            // window): any sequence starts it.
            return Check::Fresh;
        };
        if let Some(epoch) = epoch {
            if epoch < p.epoch {
                return Check::StaleEpoch(format!(
                    "Kafka producer {} sent a batch of epoch {epoch}, older than its epoch {}",
                    key >> 16 & (KAFKA_MAX_PRODUCER_ID as u64 - 1),
                    p.epoch
                ));
            }
            if epoch > p.epoch {
                return Check::Fresh;
            }
        }
        if s.sequence == p.next {
            return Check::Fresh;
        }
        if let Some((_, a)) = p.recent.iter().find(|(q, _)| *q == s.sequence) {
            return Check::Duplicate(a.clone());
        }
        if s.restart {
            // Every earlier batch is settled (some were lost with a leader
            // that acknowledged them alone): the gap is not one to wait for.
            return match s.sequence.wrapping_sub(p.next) {
                skipped if skipped <= u32::MAX / 2 => Check::AfterGap { skipped },
                // Older than the batches remembered: nothing is skipped.
                _ => Check::Fresh,
            };
        }
        let why = if s.sequence > p.next || p.next.wrapping_sub(s.sequence) > u32::MAX / 2 {
            format!(
                "producer {} sent batch {} where batch {} was expected: an earlier batch is missing",
                s.producer, s.sequence, p.next
            )
        } else {
            format!(
                "producer {} resent batch {}, older than the {} batches remembered (next is {})",
                s.producer, s.sequence, RECENT, p.next
            )
        };
        Check::OutOfOrder(why)
    }

    /// Records that the batch stamped `s` was appended as `a`.
    pub fn appended(&mut self, s: ProducerStamp, a: &Appended) {
        let (key, epoch) = key_of(&s);
        if !self.map.contains_key(&key) && self.map.len() >= MAX_PRODUCERS {
            self.forget_idlest();
        }
        let p = self.map.entry(key).or_default();
        match epoch {
            None => p.next = s.sequence.wrapping_add(1),
            Some(epoch) => {
                if epoch != p.epoch {
                    p.recent.clear();
                    p.epoch = epoch;
                }
                p.next = ((u64::from(s.sequence) + u64::from(a.count)) % KAFKA_SEQ_MOD) as u32;
            }
        }
        p.recent.push_back((s.sequence, a.clone()));
        if p.recent.len() > RECENT {
            p.recent.pop_front();
        }
    }

    fn forget_idlest(&mut self) {
        let last = |p: &Seqs| p.recent.back().map_or(0, |(_, a)| a.base_offset);
        if let Some(id) = self
            .map
            .iter()
            .min_by_key(|(_, p)| last(p))
            .map(|(id, _)| *id)
        {
            self.map.remove(&id);
        }
    }

    /// Rebuilds the table from the stamps in the last [`TAIL_WINDOW`]
    /// offsets of `log` (batches there are on disk: token 0). A batch it
    /// cannot read ends the scan there (with a warning): stamps past it
    /// are not known, and a resend of such a batch would be appended again.
    pub fn rebuild(log: &dyn PartitionLog) -> Producers {
        let mut table = Producers::default();
        let end = log.next_offset();
        let mut from = end.saturating_sub(TAIL_WINDOW).max(log.first_offset());
        while from < end {
            let batches = match log.read(from, 4 << 20) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(from, error = %e, "reading the log for producer stamps stopped");
                    break;
                }
            };
            let Some(last) = batches.last() else { break };
            from = last.base_offset + u64::from(last.count);
            for b in &batches {
                if let Some(s) = strom_proto::stamp_of(&b.meta) {
                    let a = Appended {
                        base_offset: b.base_offset,
                        count: b.count,
                        timestamp_us: b.timestamp_us,
                        token: SyncToken(0),
                    };
                    table.appended(s, &a);
                }
            }
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base_offset: u64) -> Appended {
        Appended {
            base_offset,
            count: 2,
            timestamp_us: 1,
            token: SyncToken(base_offset),
        }
    }

    fn stamp(producer: u64, sequence: u32) -> ProducerStamp {
        ProducerStamp {
            producer,
            sequence,
            restart: false,
        }
    }

    #[test]
    fn a_resent_batch_is_answered_with_its_first_offsets_and_a_gap_is_refused() {
        let mut t = Producers::default();
        assert!(matches!(t.check(stamp(7, 5)), Check::Fresh));
        t.appended(stamp(7, 5), &at(100));
        t.appended(stamp(7, 6), &at(102));
        assert!(matches!(t.check(stamp(7, 5)), Check::Duplicate(a) if a.base_offset == 100));
        assert!(matches!(t.check(stamp(7, 6)), Check::Duplicate(a) if a.base_offset == 102));
        assert!(matches!(t.check(stamp(7, 7)), Check::Fresh));
        assert!(matches!(t.check(stamp(7, 9)), Check::OutOfOrder(w) if w.contains("missing")));
        assert!(
            matches!(t.check(stamp(8, 9)), Check::Fresh),
            "another producer"
        );
        let restart = ProducerStamp {
            restart: true,
            ..stamp(7, 9)
        };
        assert!(
            matches!(t.check(restart), Check::AfterGap { skipped: 2 }),
            "a restart skips the gap, and says how much it skipped"
        );
        let resent = ProducerStamp {
            restart: true,
            ..stamp(7, 6)
        };
        assert!(matches!(t.check(resent), Check::Duplicate(a) if a.base_offset == 102));
    }

    #[test]
    fn only_the_recent_batches_are_remembered() {
        let mut t = Producers::default();
        for seq in 0..(RECENT as u32 + 10) {
            t.appended(stamp(1, seq), &at(u64::from(seq) * 2));
        }
        assert!(matches!(t.check(stamp(1, 3)), Check::OutOfOrder(w) if w.contains("older")));
        let last = RECENT as u32 + 9;
        assert!(matches!(t.check(stamp(1, last)), Check::Duplicate(_)));
    }

    #[test]
    fn past_the_limit_the_idlest_producer_is_forgotten() {
        let mut t = Producers::default();
        for p in 0..MAX_PRODUCERS as u64 {
            t.appended(stamp(p, 0), &at(1000 + p));
        }
        t.appended(stamp(1 << 40, 0), &at(1));
        assert_eq!(t.map.len(), MAX_PRODUCERS);
        assert!(!t.map.contains_key(&0), "producer 0 was idle longest");
        assert!(t.map.contains_key(&(1 << 40)));
    }

    fn kafka_at(base_offset: u64, count: u32) -> Appended {
        Appended {
            count,
            ..at(base_offset)
        }
    }

    #[test]
    fn kafka_sequences_count_records_and_a_retry_gets_its_first_offset() {
        let mut t = Producers::default();
        let s = |seq| kafka_stamp(7, 0, seq).unwrap();
        assert!(matches!(t.check(s(0)), Check::Fresh));
        t.appended(s(0), &kafka_at(100, 10));
        assert!(matches!(t.check(s(10)), Check::Fresh));
        t.appended(s(10), &kafka_at(110, 5));
        assert!(matches!(t.check(s(0)), Check::Duplicate(a) if a.base_offset == 100));
        assert!(matches!(t.check(s(10)), Check::Duplicate(a) if a.base_offset == 110));
        assert!(matches!(t.check(s(20)), Check::OutOfOrder(w) if w.contains("missing")));
        assert!(matches!(t.check(s(15)), Check::Fresh));
        // A native producer with the same number is another producer.
        assert!(matches!(t.check(stamp(7, 3)), Check::Fresh));
        t.appended(stamp(7, 3), &at(200));
        assert!(matches!(t.check(s(15)), Check::Fresh));
    }

    #[test]
    fn a_newer_kafka_epoch_starts_afresh_and_an_older_one_is_refused() {
        let mut t = Producers::default();
        t.appended(kafka_stamp(7, 0, 0).unwrap(), &kafka_at(0, 5));
        t.appended(kafka_stamp(7, 0, 5).unwrap(), &kafka_at(5, 5));
        assert!(matches!(
            t.check(kafka_stamp(7, 1, 0).unwrap()),
            Check::Fresh
        ));
        t.appended(kafka_stamp(7, 1, 0).unwrap(), &kafka_at(10, 3));
        assert!(
            matches!(t.check(kafka_stamp(7, 1, 0).unwrap()), Check::Duplicate(a) if a.base_offset == 10)
        );
        assert!(matches!(
            t.check(kafka_stamp(7, 1, 3).unwrap()),
            Check::Fresh
        ));
        assert!(matches!(
            t.check(kafka_stamp(7, 0, 10).unwrap()),
            Check::StaleEpoch(w) if w.contains("epoch 0")
        ));
    }

    #[test]
    fn kafka_stamps_out_of_range_are_not_idempotent() {
        assert!(kafka_stamp(-1, 0, 0).is_none());
        assert!(kafka_stamp(KAFKA_MAX_PRODUCER_ID, 0, 0).is_none());
        assert!(kafka_stamp(1, -1, 0).is_none());
        assert!(kafka_stamp(1, 0, -1).is_none());
        let s = kafka_stamp(KAFKA_MAX_PRODUCER_ID - 1, i16::MAX, i32::MAX).unwrap();
        assert_eq!(key_of(&s).1, Some(i16::MAX as u16));
        // The last sequence wraps to 0, as Kafka's do.
        let mut t = Producers::default();
        t.appended(s, &kafka_at(0, 1));
        let next = kafka_stamp(KAFKA_MAX_PRODUCER_ID - 1, i16::MAX, 0).unwrap();
        assert!(matches!(t.check(next), Check::Fresh));
        assert_eq!(t.map.values().next().unwrap().next, 0);
    }
}
