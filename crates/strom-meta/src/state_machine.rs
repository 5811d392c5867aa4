//! The state machine side of Raft: the [`Machine`] trait the registry
//! implements, and openraft's [`RaftStateMachine`] over it. It keeps the
//! applied log id and the membership next to the machine, builds snapshots
//! from [`Machine::snapshot`], installs received ones with
//! [`Machine::restore`], and keeps the latest snapshot durable in
//! `sm.snapshot` (one CRC'd record, replaced atomically), which is where a
//! restarting member's machine starts before Raft replays the committed
//! log after it. The id of the snapshot on disk is published on a watch
//! ([`MachineStore::durable_snapshot`]) so the log store never purges past
//! it.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strom_storage::record;
use strom_storage::vfs::Vfs;
use tokio::sync::watch;

use crate::codec::{from_json, to_json};
use crate::error::LogError;
use crate::files;
use crate::log_store::storage_error;
use crate::types::{
    Blob, Entry, LogId, Reply, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

/// The snapshot file's name in the member's directory.
pub const SNAPSHOT: &str = "sm.snapshot";
/// Its magic (framing: `strom_storage::record`, one record).
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"STRP";

/// A deterministic state machine fed by the Raft log: every replica
/// applies the same commands in the same order and must end in the same
/// state with the same answers.
pub trait Machine: Send + Sync + 'static {
    /// Applies one command. An `Err` is a refusal: it must leave the state
    /// unchanged, and it is returned to the proposer.
    fn apply(&mut self, cmd: &[u8]) -> Result<Vec<u8>, String>;
    /// The whole state, encoded.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with one from [`Machine::snapshot`].
    fn restore(&mut self, snap: &[u8]) -> Result<(), String>;
}

/// What `sm.snapshot` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Blob,
}

/// Stops a store's snapshot writes: no save that starts after
/// [`SnapshotCloser::close`] writes anything (one already writing ends its
/// write; it is not waited for, since a failed disk may never finish it).
pub struct SnapshotCloser(Arc<SnapshotSlot>);

impl SnapshotCloser {
    pub fn close(&self) {
        self.0
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The latest snapshot, in memory and on disk.
struct SnapshotSlot {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    current: Mutex<Option<StoredSnapshot>>,
    /// The last log id the snapshot on disk covers.
    durable: watch::Sender<Option<LogId>>,
    /// The member stopped: no snapshot is written any more (openraft does
    /// not wait for a snapshot it is building when it shuts down).
    closed: std::sync::atomic::AtomicBool,
}

impl SnapshotSlot {
    /// Makes `snap` the current snapshot, durably, unless a newer one is.
    fn save(&self, snap: StoredSnapshot) -> Result<(), LogError> {
        let mut current = self.current.lock();
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        if current
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > snap.meta.last_log_id)
        {
            return Ok(());
        }
        let payload = to_json(&snap).map_err(LogError::Broken)?;
        if payload.len() > u32::MAX as usize {
            return Err(LogError::TooLarge(payload.len()));
        }
        let index = snap.meta.last_log_id.map_or(0, |l| l.index);
        let header = record::file_header(SNAPSHOT_MAGIC);
        let rec = record::encode(index, &payload);
        files::replace(&*self.vfs, &self.dir, SNAPSHOT, &[&header, &rec]).map_err(|(e, _)| e)?;
        tracing::debug!(index, bytes = payload.len(), "metadata snapshot saved");
        let last = snap.meta.last_log_id;
        *current = Some(snap);
        self.durable.send_if_modified(|d| {
            let newer = last > *d;
            if newer {
                *d = last;
            }
            newer
        });
        Ok(())
    }
}

/// Reads `sm.snapshot`, if there is one.
fn load_snapshot(vfs: &dyn Vfs, dir: &Path) -> Result<Option<StoredSnapshot>, LogError> {
    files::remove_if_exists(vfs, &dir.join(format!("{SNAPSHOT}.tmp")))?;
    let path = dir.join(SNAPSHOT);
    let Some(buf) = files::read_all(vfs, &path)? else {
        return Ok(None);
    };
    let rec = record::decode_snapshot(&buf, SNAPSHOT_MAGIC, "metadata snapshot")
        .map_err(|d| LogError::corrupt(&path, d.at, d.reason))?;
    let snap: StoredSnapshot = from_json(rec.payload, "a metadata snapshot")
        .map_err(|e| LogError::corrupt(&path, rec.at, e.to_string()))?;
    Ok(Some(snap))
}

/// openraft's state machine storage over a [`Machine`].
pub struct MachineStore<M: Machine> {
    machine: Arc<Mutex<M>>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    slot: Arc<SnapshotSlot>,
    builds: u64,
}

impl<M: Machine> MachineStore<M> {
    /// Opens the store in `dir`: the machine starts from `sm.snapshot`, if any.
    pub fn open(vfs: Arc<dyn Vfs>, dir: &Path, machine: M) -> Result<Self, LogError> {
        let snap = load_snapshot(&*vfs, dir)?;
        let on_disk = snap.as_ref().and_then(|s| s.meta.last_log_id);
        let mut store = MachineStore {
            machine: Arc::new(Mutex::new(machine)),
            last_applied: None,
            membership: StoredMembership::default(),
            slot: Arc::new(SnapshotSlot {
                vfs,
                dir: dir.to_path_buf(),
                current: Mutex::new(None),
                closed: std::sync::atomic::AtomicBool::new(false),
                durable: watch::Sender::new(on_disk),
            }),
            builds: 0,
        };
        if let Some(snap) = snap {
            store.machine.lock().restore(&snap.data.0).map_err(|why| {
                LogError::corrupt(
                    &dir.join(SNAPSHOT),
                    0,
                    format!("the snapshot does not restore: {why}"),
                )
            })?;
            store.last_applied = snap.meta.last_log_id;
            store.membership = snap.meta.last_membership.clone();
            tracing::info!(index = ?store.last_applied.map(|l| l.index), "metadata state restored from its snapshot");
            *store.slot.current.lock() = Some(snap);
        }
        Ok(store)
    }

