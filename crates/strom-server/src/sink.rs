//! Where appended batches go the moment they become visible: *sinks*.
//!
//! A reader that has caught up with a partition parks a [`BatchSink`] in
//! the partition's [`Waiters`]. When the appender makes the next batch
//! visible, it offers it to every parked sink, with no task wake-up on the
//! latency path; a sink that takes it stays parked for the next one while
//! it can take more, and is woken (leaving the list) once it cannot. The
//! partition manager knows nothing of wire frames: the native push stream
//! is one sink (`stream.rs`); a Kafka long-poll fetch or a metrics tap can
//! be others. [`Credit`] is the flow control a pushing sink uses.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strom_storage::Appended;
use tokio::sync::Notify;

/// A reader waiting for the next visible batch of one partition.
pub trait BatchSink: Send + Sync {
    /// Offers a just-visible batch. Returns `true` to be woken and
    /// unparked (its task reads on from the log, waits for credit, or
    /// answers), `false` to stay parked: it took the batch and can take
    /// the next one too.
    fn offer(&self, partition: u32, a: &Appended, meta: &Bytes) -> bool;
    /// Wakes the sink's task (after an offer it answered, or at seal,
    /// deletion and shutdown).
    fn wake(&self);
}

/// The parked sinks of one partition.
#[derive(Default)]
pub struct Waiters {
    parked: Mutex<Vec<Arc<dyn BatchSink>>>,
}

impl Waiters {
    /// Offers a just-visible batch to every parked sink; those that answer
    /// are woken and unparked.
    pub fn feed(&self, partition: u32, a: &Appended, meta: &Bytes) {
        let mut parked = self.parked.lock();
        if parked.is_empty() {
            return;
        }
        parked.retain(|p| {
            if !p.offer(partition, a, meta) {
                return true;
            }
            p.wake();
            false
        });
    }

    /// Wakes and unparks every sink.
    pub fn wake_all(&self) {
        for p in self.parked.lock().drain(..) {
            p.wake();
        }
    }

    pub fn park(&self, sink: &Arc<dyn BatchSink>) {
        self.parked.lock().push(sink.clone());
    }

    /// Takes the sink out, if the appender has not already.
    pub fn unpark(&self, sink: &Arc<dyn BatchSink>) {
        self.parked.lock().retain(|x| !Arc::ptr_eq(x, sink));
    }
}

/// Events a reader is still willing to receive.
pub struct Credit {
    avail: AtomicI64,
    notify: Notify,
}

impl Credit {
    pub fn new(initial: u32) -> Arc<Self> {
        Arc::new(Credit {
            avail: AtomicI64::new(initial as i64),
            notify: Notify::new(),
        })
    }

    pub fn grant(&self, events: u32) {
        self.avail.fetch_add(events as i64, Ordering::AcqRel);
        self.notify.notify_one();
    }

    /// Uses up credit for `events` delivered events (it may go negative:
    /// whole batches are delivered).
    pub fn take(&self, events: u32) {
        self.avail.fetch_sub(events as i64, Ordering::AcqRel);
    }

    /// Takes every event of credit granted so far (none if it is negative).
    pub fn take_all(&self) -> u32 {
        self.avail
            .swap(0, Ordering::AcqRel)
            .clamp(0, u32::MAX as i64) as u32
    }

    pub fn has(&self) -> bool {
        self.avail.load(Ordering::Acquire) > 0
    }

    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.has() {
                return;
            }
            notified.await;
        }
    }
}
