//! Who holds what in a shared group on one partition, as pure state (no
//! I/O, no clock of its own): the members and their credit, the events
//! delivered and not yet resolved (`pending`), the events due again
//! (`retry`), and the split of a stored batch into contiguous runs for the
//! members that have credit, served round-robin.
//!
//! Credit is charged exactly, and it is the member's *unacked* window (as
//! RabbitMQ's prefetch): a delivery takes one event of credit, and the
//! event's ack, nack or expiry gives it back, so a member never holds more
//! unresolved events than its prefetch, pulled or not. Resolution (acks,
//! dead letters) is the ledger's business; this state only forgets what was
//! resolved.

use std::collections::BTreeMap;
use std::time::Instant;

/// One member stream of the group on this partition.
#[derive(Debug)]
pub struct Member {
    /// The consumer id the member joined the group with.
    pub consumer: u64,
    /// Events it may still be sent.
    pub credit: u32,
    /// It was sent the end of the stream.
    pub ended: bool,
}

/// An event delivered and not yet resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub member: u64,
    /// Deliveries so far, this one included.
    pub deliveries: u32,
    pub deadline: Instant,
}

/// The runs planned for one member from one stored batch: `(first index,
/// count, deliveries)`, each contiguous with one delivery count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub member: u64,
    pub runs: Vec<(u32, u32, u32)>,
}

#[derive(Debug, Default)]
pub struct Dispatch {
    /// The next offset never looked at by the fresh path.
    pub next: u64,
    /// Offsets due again -> deliveries so far.
    pub retry: BTreeMap<u64, u32>,
    pub pending: BTreeMap<u64, Pending>,
    pub members: BTreeMap<u64, Member>,
    /// Offsets whose deliveries reached `max_deliveries` -> deliveries:
    /// waiting to be dead-lettered.
    pub dead_due: BTreeMap<u64, u32>,
    /// The member served last (round-robin).
    last: u64,
}

impl Dispatch {
    pub fn new(next: u64) -> Self {
        Dispatch {
            next,
            ..Default::default()
        }
    }

    /// Events the members may still be sent, in total.
    pub fn credit(&self) -> u64 {
        self.members.values().map(|m| u64::from(m.credit)).sum()
    }

    /// Whether `offset` is delivered and unresolved, or due again.
    pub fn is_held(&self, offset: u64) -> bool {
        self.pending.contains_key(&offset)
            || self.retry.contains_key(&offset)
            || self.dead_due.contains_key(&offset)
    }

    /// Splits one stored batch's candidates among the members with credit.
    /// `cands` are `(index, deliveries so far)`, ascending. Returns the
    /// plans and how many candidates (a prefix) were taken; the rest wait
    /// for credit.
    pub fn split(
        &mut self,
        base: u64,
        cands: &[(u32, u32)],
        deadline: Instant,
    ) -> (Vec<Planned>, usize) {
        let order: Vec<u64> = {
            let after = self.members.range(self.last + 1..).map(|(k, _)| *k);
            let before = self.members.range(..=self.last).map(|(k, _)| *k);
            after.chain(before).collect()
        };
        let mut plans = Vec::new();
        let mut taken = 0;
        for key in order {
            if taken == cands.len() {
                break;
            }
            let Some(m) = self.members.get_mut(&key) else {
                continue;
            };
            if m.credit == 0 || m.ended {
                continue;
            }
            let n = (m.credit as usize).min(cands.len() - taken);
            m.credit -= n as u32;
            let mine = &cands[taken..taken + n];
            taken += n;
            self.last = key;
            let mut runs: Vec<(u32, u32, u32)> = Vec::new();
            for &(index, before) in mine {
                let deliveries = before + 1;
                self.pending.insert(
                    base + u64::from(index),
                    Pending {
                        member: key,
                        deliveries,
                        deadline,
                    },
                );
                match runs.last_mut() {
                    Some((first, count, d)) if *first + *count == index && *d == deliveries => {
                        *count += 1
                    }
                    _ => runs.push((index, 1, deliveries)),
                }
            }
            plans.push(Planned { member: key, runs });
        }
        (plans, taken)
    }

    /// Puts an event that was not resolved back in line, or aside for the
    /// dead-letter topic once it has been delivered `max` times (0: never).
    fn requeue(&mut self, offset: u64, deliveries: u32, max: u32) {
        if max > 0 && deliveries >= max {
            self.dead_due.insert(offset, deliveries);
        } else {
            self.retry.insert(offset, deliveries);
        }
    }

    /// The events were resolved (acked or dead-lettered): forget them, and
    /// give their holders the credit back.
    pub fn resolved(&mut self, offsets: impl IntoIterator<Item = u64>) {
        for o in offsets {
            if let Some(p) = self.pending.remove(&o) {
                self.give_back(p.member);
            }
            self.retry.remove(&o);
            self.dead_due.remove(&o);
        }
    }

    fn give_back(&mut self, member: u64) {
        if let Some(m) = self.members.get_mut(&member) {
            m.credit = m.credit.saturating_add(1);
        }
    }

    /// A member gave `offset` back (nack): it goes to another member now.
    /// Returns whether it was pending.
    pub fn nack(&mut self, offset: u64, max: u32) -> bool {
        match self.pending.remove(&offset) {
            Some(p) => {
                self.give_back(p.member);
                self.requeue(offset, p.deliveries, max);
                true
            }
            None => false,
        }
    }

