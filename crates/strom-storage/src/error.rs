//! Storage error type with stable numeric codes (300..=399) shared by every
//! client surface. A retired code is never reused.

use std::io;

pub type Result<T> = std::result::Result<T, StorageError>;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("corrupt {what}")]
    Corrupt { what: String },
    #[error("offset {requested} is out of range [{first}, {next})")]
    OffsetOutOfRange {
        requested: u64,
        first: u64,
        next: u64,
    },
    #[error(
        "data range [{pos}, {pos} + {len}) is outside the batch data of {data_len} bytes \
         (batch at offset {batch_base}); request ranges within the data length"
    )]
    BadDataRange {
        batch_base: u64,
        pos: u64,
        len: u64,
        data_len: u64,
    },
    #[error("disk full while {context}; free space or lower retention")]
    DiskFull { context: String },
    #[error("batch of {size} bytes exceeds the limit of {limit} bytes")]
    BatchTooLarge { size: u64, limit: u64 },
    #[error("invalid storage configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Offsets `first..=last` are damaged on disk and were quarantined (the
    /// quarantine is persistent). Readers continue at `last + 1`.
    #[error(
        "offsets {first}..={last} are unreadable (damaged on disk) and were quarantined; \
         continue reading from offset {next}, and restore the range from a replica or a \
         backup if it is needed",
        next = .last.saturating_add(1)
    )]
    DataCorrupt { first: u64, last: u64 },
    /// A write or fsync failed: the log refuses appends and never reports
    /// anything after the failure as durable, until it is reopened.
    #[error(
        "the partition stopped after a failed write or fsync ({cause}); nothing appended \
         since then is known to be durable: fix the disk, then reopen the partition \
         (restart or reload it) to recover from what is on disk"
    )]
    PartitionFailed { cause: String },
}

/// Whether an I/O error means the disk (or the user's quota) is full:
/// ENOSPC or EDQUOT, reported as `DISK_FULL` wherever it surfaces.
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

impl StorageError {
    /// Stable numeric code, equal to the `strom_proto::ErrorCode` constant of
    /// the same name (pinned by `crates/strom-proto/tests/error_codes.rs`;
    /// storage must not depend on the protocol crate). 306 is retired; 310
    /// (`DATA_EXPIRED`) belongs to the 3xx range but is raised by the server,
    /// not by storage.
    pub fn code(&self) -> u16 {
        match self {
            StorageError::Io { .. } => 300,
            StorageError::Corrupt { .. } => 301,
            StorageError::OffsetOutOfRange { .. } => 302,
            StorageError::BadDataRange { .. } => 303,
            StorageError::DiskFull { .. } => 304,
            StorageError::BatchTooLarge { .. } => 305,
            StorageError::InvalidConfig(_) => 307,
            StorageError::InvalidArgument(_) => 308,
            StorageError::DataCorrupt { .. } => 309,
            StorageError::PartitionFailed { .. } => 311,
        }
    }

    /// A [`crate::RecordFileError`] as a storage error (I/O keeps its
    /// disk-full kind, damage is `Corrupt`, a stopped file is failed).
    pub fn from_record_file(what: &str, e: crate::RecordFileError) -> Self {
        use crate::RecordFileError as E;
        match e {
            E::Io { step, path, source } => {
                StorageError::io(format!("{step} {}", path.display()), source)
            }
            E::Corrupt { .. } => StorageError::corrupt(format!("{what} {e}")),
            E::TooLarge(_) | E::Encode(_) => StorageError::InvalidArgument(e.to_string()),
            E::Broken(cause) => StorageError::PartitionFailed { cause },
        }
    }

    /// Wraps an I/O error; ENOSPC / EDQUOT become [`StorageError::DiskFull`].
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        if is_disk_full(&source) {
            StorageError::DiskFull {
                context: context.into(),
            }
        } else {
            StorageError::Io {
                context: context.into(),
                source,
            }
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        StorageError::Corrupt { what: what.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enospc_maps_to_disk_full() {
        let e = StorageError::io("writing", io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.code(), 304);
        let e = StorageError::io("writing", io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.code(), 300);
    }
}
