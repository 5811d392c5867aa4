//! Partition log configuration: typed tunables with defaults and validation.

use crate::{Result, StorageError};

const GIB: u64 = 1 << 30;

/// Configuration of one partition log.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// Roll to a new segment when the active segment's `.log` + `.data` would
    /// exceed this many bytes. Default 1 GiB.
    pub segment_bytes: u64,
    /// One sparse index entry every this many bytes of `.log`. Default 4096.
    pub index_interval_bytes: u32,
    /// Drop the oldest whole segments while the total size exceeds this.
    pub retention_bytes: Option<u64>,
    /// Drop whole segments whose newest batch is older than this.
    pub retention_ms: Option<u64>,
    /// Largest accepted batch (meta + data). Default 1 GiB.
    pub max_batch_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: GIB,
            index_interval_bytes: 4096,
            retention_bytes: None,
            retention_ms: None,
            max_batch_bytes: GIB,
        }
    }
}

impl LogConfig {
    /// Rejects values that cannot work, naming the offending key.
    pub fn validate(&self) -> Result<()> {
        if self.segment_bytes == 0 {
            return Err(StorageError::InvalidConfig(
                "segment_bytes must be > 0".into(),
            ));
        }
        if self.index_interval_bytes == 0 {
            return Err(StorageError::InvalidConfig(
                "index_interval_bytes must be > 0".into(),
            ));
        }
        if self.max_batch_bytes == 0 {
            return Err(StorageError::InvalidConfig(
                "max_batch_bytes must be > 0".into(),
            ));
        }
        Ok(())
    }
}
