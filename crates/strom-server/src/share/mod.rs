//! Shared consumer groups on the partition owner (docs/consumer-groups.md):
//! any member may get any event, each event goes to one member at a time,
//! and each is acked on its own.
//!
//! One [`ShareCursor`] per (group, partition) holds
//! - the *ledger* (strom-storage): the floor (lowest unresolved offset),
//!   what is acked or dead-lettered above it, delivery counts; persisted in
//!   `groups/<group>.ledger` in the partition directory for file
//!   partitions, so a restart redelivers exactly the unresolved events;
//! - the *dispatch* state ([`dispatch::Dispatch`], volatile): member
//!   streams with their credit, pending events with their visibility
//!   deadline, events due again.
//!
//! Its task (`run.rs`) pushes `Deliver` frames ahead of demand within each
//! member's credit, redelivers what expired or what a departed member
//! held, dead-letters what reached `max_deliveries` (`dlq.rs`), and ends
//! every member's stream once the partition is sealed and every event is
//! resolved. Acks are group-committed: one ledger write and one fdatasync
//! for every ack that arrived meanwhile (`acks.rs`).
//!
//! Lock order: `state` before `ledger`; neither is held across I/O or an
//! await, except that the ack flusher holds `file` (only it does) across
//! its write.

mod acks;
pub mod dispatch;
mod dlq;
mod run;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use strom_proto::{
    ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, GroupPartitionInfo, PartitionStatus, StartPos,
};
use strom_storage::ledger::ledger_path;
use strom_storage::{LedgerFile, ShareLedger};
use tokio::sync::Notify;

use crate::error::ServerError;
use crate::partition::{Lookup, PartitionManager};
use dispatch::{Dispatch, Member};

pub use acks::AckQueue;

/// Where a member stream's pushes go: the front end that serves the
/// member encodes and sends them (the native one as `Push` frames on the
/// member's connection). A push must not wait: credit bounds what a member
/// can have queued.
pub trait MemberOut: Send + Sync {
    fn push(&self, p: &strom_proto::Push);
}

/// Unique keys of member streams (across connections).
static NEXT_MEMBER: AtomicU64 = AtomicU64::new(1);

pub struct ShareCursor {
    pub spec: ConsumerGroupSpec,
    pm: Weak<PartitionManager>,
    /// This cursor (its task acks quarantined ranges through it).
    me: Weak<ShareCursor>,
    /// Reaches the dead-letter topic's partitions.
    host: Weak<dyn Lookup>,
    state: Mutex<Dispatch>,
    ledger: Mutex<ShareLedger>,
    /// `None` for memory partitions (state in memory only).
    file: Mutex<Option<LedgerFile>>,
    acks: Mutex<AckQueue>,
    outs: Mutex<HashMap<u64, Arc<dyn MemberOut>>>,
    /// Offsets below this were dispatched before the cursor was opened
    /// (ledger `Dispatched`): each counts as delivered at least once.
    opened_dispatched: u64,
    wake: Notify,
    /// The group was deleted: member streams end with an error.
    stopped: AtomicBool,
    /// The partition closed (server shutdown): the task ends quietly, and
    /// members, whose connections close too, subscribe again elsewhere.
    closed: AtomicBool,
    /// fdatasync each ack flush (the topic's durability is `always`).
    sync_acks: bool,
}

/// A member stream's place in a cursor; leaves it when dropped (the
/// stream was unsubscribed, or its connection closed).
pub struct MemberGuard {
    cursor: Arc<ShareCursor>,
    key: u64,
}

impl Drop for MemberGuard {
    fn drop(&mut self) {
        self.cursor.leave(self.key);
    }
}

impl MemberGuard {
    pub fn grant(&self, events: u32) {
        self.cursor.grant(self.key, events);
    }
}

