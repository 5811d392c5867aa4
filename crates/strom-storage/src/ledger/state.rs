//! [`ShareLedger`]: the in-memory state of a shared group's ledger on one
//! partition, changed only by applying [`LedgerRecord`]s (and by
//! [`ShareLedger::raise_floor`] when retention drops events). No I/O.
//!
//! Invariants: every acked range and dead letter lies above the floor (the
//! floor itself is never resolved); acked ranges are disjoint and never
//! adjacent; delivery counts are kept for unresolved offsets only;
//! `dispatched >= floor`.

use std::collections::BTreeMap;

use super::{DeadLetter, LedgerRecord, LedgerSnapshot};

/// The ack state of one shared group on one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareLedger {
    floor: u64,
    dispatched: u64,
    spec: Vec<u8>,
    /// Acked ranges, first -> end (exclusive). May cover dead offsets.
    acked: BTreeMap<u64, u64>,
    deliveries: BTreeMap<u64, u32>,
    dead: BTreeMap<u64, DeadLetter>,
    acked_total: u64,
    redelivered_total: u64,
    dead_total: u64,
}

impl ShareLedger {
    /// A group that starts at `floor`, with nothing resolved.
    pub fn new(floor: u64, spec: Vec<u8>) -> Self {
        ShareLedger {
            floor,
            dispatched: floor,
            spec,
            acked: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            dead: BTreeMap::new(),
            acked_total: 0,
            redelivered_total: 0,
            dead_total: 0,
        }
    }

    /// The state a snapshot describes. Its lists go through the same
    /// checks as records (a snapshot read from a damaged file cannot break
    /// the invariants).
    pub fn from_snapshot(s: &LedgerSnapshot) -> Self {
        let mut l = ShareLedger::new(s.floor, s.spec.clone());
        l.dispatched = s.dispatched.max(s.floor);
        // Dead letters first: an acked range may cover one.
        for &(offset, letter) in &s.dead {
            if !l.is_resolved(offset) {
                l.dead.insert(offset, letter);
            }
        }
        for &(first, end) in &s.acked {
            l.insert_acked(first, end);
        }
        for &(offset, n) in &s.deliveries {
            if !l.is_resolved(offset) {
                l.deliveries.insert(offset, n);
            }
        }
        l.advance();
        l.acked_total = s.acked_total;
        l.redelivered_total = s.redelivered_total;
        l.dead_total = s.dead_total;
        l
    }

    pub fn floor(&self) -> u64 {
        self.floor
    }

    pub fn spec(&self) -> &[u8] {
        &self.spec
    }

    pub fn dispatched(&self) -> u64 {
        self.dispatched
    }

    /// The acked range holding `offset`, as (first, end).
    fn acked_range(&self, offset: u64) -> Option<(u64, u64)> {
        self.acked
            .range(..=offset)
            .next_back()
            .filter(|(_, &end)| end > offset)
            .map(|(&first, &end)| (first, end))
    }

    /// Below the floor, acked, or dead-lettered.
    pub fn is_resolved(&self, offset: u64) -> bool {
        offset < self.floor || self.dead.contains_key(&offset) || self.acked_range(offset).is_some()
    }

    /// Smallest offset >= `from` that is not resolved (may be at or past
    /// the end of the log; the caller caps it).
    pub fn next_unresolved(&self, from: u64) -> u64 {
        let mut at = from.max(self.floor);
        loop {
            if let Some((_, end)) = self.acked_range(at) {
                at = end;
            } else if self.dead.contains_key(&at) {
                at = at.saturating_add(1);
            } else {
                return at;
            }
            if at == u64::MAX {
                return at;
            }
        }
    }

    /// The recorded delivery count of `offset` (a dead letter's count), 0
    /// if none is recorded.
    pub fn deliveries(&self, offset: u64) -> u32 {
        if let Some(l) = self.dead.get(&offset) {
            return l.deliveries;
        }
        self.deliveries.get(&offset).copied().unwrap_or(0)
    }

    pub fn acked_total(&self) -> u64 {
        self.acked_total
    }

    pub fn redelivered_total(&self) -> u64 {
        self.redelivered_total
    }

    pub fn dead_total(&self) -> u64 {
        self.dead_total
    }

