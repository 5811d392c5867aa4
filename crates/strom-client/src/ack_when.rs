//! Acks that follow results: [`Event::ack_when`] acks a consumed event
//! once the pushes of its results are stored, without anyone waiting. A
//! worker that acks a task only when its result is safe then needs no
//! polling loop: its `for event in consumer` loop pulls the next task while
//! earlier results are still in flight, and each ack frees its place in
//! the consumer's window (a shared group's `prefetch`) by itself.
//!
//! Each result's batch slot wakes a [`Watch`] when it completes, on the
//! thread that completed it; the last one to settle acks the event (every
//! push stored) or gives it back (a push failed: shared groups deliver it
//! again now; other consumers leave it unacked).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::event::{Event, LaterAck};
use crate::push::{BatchAck, PushFuture};
use crate::slot::Slot;

/// One event's ack, waiting for its results.
struct Pending {
    ack: LaterAck,
    left: AtomicUsize,
    failed: AtomicBool,
}

impl Pending {
    fn settle(&self, ok: bool) {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The ack (or nack) goes on in the background; a nack that
            // the consumer refuses (not a shared group) changes nothing.
            if self.failed.load(Ordering::Acquire) {
                drop(self.ack.nack());
            } else {
                drop(self.ack.ack());
            }
        }
    }
}

/// One result's slot, watched for the [`Pending`] ack.
struct Watch {
    pending: Arc<Pending>,
    slot: Arc<Slot<BatchAck>>,
    settled: AtomicBool,
}

impl Watch {
    /// Settles the pending ack if the slot is done; otherwise registers
    /// itself to be woken when it is.
    fn check(self: &Arc<Self>) {
        let waker = Waker::from(self.clone());
        if let Poll::Ready(r) = self.slot.poll(&mut Context::from_waker(&waker)) {
            if !self.settled.swap(true, Ordering::AcqRel) {
                self.pending.settle(r.is_ok());
            }
        }
    }
}

impl Wake for Watch {
    fn wake(self: Arc<Self>) {
        self.check();
    }
}

impl Event {
    /// Acks this event once every push in `results` is stored, and returns
    /// at once. With no results it acks now. If a result's push fails the
    /// event is not acked: a shared group's member gives it back for
    /// another delivery, other consumers leave it for a restart to read
    /// again (unless a later ack of the partition covers it).
    pub fn ack_when<'a>(&self, results: impl IntoIterator<Item = &'a PushFuture>) {
        let slots: Vec<Arc<Slot<BatchAck>>> = results.into_iter().map(|f| f.slot.clone()).collect();
        let pending = Arc::new(Pending {
            ack: self.ack_later(),
            left: AtomicUsize::new(slots.len() + 1),
            failed: AtomicBool::new(false),
        });
        for slot in slots {
            let watch = Arc::new(Watch {
                pending: pending.clone(),
                slot,
                settled: AtomicBool::new(false),
            });
            watch.check();
        }
        // The event's own share: no result can ack before every watch is set.
        pending.settle(true);
    }
}
