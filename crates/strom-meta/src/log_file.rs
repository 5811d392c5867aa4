//! The durable Raft log of one member: `raft.log` in its data directory,
//! framed with `strom_storage::record` (CRC per record). Every change is a
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
use strom_storage::record::{self, FILE_HEADER, MAX_RECORD};
use strom_storage::vfs::{Vfs, VfsFile};

use crate::codec::{from_json, to_json};
use crate::error::LogError;
use crate::files;
use crate::types::{Entry, LogId, Vote};

/// The log file's name in the member's directory.
pub const LOG: &str = "raft.log";
/// Its magic (framing: `strom_storage::record`).
pub const LOG_MAGIC: [u8; 4] = *b"STRR";
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

/// The open log file and the state it holds.
pub struct LogFile {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    file: Box<dyn VfsFile>,
    /// Bytes of the file; the next record goes here.
    len: u64,
    /// Sequence number of the next record (the framing's record index).
    next_seq: u64,
    /// Records in the file.
    records: u64,
    broken: Option<String>,
    state: Arc<Mutex<Durable>>,
}

impl LogFile {
    /// Opens (or creates) the log in `dir` and replays it.
    pub fn open(vfs: Arc<dyn Vfs>, dir: &Path) -> Result<LogFile, LogError> {
        files::create_dir_durable(&*vfs, dir)?;
        let path = dir.join(LOG);
        files::remove_if_exists(&*vfs, &dir.join(format!("{LOG}.tmp")))?;
        let buf = files::read_all(&*vfs, &path)?;
        let header = record::file_header(LOG_MAGIC);
        match buf {
            Some(buf) if buf.len() >= FILE_HEADER || !header.starts_with(&buf) => {
                Self::replay(vfs, dir, &buf)
            }
            Some(_) => {
                tracing::warn!(file = %path.display(), "the Raft log stops inside its header; starting it again");
                Self::rewrite(vfs, dir, Durable::default()).map_err(|(e, _)| e)
            }
            None => Self::rewrite(vfs, dir, Durable::default()).map_err(|(e, _)| e),
        }
    }

    /// Starts a new file holding `state` alone. On failure, the flag says
    /// whether the new file already took the name.
    fn rewrite(vfs: Arc<dyn Vfs>, dir: &Path, state: Durable) -> Result<LogFile, (LogError, bool)> {
        let (bufs, records) = encode_records(1, &state.as_records()).map_err(|e| (e, false))?;
        let header = record::file_header(LOG_MAGIC);
        let mut parts: Vec<&[u8]> = vec![&header];
        parts.extend(bufs.iter().map(|b| &b[..]));
        let len = parts.iter().map(|p| p.len() as u64).sum();
        let file = files::replace(&*vfs, dir, LOG, &parts)?;
        Ok(LogFile {
            vfs,
            dir: dir.to_path_buf(),
            file,
            len,
            next_seq: records + 1,
            records,
            broken: None,
            state: Arc::new(Mutex::new(state)),
        })
    }

    fn replay(vfs: Arc<dyn Vfs>, dir: &Path, buf: &[u8]) -> Result<LogFile, LogError> {
        let path = dir.join(LOG);
        let scan = record::scan_log(buf, LOG_MAGIC, "Raft log")
            .map_err(|d| LogError::corrupt(&path, d.at, d.reason))?;
        let mut state = Durable::default();
        for r in &scan.records {
            let rec: LogRecord = from_json(r.payload, "a Raft log record")
                .map_err(|e| LogError::corrupt(&path, r.at, e.to_string()))?;
            let rec = [rec];
            state
                .check(&rec)
                .map_err(|why| LogError::corrupt(&path, r.at, why))?;
            let [rec] = rec;
            state.apply(rec);
        }
        let file = vfs
            .open(&path, false)
            .map_err(|e| LogError::io("opening", &path, e))?;
        if let Some(t) = &scan.torn {
            tracing::warn!(file = %path.display(), offset = t.at, reason = %t.reason,
                "dropping a damaged last record of the Raft log (a crash during an append); it was never acknowledged");
            file.set_len(t.at as u64)
                .and_then(|_| file.sync_data())
                .map_err(|e| LogError::io("truncating", &path, e))?;
        }
        let records = scan.records.len() as u64;
        let next_seq = scan.records.last().map_or(1, |r| r.index.saturating_add(1));
        tracing::debug!(file = %path.display(), records, entries = state.entries.len(), "Raft log replayed");
        Ok(LogFile {
            vfs,
            dir: dir.to_path_buf(),
            file,
            len: scan.valid_len as u64,
            next_seq,
            records,
            broken: None,
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
        if let Some(why) = &self.broken {
            return Err(LogError::Broken(why.clone()));
        }
        let path = self.dir.join(LOG);
        self.state
            .lock()
            .check(&recs)
            .map_err(LogError::OutOfOrder)?;
        let (bufs, n) = encode_records(self.next_seq, &recs)?;
        let parts: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
        let written = self.file.write_all_at(&parts, self.len).and_then(|_| {
            if sync {
                self.file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = written {
            self.cut_back(&e);
            return Err(LogError::io("appending to", &path, e));
        }
        self.len += parts.iter().map(|p| p.len() as u64).sum::<u64>();
        self.next_seq += n;
        self.records += n;
        let mut state = self.state.lock();
        for rec in recs {
            state.apply(rec);
        }
        drop(state);
        self.compact_if_due();
        Ok(())
    }

    fn cut_back(&mut self, e: &std::io::Error) {
        let undone = self
            .file
            .set_len(self.len)
            .and_then(|_| self.file.sync_data());
        if let Err(e2) = undone {
            self.broken = Some(format!("appending: {e}; cutting it back: {e2}"));
        }
    }

    /// Rewrites the file when it holds many more records than live state.
    fn compact_if_due(&mut self) {
        let live = self.state.lock().entries.len() as u64;
        if self.records <= 2 * live + COMPACT_SLACK {
            return;
        }
        let snapshot = {
            let s = self.state.lock();
            Durable {
                vote: s.vote,
                committed: s.committed,
                purged: s.purged,
                entries: s.entries.clone(),
                next_index: s.next_index,
            }
        };
        let before = self.records;
        match Self::rewrite(self.vfs.clone(), &self.dir, snapshot) {
            Ok(new) => {
                self.file = new.file;
                self.len = new.len;
                self.next_seq = new.next_seq;
                self.records = new.records;
                tracing::debug!(dir = %self.dir.display(), before, after = self.records, "Raft log rewritten");
            }
            Err((e, false)) => {
                // The old file is intact and goes on; the next write retries.
                tracing::warn!(dir = %self.dir.display(), error = %e, "rewriting the Raft log failed; keeping the old one");
            }
            Err((e, true)) => {
                // The open handle is the old, unlinked file, and the new
                // one's name may not survive a crash: stop appending.
                self.broken = Some(format!("rewriting the log: {e}"));
            }
        }
    }
}

/// Frames `recs` as records numbered from `seq`; returns them and their count.
fn encode_records(seq: u64, recs: &[LogRecord]) -> Result<(Vec<Vec<u8>>, u64), LogError> {
    let mut out = Vec::with_capacity(recs.len());
    for (i, rec) in recs.iter().enumerate() {
        let payload = to_json(rec).map_err(LogError::Broken)?;
        if payload.len() > MAX_RECORD {
            return Err(LogError::TooLarge(payload.len()));
        }
        out.push(record::encode(seq + i as u64, &payload));
    }
    Ok((out, recs.len() as u64))
}