    /// Unresolved offsets in `[from, to)`, with `from >= floor`.
    fn unresolved_in(&self, from: u64, to: u64) -> u64 {
        if to <= from {
            return 0;
        }
        let mut resolved = 0u64;
        // Ranges that may overlap [from, to): the one holding `from`, then
        // those starting inside.
        let start = self.acked_range(from).map_or(from, |(first, _)| first);
        for (&first, &end) in self.acked.range(start..to) {
            let (a, b) = (first.max(from), end.min(to));
            if b > a {
                resolved += b - a;
            }
        }
        for &offset in self.dead.range(from..to).map(|(o, _)| o) {
            if self.acked_range(offset).is_none() {
                resolved += 1;
            }
        }
        (to - from) - resolved
    }

    /// Number of resolved offsets above the floor.
    pub fn resolved_above_floor(&self) -> u64 {
        let top_acked = self.acked.values().next_back().copied().unwrap_or(0);
        let top_dead = self
            .dead
            .keys()
            .next_back()
            .map_or(0, |&o| o.saturating_add(1));
        let top = top_acked.max(top_dead).max(self.floor);
        (top - self.floor) - self.unresolved_in(self.floor, top)
    }

    /// Applies one record. Acks below the floor or of resolved offsets are
    /// no-ops; ranges merge; the floor advances over contiguous resolved
    /// offsets and what falls below it is pruned. `Start` and `Snapshot`
    /// replace the whole state.
    pub fn apply(&mut self, r: &LedgerRecord) {
        match r {
            LedgerRecord::Start { floor, spec } => *self = ShareLedger::new(*floor, spec.clone()),
            LedgerRecord::Snapshot(s) => *self = ShareLedger::from_snapshot(s),
            LedgerRecord::Acked(ranges) => {
                for &(first, count) in ranges {
                    let end = first.saturating_add(u64::from(count));
                    self.acked_total += self.insert_acked(first, end);
                }
                self.advance();
            }
            LedgerRecord::Redelivered(counts) => {
                for &(offset, n) in counts {
                    if self.is_resolved(offset) {
                        continue;
                    }
                    let had = self.deliveries.get(&offset).copied().unwrap_or(0);
                    if n > had {
                        self.redelivered_total += u64::from(n - had.max(1).min(n));
                        self.deliveries.insert(offset, n);
                    }
                }
            }
            LedgerRecord::Dispatched(upto) => self.dispatched = self.dispatched.max(*upto),
            LedgerRecord::DeadLettered { offset, letter } => {
                if !self.is_resolved(*offset) {
                    self.dead.insert(*offset, *letter);
                    self.deliveries.remove(offset);
                    self.dead_total += 1;
                    self.advance();
                }
            }
        }
    }

    /// Marks `[first, end)` acked (clipped to the floor), merging ranges.
    /// Returns how many offsets became resolved by it.
    fn insert_acked(&mut self, first: u64, end: u64) -> u64 {
        let first = first.max(self.floor);
        if end <= first {
            return 0;
        }
        let newly = self.unresolved_in(first, end);
        let (mut a, mut b) = (first, end);
        // Merge with every range that overlaps or touches [a, b).
        if let Some((f, e)) = self.acked.range(..=a).next_back().map(|(&f, &e)| (f, e)) {
            if e >= a {
                a = f;
                b = b.max(e);
                self.acked.remove(&f);
            }
        }
        let touching: Vec<(u64, u64)> = self.acked.range(a..=b).map(|(&f, &e)| (f, e)).collect();
        for (f, e) in touching {
            b = b.max(e);
            self.acked.remove(&f);
        }
        self.acked.insert(a, b);
        let gone: Vec<u64> = self.deliveries.range(first..end).map(|(&o, _)| o).collect();
        for o in gone {
            self.deliveries.remove(&o);
        }
        newly
    }

    /// Moves the floor over contiguous resolved offsets and prunes.
    fn advance(&mut self) {
        let start = self.floor;
        loop {
            if let Some(end) = self.acked.get(&self.floor).copied() {
                self.acked.remove(&self.floor);
                self.floor = end;
            } else if self.dead.contains_key(&self.floor) && self.floor < u64::MAX {
                self.floor += 1;
            } else {
                break;
            }
        }
        if self.floor != start {
            self.prune();
        }
    }

    /// Drops everything below the floor.
    fn prune(&mut self) {
        let floor = self.floor;
        self.dispatched = self.dispatched.max(floor);
        self.deliveries = self.deliveries.split_off(&floor);
        self.dead = self.dead.split_off(&floor);
        let mut above = self.acked.split_off(&floor);
        // A range that started below the floor but reaches past it.
        if let Some((_, &end)) = self.acked.iter().next_back() {
            if end > floor {
                above.insert(floor, end);
            }
        }
        self.acked = above;
    }

