//! Kafka producer ids (`InitProducerId`), unique across the group's members
//! and across restarts, because a producer id names the producer in the
//! partitions' durable idempotent-producer table (`strom_server::producers`):
//! an id handed out twice would let one producer's batch pass for another's
//! retry.
//!
//! An id is `member << 32 | n`: `member` is this server's member id plus
//! one (0 for a server outside a group), `n` a counter of this server kept
//! durable by reserving blocks of [`BLOCK`] ids in the file
//! `kafka-producer-ids` of the data directory (written and fsynced before
//! an id of the block is handed out). A restart starts at the next block,
//! so ids handed out before it are never handed out again.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// Ids reserved per write of the file.
pub const BLOCK: u64 = 1 << 16;
/// The file, in the data directory.
pub const FILE: &str = "kafka-producer-ids";
/// Members numbered past this cannot hand out Kafka producer ids (the id
/// must fit in 47 bits: `strom_server::producers::KAFKA_MAX_PRODUCER_ID`).
const MAX_MEMBER: u64 = (1 << 15) - 1;

/// Why no producer id could be handed out.
#[derive(Debug, thiserror::Error)]
pub enum ProducerIdError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a number of reserved producer ids: {text:?}")]
    Corrupt { path: PathBuf, text: String },
    #[error("member id {0} is too large to number Kafka producer ids")]
    MemberTooLarge(u32),
    #[error("this server handed out all its 2^32 Kafka producer ids")]
    Exhausted,
}

struct Counter {
    next: u64,
    /// Ids below this are reserved in the file.
    limit: u64,
}

/// The allocator of one server.
pub struct ProducerIds {
    path: PathBuf,
    counter: Mutex<Option<Counter>>,
}

impl ProducerIds {
    /// The allocator over `<data_dir>/kafka-producer-ids`; the file is
    /// read at the first allocation.
    pub fn new(data_dir: &Path) -> Self {
        ProducerIds {
            path: data_dir.join(FILE),
            counter: Mutex::new(None),
        }
    }

    /// A fresh producer id for this server, member `member` (`u32::MAX`
    /// outside a group). May write and fsync the file (once per block).
    pub fn next(&self, member: u32) -> Result<i64, ProducerIdError> {
        let prefix = if member == u32::MAX {
            0
        } else {
            u64::from(member) + 1
        };
        if prefix > MAX_MEMBER {
            return Err(ProducerIdError::MemberTooLarge(member));
        }
        let mut guard = self.counter.lock();
        let c = match guard.as_mut() {
            Some(c) => c,
            None => {
                let start = self.read()?;
                guard.insert(Counter {
                    next: start,
                    limit: start,
                })
            }
        };
        if c.next >= c.limit {
            let limit = c.limit + BLOCK;
            if limit > 1 << 32 {
                return Err(ProducerIdError::Exhausted);
            }
            self.write(limit)?;
            c.limit = limit;
        }
        let n = c.next;
        c.next += 1;
        Ok((prefix << 32 | n) as i64)
    }

    fn io(&self, source: std::io::Error) -> ProducerIdError {
        ProducerIdError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// The first id not yet reserved (0 without a file).
    fn read(&self) -> Result<u64, ProducerIdError> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(self.io(e)),
        };
        let text = String::from_utf8_lossy(&text);
        text.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= 1 << 32)
            .ok_or_else(|| ProducerIdError::Corrupt {
                path: self.path.clone(),
                text: text.chars().take(40).collect(),
            })
    }

    /// Reserves the ids below `limit`: a temporary file, fsynced, renamed
    /// over the file, and the directory fsynced.
    fn write(&self, limit: u64) -> Result<(), ProducerIdError> {
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| self.io(e))?;
        f.write_all(format!("{limit}\n").as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| self.io(e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io(e))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| self.io(e))?;
        }
        tracing::debug!(path = %self.path.display(), limit, "Kafka producer ids reserved");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_members_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let a = ProducerIds::new(dir.path());
        let first = a.next(u32::MAX).unwrap();
        assert_eq!(first, 0);
        assert_eq!(a.next(u32::MAX).unwrap(), 1);
        assert_eq!(a.next(4).unwrap(), 5 << 32 | 2);
        drop(a);
        // A restart starts past the reserved block.
        let b = ProducerIds::new(dir.path());
        assert_eq!(b.next(u32::MAX).unwrap(), BLOCK as i64);
        assert!(ProducerIds::new(dir.path()).next(1 << 20).is_err());
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_a_reuse() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "bogus").unwrap();
        let a = ProducerIds::new(dir.path());
        assert!(matches!(
            a.next(u32::MAX),
            Err(ProducerIdError::Corrupt { .. })
        ));
    }
}
