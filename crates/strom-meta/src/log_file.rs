//! The durable Raft log of one member: `raft.log` in its data directory,
//! a `strom_storage::RecordFile` (framing: `strom_storage::record`, CRC
//! per record; JSON payloads). Every change is a
//! record: the vote, the committed log id, purges, truncations and the
//! entries themselves. Replaying the records in order rebuilds
//! [`Durable`], the in-memory view Raft reads from.
//!
//! When a record counts: the vote, entries, purges and truncations are
//! fdatasync'ed before the call returns (Raft acknowledges nothing it has
//! not made durable); the committed id is written without a sync (Raft
//! does not need it durable; the next synced record carries it along).
//! When the file holds many more records than live entries, it is
//! rewritten (temp file, fdatasync, rename, directory fsync) with the
//! current state alone.
//!
//! Recovery: a damaged last record (a crash during an append) is truncated
//! away with a warning. Damage followed by a valid record, a record that
//! does not decode, or one that breaks the log's sequence is `CORRUPT`,
//! naming the file and the byte offset. Nothing read can panic or size an
//! allocation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strom_storage::vfs::Vfs;
use strom_storage::{Codec, Format, RecordFile};

use crate::codec::{from_json, to_json};
use crate::error::LogError;
use crate::files;
use crate::types::{Entry, LogId, Vote};

/// The log file's name in the member's directory.
pub const LOG: &str = "raft.log";
/// Its magic (framing: `strom_storage::record`).
pub const LOG_MAGIC: [u8; 4] = *b"STRR";
const FORMAT: Format = Format {
    magic: LOG_MAGIC,
    version: strom_storage::record::VERSION,
    what: "Raft log",
};
/// Records beyond twice the live entries before the file is rewritten.
const COMPACT_SLACK: u64 = 1024;

/// One change to the durable log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LogRecord {
    Vote(Vote),
    Committed(Option<LogId>),
    /// Entries up to and including this id are gone (in a snapshot).
    Purged(LogId),
    /// Entries from this index on are gone (a new leader overwrote them).
    Truncated(u64),
    Entry(Entry),
}

/// What the records add up to.
#[derive(Debug, Default)]
pub struct Durable {
    pub vote: Option<Vote>,
    pub committed: Option<LogId>,
    pub purged: Option<LogId>,
    pub entries: BTreeMap<u64, Entry>,
    /// The index the next entry must have.
    next_index: u64,
}

impl Durable {
    /// The last entry's id, or the purged id when no entry is left.
    pub fn last_log_id(&self) -> Option<LogId> {
        match self.entries.last_key_value() {
            Some((_, e)) => Some(e.log_id),
            None => self.purged,
        }
    }

    /// Checks that `recs` can follow the current state (entries in sequence).
    fn check(&self, recs: &[LogRecord]) -> Result<(), String> {
        let mut next = self.next_index;
        for rec in recs {
            match rec {
                LogRecord::Entry(e) if e.log_id.index != next => {
                    return Err(format!(
                        "entry {} where entry {next} was expected",
                        e.log_id.index
                    ))
                }
                LogRecord::Entry(_) => next = next.saturating_add(1),
                LogRecord::Purged(id) => next = next.max(id.index.saturating_add(1)),
                LogRecord::Truncated(since) => next = *since,
                LogRecord::Vote(_) | LogRecord::Committed(_) => {}
            }
        }
        Ok(())
    }

    fn apply(&mut self, rec: LogRecord) {
        match rec {
            LogRecord::Vote(v) => self.vote = Some(v),
            LogRecord::Committed(c) => self.committed = c,
            LogRecord::Purged(id) => {
                let after = id.index.saturating_add(1);
                self.entries = self.entries.split_off(&after);
                self.next_index = self.next_index.max(after);
                self.purged = Some(id);
            }
            LogRecord::Truncated(since) => {
                self.entries.split_off(&since);
                self.next_index = since;
            }
            LogRecord::Entry(e) => {
                self.next_index = e.log_id.index.saturating_add(1);
                self.entries.insert(e.log_id.index, e);
            }
        }
    }

