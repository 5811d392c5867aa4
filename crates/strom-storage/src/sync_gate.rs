//! The sync gate: makes `FileLog::sync(token)` idempotent and safe to call
//! from several threads (the partition's syncer, the interval thread, seal
//! and shutdown). It tracks the durable watermark, so a token already
//! durable costs nothing, and callers covered by an in-progress fdatasync
//! wait for it instead of issuing their own.
//!
//! It is not the group-commit *policy*: which appends wait for which sync
//! before they are acknowledged is decided by the server's partition
//! syncer, because with replication "durable" becomes "durable on the
//! in-sync replicas", a rule that belongs above storage.

use parking_lot::{Condvar, Mutex};

use crate::Result;

#[derive(Default)]
struct State {
    /// Every token <= this is durable.
    durable: u64,
    /// A sync is running on some thread.
    in_progress: bool,
}

#[derive(Default)]
pub(crate) struct SyncGate {
    state: Mutex<State>,
    done: Condvar,
}

impl SyncGate {
    /// Returns once `token` is durable. `written` reports the highest token
    /// handed out so far; `do_sync` makes everything written so far durable.
    pub(crate) fn sync(
        &self,
        token: u64,
        written: impl Fn() -> u64,
        do_sync: impl Fn() -> Result<()>,
    ) -> Result<()> {
        let mut g = self.state.lock();
        loop {
            if g.durable >= token {
                return Ok(());
            }
            if !g.in_progress {
                break;
            }
            self.done.wait(&mut g);
        }
        g.in_progress = true;
        // Read the target before syncing: everything up to it is covered.
        let target = written();
        drop(g);
        let res = do_sync();
        let mut g = self.state.lock();
        g.in_progress = false;
        if res.is_ok() {
            g.durable = g.durable.max(target);
        }
        self.done.notify_all();
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn concurrent_callers_share_syncs() {
        let gc = Arc::new(SyncGate::default());
        let written = Arc::new(AtomicU64::new(0));
        let syncs = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gc, written, syncs) = (gc.clone(), written.clone(), syncs.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        let t = written.fetch_add(1, Ordering::SeqCst) + 1;
                        gc.sync(
                            t,
                            || written.load(Ordering::SeqCst),
                            || {
                                syncs.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                Ok(())
                            },
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(syncs.load(Ordering::SeqCst) < 800, "no sync was shared");
        assert_eq!(gc.state.lock().durable, 800);
    }
}