    /// A member stream closed: everything it held goes to the others.
    /// Returns how many events it held.
    pub fn leave(&mut self, member: u64, max: u32) -> usize {
        self.members.remove(&member);
        let held: Vec<(u64, u32)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.member == member)
            .map(|(o, p)| (*o, p.deliveries))
            .collect();
        for (o, d) in &held {
            self.pending.remove(o);
            self.requeue(*o, *d, max);
        }
        held.len()
    }

    /// Events whose visibility timeout passed go to the others. Returns how
    /// many.
    pub fn expire(&mut self, now: Instant, max: u32) -> usize {
        let due: Vec<(u64, u64, u32)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(o, p)| (*o, p.member, p.deliveries))
            .collect();
        for (o, member, d) in &due {
            self.pending.remove(o);
            self.give_back(*member);
            self.requeue(*o, *d, max);
        }
        due.len()
    }

    /// The earliest visibility deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    /// Pending events per consumer id, for describe.
    pub fn pending_by_consumer(&self) -> Vec<(u64, u64)> {
        let mut by: BTreeMap<u64, u64> = BTreeMap::new();
        for p in self.pending.values() {
            let consumer = self.members.get(&p.member).map_or(0, |m| m.consumer);
            *by.entry(consumer).or_default() += 1;
        }
        by.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn with_members(credits: &[u32]) -> Dispatch {
        let mut d = Dispatch::new(0);
        for (i, c) in credits.iter().enumerate() {
            d.members.insert(
                i as u64 + 1,
                Member {
                    consumer: 100 + i as u64,
                    credit: *c,
                    ended: false,
                },
            );
        }
        d
    }

    #[test]
    fn a_batch_is_split_into_contiguous_runs_by_credit() {
        let mut d = with_members(&[3, 3, 3]);
        let cands: Vec<(u32, u32)> = (0..10).map(|i| (i, 0)).collect();
        let (plans, taken) = d.split(50, &cands, Instant::now());
        assert_eq!(taken, 9, "credit for 9 of 10");
        let runs: Vec<_> = plans.iter().map(|p| (p.member, p.runs.clone())).collect();
        assert_eq!(
            runs,
            vec![
                (1, vec![(0, 3, 1)]),
                (2, vec![(3, 3, 1)]),
                (3, vec![(6, 3, 1)])
            ]
        );
        assert_eq!(d.credit(), 0);
        assert_eq!(d.pending.len(), 9);
        assert!(d.is_held(58) && !d.is_held(59));
        // Round-robin goes on after the member served last.
        d.members.get_mut(&1).unwrap().credit = 5;
        d.members.get_mut(&3).unwrap().credit = 5;
        let (plans, _) = d.split(60, &[(0, 0)], Instant::now());
        assert_eq!(plans[0].member, 1);
        let (plans, _) = d.split(61, &[(0, 0)], Instant::now());
        assert_eq!(plans[0].member, 3);
    }

    #[test]
    fn runs_break_at_gaps_and_at_a_new_delivery_count() {
        let mut d = with_members(&[10]);
        let (plans, taken) = d.split(0, &[(0, 0), (1, 0), (3, 0), (4, 1), (5, 1)], Instant::now());
        assert_eq!(taken, 5);
        assert_eq!(plans[0].runs, vec![(0, 2, 1), (3, 1, 1), (4, 2, 2)]);
        assert_eq!(d.pending[&5].deliveries, 2);
    }

    #[test]
    fn nack_and_stream_close_redeliver_with_count_plus_one() {
        let mut d = with_members(&[2, 2]);
        let cands: Vec<(u32, u32)> = (0..4).map(|i| (i, 0)).collect();
        d.split(0, &cands, Instant::now());
        assert!(d.nack(0, 0));
        assert!(!d.nack(0, 0), "a nack of what is not pending does nothing");
        assert_eq!(d.retry.get(&0), Some(&1));
        assert_eq!(d.leave(2, 0), 2, "member 2 held offsets 2 and 3");
        assert_eq!(d.retry.keys().copied().collect::<Vec<_>>(), vec![0, 2, 3]);
        // The retry goes out with its count raised.
        let cands: Vec<(u32, u32)> = d.retry.iter().map(|(o, c)| (*o as u32, *c)).collect();
        d.members.get_mut(&1).unwrap().credit = 3;
        let (plans, _) = d.split(0, &cands, Instant::now());
        assert_eq!(plans[0].runs, vec![(0, 1, 2), (2, 2, 2)]);
    }

    #[test]
    fn expiry_and_max_deliveries_move_events_to_the_dead_letter_queue() {
        let mut d = with_members(&[5]);
        let t0 = Instant::now();
        d.split(0, &[(0, 2), (1, 0)], t0);
        assert_eq!(d.next_deadline(), Some(t0));
        assert_eq!(d.expire(t0 + Duration::from_millis(1), 3), 2);
        assert_eq!(d.dead_due.get(&0), Some(&3), "third delivery was the last");
        assert_eq!(d.retry.get(&1), Some(&1));
        d.resolved([0, 1]);
        assert!(d.dead_due.is_empty() && d.retry.is_empty());
    }

    #[test]
    fn credit_is_the_unacked_window() {
        let mut d = with_members(&[2]);
        d.split(0, &[(0, 0), (1, 0), (2, 0)], Instant::now());
        assert_eq!(d.credit(), 0, "two unacked events fill a window of two");
        d.resolved([0]);
        assert_eq!(d.credit(), 1, "an ack frees one slot");
        d.nack(1, 0);
        assert_eq!(d.credit(), 2, "a nack frees one too");
        d.resolved([7]);
        assert_eq!(d.credit(), 2, "acking what was not pending changes nothing");
    }

    #[test]
    fn pending_is_reported_per_consumer() {
        let mut d = with_members(&[1, 2]);
        d.split(0, &[(0, 0), (1, 0), (2, 0)], Instant::now());
        assert_eq!(d.pending_by_consumer(), vec![(100, 1), (101, 2)]);
    }
}
