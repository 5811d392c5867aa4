//! Priorities (docs/quotas.md, "Priorities"): weighted fair queueing of
//! a server's appends and data reads. At most `SLOTS` of them run at once;
//! the others wait in a queue ordered by start-time fair queueing: each
//! class (a principal or topic key with a priority) gets a virtual start
//! tag `max(now, its last finish)` and finish tag `start + bytes / weight`,
//! and the waiting operation with the smallest start tag goes next. Under
//! contention each class gets a share of the slots' time in proportion to
//! its weight; without contention nothing waits.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Operations that run at once while priorities are in force.
pub const SLOTS: usize = 2;
/// Classes remembered before the idle ones are dropped.
const MAX_CLASSES: usize = 4096;

#[derive(Default)]
struct State {
    busy: usize,
    /// The start tag of the operation last let through.
    vtime: f64,
    /// Each class's last finish tag.
    finish: HashMap<String, f64>,
    /// Waiting operations by (start tag, arrival).
    queue: BTreeMap<(u64, u64), oneshot::Sender<()>>,
    seq: u64,
}

/// The scheduler of one server.
#[derive(Default)]
pub struct Fair {
    state: Mutex<State>,
}

/// A running operation's slot; dropping it lets the next one run. It
/// owns its scheduler's handle, so a reply that outlives the caller (an
/// append answered from the partition's thread) can hold it.
pub struct OwnedSlot(std::sync::Arc<Fair>);

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Fair {
    /// Waits for a slot for an operation of `class` at `weight` moving
    /// `bytes`.
    pub async fn admit(
        self: &std::sync::Arc<Self>,
        class: &str,
        weight: u64,
        bytes: u64,
    ) -> OwnedSlot {
        let wait = {
            let mut s = self.state.lock();
            let last = s.finish.get(class).copied().unwrap_or(0.0);
            let start = s.vtime.max(last);
            let cost = bytes.max(1) as f64 / weight.max(1) as f64;
            if s.finish.len() >= MAX_CLASSES {
                let vtime = s.vtime;
                s.finish.retain(|_, f| *f > vtime);
            }
            s.finish.insert(class.to_string(), start + cost);
            if s.busy < SLOTS && s.queue.is_empty() {
                s.busy += 1;
                s.vtime = start;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                s.seq += 1;
                let key = (start.to_bits(), s.seq);
                s.queue.insert(key, tx);
                Some(rx)
            }
        };
        if let Some(rx) = wait {
            // The sender is only dropped after it sent (release), or with
            // the scheduler itself.
            let _ = rx.await;
        }
        OwnedSlot(self.clone())
    }

    /// Frees a slot and lets the waiting operation with the smallest start
    /// tag run (a waiter that gave up is skipped).
    fn release(&self) {
        let mut s = self.state.lock();
        s.busy = s.busy.saturating_sub(1);
        while let Some(((start, _), tx)) = s.queue.pop_first() {
            if tx.send(()).is_ok() {
                s.busy += 1;
                s.vtime = s.vtime.max(f64::from_bits(start));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn under_contention_the_heavier_class_goes_first_in_proportion() {
        let f = Arc::new(Fair::default());
        // Fill every slot, then queue 10 ops of each class.
        let held: Vec<_> = futures_held(&f, SLOTS).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..10 {
            for (class, weight) in [("bulk", 1), ("urgent", 4)] {
                let (g, order) = (f.clone(), order.clone());
                tasks.push(tokio::spawn(async move {
                    let _s = g.admit(class, weight, 1000).await;
                    order.lock().push(class);
                }));
                // Each waits in the queue before the next arrives.
                let queued = 2 * i + if class == "bulk" { 1 } else { 2 };
                while f.state.lock().queue.len() < queued {
                    tokio::task::yield_now().await;
                }
            }
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock();
        let urgent_first_10 = order[..10].iter().filter(|c| **c == "urgent").count();
        assert!(urgent_first_10 >= 7, "{order:?}");
    }

    async fn futures_held(f: &Arc<Fair>, n: usize) -> Vec<OwnedSlot> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(f.admit("filler", 1, 1).await);
        }
        v
    }
}
