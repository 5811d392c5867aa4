//! The crate's typed errors: [`MetaError`] for callers of [`crate::Meta`],
//! with stable numeric codes from Strom's shared table, [`NetError`] for
//! [`crate::MetaNet`] implementations, and [`LogError`] for the durable
//! log's damage and I/O failures.

use std::io;
use std::path::{Path, PathBuf};

use crate::types::NodeId;

/// Stable codes, equal to `strom_proto::ErrorCode` constants of the same
/// name (this crate does not depend on the protocol crate).
pub mod code {
    pub const INTERNAL: u16 = 1;
    /// "This server does not hold the topic registry": the leader hint
    /// tells where it is.
    pub const NOT_MASTER: u16 = 205;
    pub const STORAGE_IO: u16 = 300;
    pub const CORRUPT: u16 = 301;
    pub const CONNECTION_FAILED: u16 = 500;
    pub const TIMEOUT: u16 = 502;
    pub const SHUTTING_DOWN: u16 = 503;
    pub const INVALID_ARGUMENT: u16 = 504;
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// This node is not the leader; `leader` is the one it knows of, if any.
    #[error("this member is not the metadata leader{}; retry there", hint(leader))]
    NotLeader { leader: Option<(NodeId, String)> },
    /// The state machine refused the command (on every replica alike).
    #[error("the command was refused: {0}")]
    Rejected(String),
    #[error("a command of {size} bytes is over the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("the metadata quorum is already initialized")]
    AlreadyInitialized,
    #[error("invalid membership change: {0}")]
    Membership(String),
    #[error("invalid metadata quorum configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Log(#[from] LogError),
    /// Raft stopped (shut down, or a storage failure made it stop).
    #[error("the metadata quorum stopped on this member: {0}")]
    Stopped(String),
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The leader could not confirm its leadership with a quorum.
    #[error("no quorum of voters answered: {0}")]
    NoQuorum(String),
}

fn hint(leader: &Option<(NodeId, String)>) -> String {
    match leader {
        Some((id, addr)) => format!(" (the leader is member {id} at {addr})"),
        None => " (no leader is known yet)".into(),
    }
}

impl MetaError {
    pub fn code(&self) -> u16 {
        match self {
            MetaError::NotLeader { .. } => code::NOT_MASTER,
            MetaError::Rejected(_)
            | MetaError::TooLarge { .. }
            | MetaError::AlreadyInitialized
            | MetaError::Membership(_)
            | MetaError::Config(_) => code::INVALID_ARGUMENT,
            MetaError::Log(e) => e.code(),
            MetaError::Stopped(_) => code::SHUTTING_DOWN,
            MetaError::Timeout(_) | MetaError::NoQuorum(_) => code::TIMEOUT,
        }
    }
}

/// What a [`crate::MetaNet`] reports when a call did not get an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetError {
    /// The target cannot be reached now (down, cut off): Raft backs off
    /// before it tries again.
    #[error("member {target} is unreachable: {reason}")]
    Unreachable { target: NodeId, reason: String },
    /// Any other failure: Raft retries soon.
    #[error("calling member {target} failed: {reason}")]
    Failed { target: NodeId, reason: String },
}

impl NetError {
    pub fn code(&self) -> u16 {
        code::CONNECTION_FAILED
    }
}

/// A failure of the durable log or snapshot files.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(
        "{} is damaged at byte {offset}: {reason}. The metadata log cannot be read safely; \
         restore this member's data directory, or remove it and let the member catch up \
         from the other voters",
        file.display()
    )]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("a log record of {0} bytes is over the 16 MiB limit")]
    TooLarge(usize),
    #[error("the metadata log is unusable after a failed write ({0}); restart the member")]
    Broken(String),
    /// Raft asked for a write that would break the log's sequence (a bug):
    /// nothing was written.
    #[error("refusing a write that breaks the log's sequence: {0}")]
    OutOfOrder(String),
}

impl LogError {
    pub fn code(&self) -> u16 {
        match self {
            LogError::Corrupt { .. } => code::CORRUPT,
            LogError::Io { .. } | LogError::Broken(_) => code::STORAGE_IO,
            LogError::TooLarge(_) => code::INVALID_ARGUMENT,
            LogError::OutOfOrder(_) => code::INTERNAL,
        }
    }

    pub fn corrupt(file: &Path, offset: usize, reason: impl Into<String>) -> Self {
        LogError::Corrupt {
            file: file.to_path_buf(),
            offset: offset as u64,
            reason: reason.into(),
        }
    }

    pub fn io(what: &str, path: &Path, source: io::Error) -> Self {
        LogError::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }
}

impl From<strom_storage::RecordFileError> for LogError {
    fn from(e: strom_storage::RecordFileError) -> Self {
        use strom_storage::RecordFileError as E;
        match e {
            E::Io { step, path, source } => LogError::io(step, &path, source),
            E::Corrupt { path, at, reason } => LogError::corrupt(&path, at, reason),
            E::TooLarge(n) => LogError::TooLarge(n),
            E::Encode(why) | E::Broken(why) => LogError::Broken(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_names_the_leader_and_has_a_stable_code() {
        let e = MetaError::NotLeader {
            leader: Some((2, "tcp://n2:7000".into())),
        };
        assert_eq!(e.code(), 205);
        assert!(e.to_string().contains("member 2 at tcp://n2:7000"));
        let e = MetaError::Log(LogError::corrupt(Path::new("raft.log"), 40, "bad"));
        assert_eq!(e.code(), 301);
        assert!(e.to_string().contains("raft.log is damaged at byte 40"));
    }
}
