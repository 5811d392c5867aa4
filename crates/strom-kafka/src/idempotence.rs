//! Idempotent producers: per (producer id, topic, partition), the next
//! sequence number expected and the offsets of the last five batches, kept
//! in memory. A retried batch (its sequence already seen) is not appended
//! again: it is answered with the offset it got the first time, or
//! `DUPLICATE_SEQUENCE_NUMBER` (which librdkafka treats as success) when
//! that is no longer known; a gap is answered `OUT_OF_ORDER_SEQUENCE_NUMBER`.
//! After a server restart, or a failed append, the next batch starts afresh.
//!
//! The table is bounded (`kafka_max_producer_states`): past the cap, the
//! least recently used (producer, partition) is forgotten, one at a time,
//! so a flood of new producers cannot wipe an active one's protection.
//!
//! Sequences count within a producer epoch. A batch of a newer epoch starts
//! afresh: Kafka's Java producer bumps its epoch itself (same producer id)
//! after a batch expired or a gap, and numbers its next batches from 0
//! again, which must not be taken for retries. A batch of an older epoch is
//! refused (`INVALID_PRODUCER_EPOCH`), as Kafka does.

use std::collections::{BTreeMap, HashMap, VecDeque};

use parking_lot::Mutex;

/// Batches whose offsets are remembered per producer and partition (as
/// Kafka does, for `max.in.flight` up to 5).
const RECENT: usize = 5;
/// Most (producer, partition) pairs tracked by default.
const DEFAULT_CAP: usize = 100_000;

pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const INVALID_PRODUCER_EPOCH: i16 = 47;

type Key = (i64, String, u32);

#[derive(Default)]
struct Entry {
    /// The producer epoch the sequences below belong to.
    epoch: i16,
    next: i32,
    /// (base sequence, base offset once appended).
    recent: VecDeque<(i32, Option<u64>)>,
    /// When it was last used (a tick of its table).
    used: u64,
}

/// What to do with a batch of an idempotent producer.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// Append it.
    Fresh,
    /// Already appended at this offset.
    Duplicate(Option<u64>),
    /// A gap in the sequence: refuse it.
    OutOfOrder { expected: i32 },
    /// A batch of an epoch older than the producer's current one: refuse it.
    StaleEpoch { current: i16 },
}

/// The entries, and their order of last use.
struct Table {
    map: HashMap<Key, Entry>,
    /// Tick of last use -> key, oldest first.
    order: BTreeMap<u64, Key>,
    tick: u64,
    cap: usize,
}

impl Table {
    /// The entry of `key`, created if new (forgetting the least recently
    /// used ones past the cap), marked as used now.
    fn touch(&mut self, key: Key) -> &mut Entry {
        self.tick += 1;
        let tick = self.tick;
        if let Some(old) = self.map.get(&key).map(|e| e.used) {
            self.order.remove(&old);
        } else {
            while self.map.len() >= self.cap {
                let Some((_, oldest)) = self.order.pop_first() else {
                    break;
                };
                self.map.remove(&oldest);
            }
        }
        self.order.insert(tick, key.clone());
        let e = self.map.entry(key).or_default();
        e.used = tick;
        e
    }

    fn remove(&mut self, key: &Key) {
        if let Some(e) = self.map.remove(key) {
            self.order.remove(&e.used);
        }
    }
}

/// Every tracked idempotent producer's state, at most `cap` of them.
pub struct Sequences {
    table: Mutex<Table>,
}

impl Default for Sequences {
    fn default() -> Self {
        Self::new(DEFAULT_CAP)
    }
}

impl Sequences {
    /// A table of at most `cap` (producer, partition) states.
    pub fn new(cap: usize) -> Self {
        Sequences {
            table: Mutex::new(Table {
                map: HashMap::new(),
                order: BTreeMap::new(),
                tick: 0,
                cap: cap.max(1),
            }),
        }
    }

    /// Checks a batch of `count` records of producer `pid` at `epoch`
    /// starting at `base_seq`; a fresh one is recorded as sent.
    pub fn check(
        &self,
        pid: i64,
        epoch: i16,
        topic: &str,
        part: u32,
        base_seq: i32,
        count: i32,
    ) -> Check {
        let mut table = self.table.lock();
        let e = table.touch((pid, topic.to_string(), part));
        if !e.recent.is_empty() && epoch != e.epoch {
            if epoch < e.epoch {
                return Check::StaleEpoch { current: e.epoch };
            }
            // A newer epoch: its sequences start afresh.
            e.recent.clear();
        }
        e.epoch = epoch;
        let fresh = e.recent.is_empty() || base_seq == e.next;
        if !fresh {
            if base_seq < e.next {
                let known = e
                    .recent
                    .iter()
                    .find(|(s, _)| *s == base_seq)
                    .and_then(|(_, o)| *o);
                return Check::Duplicate(known);
            }
            return Check::OutOfOrder { expected: e.next };
        }
        e.next = base_seq.wrapping_add(count);
        e.recent.push_back((base_seq, None));
        if e.recent.len() > RECENT {
            e.recent.pop_front();
        }
        Check::Fresh
    }