    /// Watches the last log id the snapshot on disk covers (`None` while
    /// there is none); it only grows.
    pub fn durable_snapshot(&self) -> watch::Receiver<Option<LogId>> {
        self.slot.durable.subscribe()
    }

    /// What stops this store's snapshot writes once the member stops.
    pub fn closer(&self) -> SnapshotCloser {
        SnapshotCloser(self.slot.clone())
    }

    /// The machine, shared with readers.
    pub fn machine(&self) -> Arc<Mutex<M>> {
        self.machine.clone()
    }

    fn apply_one(&mut self, entry: Entry) -> Reply {
        self.last_applied = Some(entry.log_id);
        match entry.payload {
            EntryPayload::Blank => Reply(Ok(Blob::default())),
            EntryPayload::Normal(cmd) => Reply(self.machine.lock().apply(&cmd.0).map(Blob)),
            EntryPayload::Membership(m) => {
                self.membership = StoredMembership::new(Some(entry.log_id), m);
                Reply(Ok(Blob::default()))
            }
        }
    }
}

/// Builds a snapshot captured when Raft asked for a builder.
pub struct SnapshotBuilder {
    slot: Arc<SnapshotSlot>,
    snap: StoredSnapshot,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let snap = self.snap.clone();
        self.slot
            .save(snap.clone())
            .map_err(|e| storage_error(ErrorSubject::StateMachine, ErrorVerb::Write, &e))?;
        Ok(Snapshot {
            meta: snap.meta,
            snapshot: Box::new(Cursor::new(snap.data.0)),
        })
    }
}

impl<M: Machine> RaftStateMachine<TypeConfig> for MachineStore<M> {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        Ok(entries.into_iter().map(|e| self.apply_one(e)).collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.builds += 1;
        let last = self.last_applied;
        let snapshot_id = format!(
            "{}-{}-{}",
            last.map_or(0, |l| l.leader_id.term),
            last.map_or(0, |l| l.index),
            self.builds
        );
        let data = Blob(self.machine.lock().snapshot());
        SnapshotBuilder {
            slot: self.slot.clone(),
            snap: StoredSnapshot {
                meta: SnapshotMeta {
                    last_log_id: last,
                    last_membership: self.membership.clone(),
                    snapshot_id,
                },
                data,
            },
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let sig = Some(meta.signature());
        self.machine.lock().restore(&data).map_err(|why| {
            let e = LogError::Broken(format!("a received snapshot does not restore: {why}"));
            storage_error(ErrorSubject::Snapshot(sig.clone()), ErrorVerb::Read, &e)
        })?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        tracing::info!(index = ?meta.last_log_id.map(|l| l.index), bytes = data.len(), "metadata snapshot installed");
        let snap = StoredSnapshot {
            meta: meta.clone(),
            data: Blob(data),
        };
        self.slot
            .save(snap)
            .map_err(|e| storage_error(ErrorSubject::Snapshot(sig), ErrorVerb::Write, &e))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.slot.current.lock().clone().map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data.0)),
        }))
    }
}