    /// The records that rebuild this state in a fresh file.
    fn as_records(&self) -> Vec<LogRecord> {
        let mut recs = Vec::with_capacity(self.entries.len() + 3);
        recs.extend(self.vote.map(LogRecord::Vote));
        recs.extend(self.purged.map(LogRecord::Purged));
        let after_purge = self.purged.map_or(0, |p| p.index.saturating_add(1));
        if self.entries.is_empty() && self.next_index != after_purge {
            recs.push(LogRecord::Truncated(self.next_index));
        }
        recs.extend(self.entries.values().cloned().map(LogRecord::Entry));
        recs.push(LogRecord::Committed(self.committed));
        recs
    }
}

/// [`LogRecord`]s as JSON payloads.
pub struct LogCodec;

impl Codec for LogCodec {
    type Record = LogRecord;
    fn encode(&self, rec: &LogRecord) -> Result<Vec<u8>, String> {
        to_json(rec)
    }
    fn decode(&self, payload: &[u8]) -> Result<LogRecord, String> {
        from_json(payload, "a Raft log record").map_err(|e| e.to_string())
    }
}

/// The open log file and the state it holds.
pub struct LogFile {
    dir: PathBuf,
    file: RecordFile<LogCodec>,
    state: Arc<Mutex<Durable>>,
}

impl LogFile {
    /// Opens (or creates) the log in `dir` and replays it.
    pub fn open(vfs: Arc<dyn Vfs>, dir: &Path) -> Result<LogFile, LogError> {
        files::create_dir_durable(&*vfs, dir)?;
        let path = dir.join(LOG);
        let (file, recs) = RecordFile::open(vfs, dir, LOG, FORMAT, LogCodec, 1, || {
            Durable::default().as_records()
        })?;
        let mut state = Durable::default();
        for r in recs {
            let rec = [r.record];
            state
                .check(&rec)
                .map_err(|why| LogError::corrupt(&path, r.at, why))?;
            let [rec] = rec;
            state.apply(rec);
        }
        tracing::debug!(file = %path.display(), records = file.records(), entries = state.entries.len(), "Raft log replayed");
        Ok(LogFile {
            dir: dir.to_path_buf(),
            file,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The state, shared with log readers.
    pub fn state(&self) -> Arc<Mutex<Durable>> {
        self.state.clone()
    }

    /// Appends `recs` (and fdatasyncs them if `sync`), then applies them to
    /// the state. On a failed write the file is cut back to where it was.
    pub fn write(&mut self, recs: Vec<LogRecord>, sync: bool) -> Result<(), LogError> {
        if let Some(why) = self.file.broken() {
            return Err(LogError::Broken(why.to_string()));
        }
        self.state
            .lock()
            .check(&recs)
            .map_err(LogError::OutOfOrder)?;
        self.file.append(&recs, sync)?;
        let mut state = self.state.lock();
        for rec in recs {
            state.apply(rec);
        }
        drop(state);
        self.compact_if_due();
        Ok(())
    }

    /// Rewrites the file when it holds many more records than live state.
    fn compact_if_due(&mut self) {
        let live = self.state.lock().entries.len() as u64;
        if self.file.records() <= 2 * live + COMPACT_SLACK {
            return;
        }
        let recs = self.state.lock().as_records();
        let before = self.file.records();
        match self.file.rewrite(1, &recs) {
            Ok(()) => {
                tracing::debug!(dir = %self.dir.display(), before, after = self.file.records(), "Raft log rewritten");
            }
            // The old file is intact and goes on; the next write retries.
            // (If the new file took the name but the directory sync failed,
            // the file refuses appends from now on.)
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "rewriting the Raft log failed");
            }
        }
    }
}