    /// Records where a fresh batch was appended, or forgets the producer's
    /// state on this partition if the append failed; nothing when the
    /// producer has moved to another epoch since.
    pub fn appended(
        &self,
        pid: i64,
        epoch: i16,
        topic: &str,
        part: u32,
        base_seq: i32,
        offset: Option<u64>,
    ) {
        let mut table = self.table.lock();
        let key = (pid, topic.to_string(), part);
        if table.map.get(&key).is_some_and(|e| e.epoch != epoch) {
            return;
        }
        match offset {
            None => table.remove(&key),
            Some(o) => {
                if let Some(e) = table.map.get_mut(&key) {
                    if let Some(r) = e.recent.iter_mut().find(|(s, _)| *s == base_seq) {
                        r.1 = Some(o);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_batch_is_a_duplicate_with_its_first_offset() {
        let s = Sequences::default();
        assert_eq!(s.check(7, 0, "t", 0, 0, 10), Check::Fresh);
        s.appended(7, 0, "t", 0, 0, Some(100));
        assert_eq!(s.check(7, 0, "t", 0, 10, 5), Check::Fresh);
        // The response to the second was lost; the client retries both.
        assert_eq!(s.check(7, 0, "t", 0, 0, 10), Check::Duplicate(Some(100)));
        assert_eq!(s.check(7, 0, "t", 0, 10, 5), Check::Duplicate(None));
        assert_eq!(
            s.check(7, 0, "t", 0, 20, 1),
            Check::OutOfOrder { expected: 15 }
        );
        assert_eq!(s.check(7, 0, "t", 0, 15, 1), Check::Fresh);
        // Another partition or producer is independent.
        assert_eq!(s.check(7, 0, "t", 1, 0, 1), Check::Fresh);
        assert_eq!(s.check(8, 0, "t", 0, 0, 1), Check::Fresh);
        // A failed append forgets: the retry is appended.
        s.appended(7, 0, "t", 0, 15, None);
        assert_eq!(s.check(7, 0, "t", 0, 15, 1), Check::Fresh);
    }

    #[test]
    fn past_the_cap_the_least_recently_used_producer_is_forgotten() {
        let s = Sequences::new(4);
        assert_eq!(s.check(1, 0, "t", 0, 0, 1), Check::Fresh);
        s.appended(1, 0, "t", 0, 0, Some(0));
        // A flood of new producers; producer 1 stays active meanwhile.
        let mut next = 1;
        for pid in 100..140 {
            assert_eq!(s.check(pid, 0, "t", 0, 0, 1), Check::Fresh);
            if pid % 2 == 0 {
                assert_eq!(s.check(1, 0, "t", 0, next, 1), Check::Fresh);
                s.appended(1, 0, "t", 0, next, Some(u64::from(next as u32)));
                next += 1;
            }
        }
        // Its last batch retried is still a duplicate.
        assert_eq!(
            s.check(1, 0, "t", 0, next - 1, 1),
            Check::Duplicate(Some(u64::from(next as u32 - 1)))
        );
        // The oldest of the flood was forgotten: its retry looks fresh.
        assert_eq!(s.check(100, 0, "t", 0, 0, 1), Check::Fresh);
        assert!(s.table.lock().map.len() <= 4);
    }

    #[test]
    fn a_new_epoch_starts_its_sequences_afresh() {
        // Kafka's Java producer, after batches expired, bumps its epoch and
        // numbers from 0 again: those batches are new, not retries.
        let s = Sequences::default();
        assert_eq!(s.check(7, 0, "t", 0, 0, 5), Check::Fresh);
        s.appended(7, 0, "t", 0, 0, Some(0));
        assert_eq!(s.check(7, 0, "t", 0, 5, 5), Check::Fresh);
        s.appended(7, 0, "t", 0, 5, Some(5));
        assert_eq!(s.check(7, 1, "t", 0, 0, 3), Check::Fresh);
        s.appended(7, 1, "t", 0, 0, Some(10));
        assert_eq!(s.check(7, 1, "t", 0, 3, 1), Check::Fresh);
        // Retries within the new epoch are still duplicates.
        assert_eq!(s.check(7, 1, "t", 0, 0, 3), Check::Duplicate(Some(10)));
        assert_eq!(
            s.check(7, 1, "t", 0, 9, 1),
            Check::OutOfOrder { expected: 4 }
        );
        // A late batch of the old epoch is refused, and an old append's
        // report does not touch the new epoch's state.
        assert_eq!(
            s.check(7, 0, "t", 0, 10, 1),
            Check::StaleEpoch { current: 1 }
        );
        s.appended(7, 0, "t", 0, 3, None);
        assert_eq!(s.check(7, 1, "t", 0, 4, 1), Check::Fresh);
    }
}
