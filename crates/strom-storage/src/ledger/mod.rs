//! The durable ack ledger of one shared consumer group on one partition.
//!
//! A shared group (a work queue) hands each event of a partition to one
//! member; members ack events one by one, out of order. The partition's owner
//! keeps, per (group, partition), a ledger: the *floor* (the lowest offset
//! not yet resolved), the offsets resolved above it, delivery counts and
//! dead-lettered offsets. An offset is *resolved* once it is acked or
//! dead-lettered; the floor advances over contiguous resolved offsets and
//! everything below it is pruned. A restart must redeliver exactly the
//! unresolved offsets: nothing acked comes back, nothing unacked is lost.
//!
//! [`ShareLedger`] is that state, pure (no I/O). [`LedgerFile`] persists it
//! as an append-only file of [`LedgerRecord`]s framed by [`crate::record`]
//! (magic `"STRC"`), compacted into one [`LedgerRecord::Snapshot`] when it
//! grows. `spec` is the group's opaque spec bytes: storage never parses it.
//! The layout is documented in `docs/on-disk-format.md` ("Shared-group
//! ledger").

mod codec;
mod file;
mod state;

pub use file::LedgerFile;
pub use state::ShareLedger;

use std::path::{Path, PathBuf};

/// Where the ledger of group `group` lives in a partition directory:
/// `groups/<group>.ledger`. The name is checked first ([`crate::check_name`]),
/// so no name, however it arrived, makes a path outside `partition_dir`.
pub fn ledger_path(partition_dir: &Path, group: &str) -> crate::Result<PathBuf> {
    crate::check_name("consumer group", group)?;
    Ok(partition_dir.join("groups").join(format!("{group}.ledger")))
}

/// The largest `spec` a `Start` or `Snapshot` record carries.
pub const MAX_SPEC: usize = 64 << 10;

/// One dead-lettered offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub deliveries: u32,
    pub dlq_partition: u32,
    pub dlq_offset: u64,
}

/// One change to a ledger, as appended to its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerRecord {
    /// First record of a new file: where the group starts and its opaque
    /// spec bytes (at most [`MAX_SPEC`]).
    Start {
        floor: u64,
        spec: Vec<u8>,
    },
    /// Offsets acked: ranges (first, count).
    Acked(Vec<(u64, u32)>),
    /// Delivery counts reached (only counts >= 2 need recording):
    /// (offset, deliveries).
    Redelivered(Vec<(u64, u32)>),
    /// High-water mark of dispatch.
    Dispatched(u64),
    DeadLettered {
        offset: u64,
        letter: DeadLetter,
    },
    /// Whole state (written first after compaction).
    Snapshot(Box<LedgerSnapshot>),
}

/// The whole state of a ledger: what [`ShareLedger::snapshot`] returns and
/// a `Snapshot` record holds. Everything listed is above the floor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    pub floor: u64,
    pub dispatched: u64,
    pub spec: Vec<u8>,
    /// Acked ranges `[first, end)`, sorted and disjoint.
    pub acked: Vec<(u64, u64)>,
    /// Recorded delivery counts of unresolved offsets, sorted by offset.
    pub deliveries: Vec<(u64, u32)>,
    /// Dead-lettered offsets, sorted.
    pub dead: Vec<(u64, DeadLetter)>,
    pub acked_total: u64,
    pub redelivered_total: u64,
    pub dead_total: u64,
}