    /// Retention dropped everything below `to`: the floor becomes
    /// `max(floor, to)` and the state below it is pruned. Returns how many
    /// unresolved offsets were skipped.
    pub fn raise_floor(&mut self, to: u64) -> u64 {
        if to <= self.floor {
            return 0;
        }
        let skipped = self.unresolved_in(self.floor, to);
        self.floor = to;
        self.prune();
        self.advance();
        skipped
    }

    /// The whole state, for a `Snapshot` record or a describe.
    pub fn snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            floor: self.floor,
            dispatched: self.dispatched,
            spec: self.spec.clone(),
            acked: self.acked.iter().map(|(&f, &e)| (f, e)).collect(),
            deliveries: self.deliveries.iter().map(|(&o, &n)| (o, n)).collect(),
            dead: self.dead.iter().map(|(&o, &l)| (o, l)).collect(),
            acked_total: self.acked_total,
            redelivered_total: self.redelivered_total,
            dead_total: self.dead_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(ranges: &[(u64, u32)]) -> LedgerRecord {
        LedgerRecord::Acked(ranges.to_vec())
    }

    fn letter(deliveries: u32) -> DeadLetter {
        DeadLetter {
            deliveries,
            dlq_partition: 1,
            dlq_offset: 42,
        }
    }

    #[test]
    fn out_of_order_acks_advance_the_floor_only_over_contiguous_offsets() {
        let mut l = ShareLedger::new(10, Vec::new());
        l.apply(&acked(&[(12, 2), (15, 1)]));
        assert_eq!(l.floor(), 10);
        assert!(!l.is_resolved(10) && !l.is_resolved(11) && !l.is_resolved(14));
        assert!(l.is_resolved(12) && l.is_resolved(13) && l.is_resolved(15));
        assert_eq!(l.next_unresolved(12), 14);
        assert_eq!(l.resolved_above_floor(), 3);
        l.apply(&acked(&[(11, 1)]));
        assert_eq!(l.floor(), 10, "10 is still unacked");
        l.apply(&acked(&[(10, 1)]));
        assert_eq!(l.floor(), 14, "10..14 resolved, 14 is not");
        assert_eq!(l.resolved_above_floor(), 1);
        l.apply(&acked(&[(14, 1)]));
        assert_eq!(l.floor(), 16);
        assert_eq!(l.acked_total(), 6);
        assert_eq!(l.snapshot().acked, Vec::new(), "pruned below the floor");
    }

    #[test]
    fn acks_below_the_floor_or_already_resolved_count_once() {
        let mut l = ShareLedger::new(100, Vec::new());
        l.apply(&acked(&[(90, 20)]));
        assert_eq!(l.floor(), 110);
        assert_eq!(l.acked_total(), 10, "only 100..110 were above the floor");
        l.apply(&acked(&[(120, 5), (122, 5), (118, 1)]));
        assert_eq!(l.acked_total(), 10 + 5 + 2 + 1);
        assert_eq!(l.snapshot().acked, vec![(118, 119), (120, 127)]);
        l.apply(&acked(&[(119, 1)]));
        assert_eq!(
            l.snapshot().acked,
            vec![(118, 127)],
            "touching ranges merge"
        );
        l.apply(&acked(&[(0, u32::MAX)]));
        assert_eq!(l.floor(), u64::from(u32::MAX));
    }

    #[test]
    fn dead_letters_resolve_and_keep_their_count() {
        let mut l = ShareLedger::new(0, Vec::new());
        l.apply(&LedgerRecord::Redelivered(vec![(0, 3), (1, 2)]));
        assert_eq!((l.deliveries(0), l.deliveries(1)), (3, 2));
        assert_eq!(l.redelivered_total(), 3);
        l.apply(&LedgerRecord::DeadLettered {
            offset: 1,
            letter: letter(5),
        });
        assert!(l.is_resolved(1));
        assert_eq!(l.deliveries(1), 5);
        assert_eq!(l.floor(), 0);
        assert_eq!(l.next_unresolved(1), 2);
        l.apply(&LedgerRecord::DeadLettered {
            offset: 1,
            letter: letter(9),
        });
        assert_eq!(
            l.dead_total(),
            1,
            "a resolved offset is not dead-lettered twice"
        );
        l.apply(&acked(&[(0, 1)]));
        assert_eq!(l.floor(), 2, "the ack and the dead letter are contiguous");
        assert_eq!(l.deliveries(0), 0, "counts are pruned below the floor");
        assert_eq!(l.snapshot().dead, Vec::new());
    }

