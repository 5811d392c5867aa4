//! openraft's log storage ([`RaftLogStorage`]) over [`LogFile`]: every
//! call that Raft must see durable before it acknowledges anything (the
//! vote, appended entries, truncation, purge) returns, or completes its
//! callback, only after the record is fdatasync'ed. Readers share the
//! in-memory [`Durable`] state.
//!
//! A purge waits until the snapshot on disk covers what it removes.
//! openraft 0.9 purges the log a received snapshot covers while the state
//! machine is still installing it; purged first and then powered off, a
//! member would restart with neither those entries nor their snapshot.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::LogError;
use crate::log_file::{Durable, LogFile, LogRecord};
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

/// The log storage handed to openraft.
pub struct LogStore {
    file: LogFile,
    /// The last log id the snapshot on disk covers.
    snapshot: watch::Receiver<Option<LogId>>,
}

/// How long a purge waits for the snapshot that covers it to be on disk
/// before it fails (and Raft stops this member).
const PURGE_WAIT: Duration = Duration::from_secs(60);

/// A reader of the log's entries, shared with replication tasks.
#[derive(Clone)]
pub struct LogReader {
    state: Arc<Mutex<Durable>>,
}

impl LogStore {
    /// The store over `file`; `snapshot` watches the snapshot on disk
    /// ([`crate::state_machine::MachineStore::durable_snapshot`]).
    pub fn new(file: LogFile, snapshot: watch::Receiver<Option<LogId>>) -> Self {
        LogStore { file, snapshot }
    }

    /// Waits until the snapshot on disk covers `upto`.
    async fn snapshot_covers(&mut self, upto: LogId) -> Result<(), LogError> {
        let covered = |d: &Option<LogId>| d.is_some_and(|d| d.index >= upto.index);
        match tokio::time::timeout(PURGE_WAIT, self.snapshot.wait_for(covered)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(LogError::Broken(
                "the state machine stopped before its snapshot was saved".into(),
            )),
            Err(_) => Err(LogError::Broken(format!(
                "no snapshot covering log index {} was saved within {PURGE_WAIT:?}; \
                 the log is kept",
                upto.index
            ))),
        }
    }

    /// Writes `recs`; Raft stops this member if that fails.
    fn write(&mut self, recs: Vec<LogRecord>, sync: bool, verb: ErrorVerb) -> Option<StorageError> {
        let e = self.file.write(recs, sync).err()?;
        Some(storage_error(ErrorSubject::Logs, verb, &e))
    }
}

/// Wraps a log failure for openraft (which stops the node on it).
pub fn storage_error(subject: ErrorSubject<u64>, verb: ErrorVerb, e: &LogError) -> StorageError {
    tracing::error!(error = %e, "metadata log storage failed");
    StorageError::IO {
        source: StorageIOError::new(subject, verb, AnyError::new(e)),
    }
}

/// The entries in `range`; an empty or inverted range has none (where
/// `BTreeMap::range` would panic).
fn entries_in<RB: RangeBounds<u64>>(state: &Durable, range: RB) -> Vec<Entry> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    match (start, end) {
        (Some(s), Some(e)) if s < e => state.entries.range(s..e).map(|(_, v)| v.clone()).collect(),
        (Some(s), None) => state.entries.range(s..).map(|(_, v)| v.clone()).collect(),
        _ => Vec::new(),
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(entries_in(&self.state.lock(), range))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(entries_in(&self.file.state().lock(), range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let state = self.file.state();
        let state = state.lock();
        Ok(LogState {
            last_purged_log_id: state.purged,
            last_log_id: state.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            state: self.file.state(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.write(vec![LogRecord::Vote(*vote)], true, ErrorVerb::Write)
            .map_or(Ok(()), Err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.file.state().lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.write(
            vec![LogRecord::Committed(committed)],
            false,
            ErrorVerb::Write,
        )
        .map_or(Ok(()), Err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.file.state().lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let recs: Vec<LogRecord> = entries.into_iter().map(LogRecord::Entry).collect();
        match self.file.write(recs, true) {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(since = log_id.index, "truncating the Raft log");
        self.write(
            vec![LogRecord::Truncated(log_id.index)],
            true,
            ErrorVerb::Delete,
        )
        .map_or(Ok(()), Err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(upto = log_id.index, "purging the Raft log");
        if let Err(e) = self.snapshot_covers(log_id).await {
            return Err(storage_error(ErrorSubject::Logs, ErrorVerb::Delete, &e));
        }
        self.write(vec![LogRecord::Purged(log_id)], true, ErrorVerb::Delete)
            .map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Blob;
    use openraft::{CommittedLeaderId, EntryPayload};

    #[test]
    fn empty_and_inverted_ranges_read_nothing_instead_of_panicking() {
        let mut state = Durable::default();
        for i in 3..8 {
            let log_id = LogId::new(CommittedLeaderId::new(1, 1), i);
            let payload = EntryPayload::Normal(Blob::default());
            state.entries.insert(i, Entry { log_id, payload });
        }
        let idx = |v: Vec<Entry>| v.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
        assert_eq!(idx(entries_in(&state, 4..6)), [4, 5]);
        assert_eq!(idx(entries_in(&state, 5..)), [5, 6, 7]);
        assert_eq!(idx(entries_in(&state, ..=3)), [3]);
        let (hi, lo) = (6, 4);
        assert!(entries_in(&state, hi..lo).is_empty());
        assert!(entries_in(&state, 5..5).is_empty());
        let excluded = (Bound::Excluded(5), Bound::Excluded(5));
        assert!(entries_in(&state, excluded).is_empty());
        assert!(entries_in(&state, u64::MAX..=u64::MAX).is_empty());
    }
}