impl ShareCursor {
    /// Opens (recovering its ledger) or creates the cursor of `spec` on `pm`,
    /// and starts its task. Must run inside the runtime.
    pub(crate) fn open(
        pm: &Arc<PartitionManager>,
        spec: ConsumerGroupSpec,
        host: Weak<dyn Lookup>,
    ) -> Result<Arc<Self>, ServerError> {
        let start = match spec.start {
            StartPos::End => pm.next_offset(),
            StartPos::Timestamp(t) => pm.offset_for_timestamp(t),
            _ => pm.first_offset(),
        };
        let spec_bytes = serde_json::to_vec(&spec).unwrap_or_default();
        let (file, mut ledger) = match pm.dir() {
            Some(dir) => {
                let path = ledger_path(dir, &spec.name)?;
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        ServerError::coded(
                            ErrorCode::STORAGE_IO,
                            format!("cannot create {}: {e}", parent.display()),
                        )
                    })?;
                }
                let (f, l) = LedgerFile::open_real(&path, || (start, spec_bytes))?;
                (Some(f), l)
            }
            None => (None, ShareLedger::new(start, spec_bytes)),
        };
        let skipped = ledger.raise_floor(pm.first_offset());
        if skipped > 0 {
            tracing::warn!(topic = %pm.topic, partition = pm.id, group = %spec.name, skipped, "retention dropped events the group had not resolved");
        }
        let floor = ledger.floor();
        let opened_dispatched = ledger.dispatched();
        let cursor = Arc::new_cyclic(|me| ShareCursor {
            me: me.clone(),
            spec,
            pm: Arc::downgrade(pm),
            host,
            state: Mutex::new(Dispatch::new(floor)),
            ledger: Mutex::new(ledger),
            file: Mutex::new(file),
            acks: Mutex::new(AckQueue::default()),
            outs: Mutex::new(HashMap::new()),
            opened_dispatched,
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            sync_acks: pm.durability == strom_proto::Durability::Always,
        });
        pm.consumer_at(&cursor.spec.name, floor);
        tokio::spawn(run::run(cursor.clone()));
        Ok(cursor)
    }

    pub fn floor(&self) -> u64 {
        self.ledger.lock().floor()
    }

    /// Adds a member stream with `credit` events of prefetch.
    pub fn join(
        self: &Arc<Self>,
        consumer: u64,
        credit: u32,
        out: Arc<dyn MemberOut>,
    ) -> MemberGuard {
        let key = NEXT_MEMBER.fetch_add(1, Ordering::Relaxed);
        self.outs.lock().insert(key, out);
        self.state.lock().members.insert(
            key,
            Member {
                consumer,
                credit,
                ended: false,
            },
        );
        self.wake.notify_one();
        MemberGuard {
            cursor: self.clone(),
            key,
        }
    }

    fn grant(&self, key: u64, events: u32) {
        if let Some(m) = self.state.lock().members.get_mut(&key) {
            m.credit = m.credit.saturating_add(events);
        }
        self.wake.notify_one();
    }

    fn leave(&self, key: u64) {
        let held = self.state.lock().leave(key, self.spec.max_deliveries);
        self.outs.lock().remove(&key);
        if held > 0 {
            tracing::debug!(group = %self.spec.name, held, "a member left; its events go to the others");
        }
        self.wake.notify_one();
    }

    /// Ends the task quietly (the partition closes).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Stops the task and ends the member streams (the group was deleted).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Deletes the ledger file (the group was deleted).
    pub fn remove_file(&self) -> Result<(), ServerError> {
        self.stop();
        if let Some(f) = self.file.lock().take() {
            f.remove()?;
        }
        Ok(())
    }

    /// The group's state on this partition, for describe.
    pub fn info(&self, pm: &PartitionManager, member: u32) -> GroupPartitionInfo {
        let (pending, by_consumer) = {
            let st = self.state.lock();
            (st.pending.len() as u64, st.pending_by_consumer())
        };
        let l = self.ledger.lock();
        GroupPartitionInfo {
            partition: pm.id,
            member,
            holder: None,
            committed: l.floor(),
            next_offset: pm.next_offset(),
            pending,
            acked_above: l.resolved_above_floor(),
            redelivered: l.redelivered_total(),
            dead_lettered: l.dead_total(),
            pending_by_consumer: by_consumer,
            status: PartitionStatus::Ok,
        }
    }
}

/// Opens the shared cursor of `spec` on `pm` (in its slot's `shares`),
/// checking that the spec names this partition's topic.
pub fn cursor(
    shares: &Cursors,
    pm: &Arc<PartitionManager>,
    spec: &ConsumerGroupSpec,
    host: Weak<dyn Lookup>,
) -> Result<Arc<ShareCursor>, ServerError> {
    if spec.topic != pm.topic || spec.mode != ConsumerGroupMode::Shared {
        return Err(ServerError::coded(
            ErrorCode::CONSUMER_GROUP_MISMATCH,
            format!(
                "consumer group '{}' is a {} group of topic '{}'; this is a shared stream of topic '{}'",
                spec.name,
                spec.mode.as_str(),
                spec.topic,
                pm.topic
            ),
        ));
    }
    shares.get_or_open(pm, spec, host)
}

/// The shared cursors of one partition, by group name.
#[derive(Default)]
pub struct Cursors {
    map: Mutex<HashMap<String, Arc<ShareCursor>>>,
}

impl Cursors {
    /// The cursor of `spec.name`, opened on first use.
    pub fn get_or_open(
        &self,
        pm: &Arc<PartitionManager>,
        spec: &ConsumerGroupSpec,
        host: Weak<dyn Lookup>,
    ) -> Result<Arc<ShareCursor>, ServerError> {
        let mut map = self.map.lock();
        if let Some(c) = map.get(&spec.name) {
            return Ok(c.clone());
        }
        let c = ShareCursor::open(pm, spec.clone(), host)?;
        map.insert(spec.name.clone(), c.clone());
        Ok(c)
    }

    pub fn get(&self, group: &str) -> Option<Arc<ShareCursor>> {
        self.map.lock().get(group).cloned()
    }

    /// Every open cursor with its group name, sorted by name.
    pub fn all(&self) -> Vec<(String, Arc<ShareCursor>)> {
        let mut all: Vec<_> = self
            .map
            .lock()
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Forgets a group, deleting its ledger.
    pub fn drop_group(&self, pm: &PartitionManager, group: &str) -> Result<(), ServerError> {
        let cursor = self.map.lock().remove(group);
        match cursor {
            Some(c) => c.remove_file(),
            None => {
                if let Some(dir) = pm.dir() {
                    let path = ledger_path(dir, group)?;
                    if path.exists() {
                        std::fs::remove_file(&path).map_err(|e| {
                            ServerError::coded(
                                ErrorCode::STORAGE_IO,
                                format!("cannot remove {}: {e}", path.display()),
                            )
                        })?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Ends every cursor's task (the partition closes or is deleted; a
    /// deleted topic is reported to the members by the task itself).
    pub fn close_all(&self) {
        for c in self.map.lock().values() {
            c.close();
        }
    }
}