    #[test]
    fn an_ack_over_a_dead_letter_counts_only_the_acked_offsets() {
        let mut l = ShareLedger::new(0, Vec::new());
        l.apply(&LedgerRecord::DeadLettered {
            offset: 3,
            letter: letter(2),
        });
        l.apply(&acked(&[(2, 3)]));
        assert_eq!(l.acked_total(), 2);
        assert_eq!(l.resolved_above_floor(), 3);
        assert_eq!(l.raise_floor(5), 2, "0 and 1 were unresolved");
        assert_eq!(l.floor(), 5);
    }

    #[test]
    fn raise_floor_skips_unresolved_offsets_and_prunes() {
        let mut l = ShareLedger::new(0, Vec::new());
        l.apply(&acked(&[(2, 3), (8, 4)]));
        l.apply(&LedgerRecord::Redelivered(vec![(6, 2), (20, 2)]));
        assert_eq!(l.raise_floor(3), 2, "0 and 1 skipped");
        assert_eq!(l.floor(), 5, "3 and 4 were acked");
        assert_eq!(l.raise_floor(4), 0, "the floor never moves back");
        assert_eq!(l.raise_floor(10), 3, "5, 6 and 7 skipped");
        assert_eq!(l.floor(), 12);
        assert_eq!(l.deliveries(6), 0);
        assert_eq!(l.deliveries(20), 2);
        assert_eq!(l.dispatched(), 12, "dispatch never lags the floor");
        assert_eq!(l.snapshot().acked, Vec::new());
    }

    #[test]
    fn a_snapshot_rebuilds_the_same_state() {
        let mut l = ShareLedger::new(5, b"spec".to_vec());
        l.apply(&acked(&[(7, 2), (12, 1)]));
        l.apply(&LedgerRecord::Redelivered(vec![(5, 2), (10, 4)]));
        l.apply(&LedgerRecord::DeadLettered {
            offset: 11,
            letter: letter(4),
        });
        l.apply(&LedgerRecord::Dispatched(30));
        let s = l.snapshot();
        assert_eq!(s.acked, vec![(7, 9), (12, 13)]);
        assert_eq!(ShareLedger::from_snapshot(&s), l);
        let mut m = ShareLedger::new(0, Vec::new());
        m.apply(&LedgerRecord::Snapshot(Box::new(s)));
        assert_eq!(m, l);
        assert_eq!(m.spec(), b"spec");
        assert_eq!(m.dispatched(), 30);
    }

    /// Random records against a naive model (a set of resolved offsets).
    #[test]
    fn random_records_match_a_naive_model() {
        use crate::sim::SimRng;
        use std::collections::BTreeSet;
        for seed in 0..200 {
            let mut rng = SimRng::new(seed);
            let mut l = ShareLedger::new(rng.below(5), Vec::new());
            let mut floor = l.floor();
            let mut resolved = BTreeSet::new();
            let mut acked_total = 0;
            for _ in 0..60 {
                match rng.below(8) {
                    0..=4 => {
                        let first = rng.below(60);
                        let count = rng.below(6) as u32;
                        for o in first..first + u64::from(count) {
                            if o >= floor && resolved.insert(o) {
                                acked_total += 1;
                            }
                        }
                        l.apply(&acked(&[(first, count)]));
                    }
                    5 | 6 => {
                        let offset = rng.below(60);
                        if offset >= floor {
                            resolved.insert(offset);
                        }
                        l.apply(&LedgerRecord::DeadLettered {
                            offset,
                            letter: letter(2),
                        });
                    }
                    _ => {
                        let to = rng.below(40);
                        let skipped = (floor..to).filter(|o| !resolved.contains(o)).count();
                        assert_eq!(l.raise_floor(to), skipped as u64, "seed {seed}");
                        floor = floor.max(to);
                    }
                }
                while resolved.remove(&floor) {
                    floor += 1;
                }
                resolved.retain(|&o| o >= floor);
                assert_eq!(l.floor(), floor, "seed {seed}");
                assert_eq!(
                    l.resolved_above_floor(),
                    resolved.len() as u64,
                    "seed {seed}"
                );
                assert_eq!(l.acked_total(), acked_total, "seed {seed}");
                for o in 0..70 {
                    let want = o < floor || resolved.contains(&o);
                    assert_eq!(l.is_resolved(o), want, "seed {seed}, offset {o}");
                }
                let from = rng.below(70);
                let next = (from.max(floor)..).find(|o| !resolved.contains(o));
                assert_eq!(Some(l.next_unresolved(from)), next, "seed {seed}");
                assert_eq!(ShareLedger::from_snapshot(&l.snapshot()), l, "seed {seed}");
            }
        }
    }
}
