//! Client errors. Every error has a stable [`ErrorCode`] shared with the
//! server, the C and the Python interfaces. A leaf: it names no other
//! module of the client (a compressed frame's [`FrameError`] is the
//! shared codec's, `strom_policy::frame`).

use std::time::Duration;

use strom_net::NetError;
use strom_policy::PolicyError;
use strom_proto::{ErrorCode, ProtoError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error reported by a server, or shared by every event of a failed batch.
    #[error("{message} [{code}]")]
    Coded { code: ErrorCode, message: String },
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("malformed message from the server: {0}")]
    Proto(#[from] ProtoError),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    GroupFile(String),
    #[error("data broker failed: {0}")]
    Broker(String),
    #[error("data selector returned an invalid selection: {0}")]
    Selector(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0} is closed")]
    Closed(&'static str),
    /// An operation the backend in use cannot do (the Kafka backend has no
    /// registry, leases, Strom consumer groups or data descriptors).
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported { backend: &'static str, what: String },
    /// A blocking call (anything that waits for a server's answer) made on
    /// one of the driver's own runtime threads, where waiting would
    /// deadlock: from a data selector or broker, or from async code the
    /// driver runs.
    #[error("a blocking Strom call cannot run on one of the driver's own runtime threads (a data selector, a data broker or a task the driver runs), where waiting for the answer would deadlock; call it from another thread")]
    OnDriverThread,
    /// A gap: the overflow policy (or time retention) dropped these events
    /// before this reader got them. The consumer carries on after it.
    #[error("events {first}..={last} of partition {partition} of topic '{topic}' were dropped before this reader got them (overflow policy or retention) [{}]", ErrorCode::DATA_EXPIRED)]
    DataExpired {
        topic: String,
        partition: u32,
        first: u64,
        last: u64,
    },
    /// A gap: these events were damaged on disk and quarantined by the
    /// server. The consumer carries on after it.
    #[error("events {first}..={last} of partition {partition} of topic '{topic}' are damaged on disk and were quarantined; this reader skips them (see docs/on-disk-format.md) [{}]", ErrorCode::DATA_CORRUPT)]
    DataCorrupt {
        topic: String,
        partition: u32,
        first: u64,
        last: u64,
    },
    /// A compressed topic's event whose stored data part is not a frame
    /// this client can decode (docs/compression.md). The consumer reports
    /// it in the event's place and carries on after it.
    #[error("event {offset} of partition {partition} of topic '{topic}': {source}; the event is skipped [{}]", ErrorCode::DECODE_FAILED)]
    DataFrame {
        topic: String,
        partition: u32,
        offset: u64,
        #[source]
        source: FrameError,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use strom_policy::frame::FrameError;

impl Error {
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Coded { code, .. } => *code,
            Error::Net(e) => e.code(),
            Error::Policy(e) => ErrorCode(e.code()),
            Error::Proto(e) => e.code(),
            Error::InvalidArgument(_) => ErrorCode::INVALID_ARGUMENT,
            Error::GroupFile(_) => ErrorCode::GROUP_FILE,
            Error::Broker(_) => ErrorCode::DATA_BROKER,
            Error::Selector(_) => ErrorCode::DATA_SELECTOR,
            Error::Timeout(_) => ErrorCode::TIMEOUT,
            Error::Closed(_) => ErrorCode::SHUTTING_DOWN,
            Error::Unsupported { .. } => ErrorCode::INVALID_ARGUMENT,
            Error::OnDriverThread => ErrorCode::INVALID_ARGUMENT,
            Error::DataExpired { .. } => ErrorCode::DATA_EXPIRED,
            Error::DataCorrupt { .. } => ErrorCode::DATA_CORRUPT,
            Error::DataFrame { .. } => ErrorCode::DECODE_FAILED,
        }
    }

    pub(crate) fn coded(code: ErrorCode, message: impl Into<String>) -> Self {
        Error::Coded {
            code,
            message: message.into(),
        }
    }

    /// The offsets `(first, last)` (inclusive) of a `DATA_EXPIRED` gap.
    pub fn expired_offsets(&self) -> Option<(u64, u64)> {
        match self {
            Error::DataExpired { first, last, .. } => Some((*first, *last)),
            _ => None,
        }
    }

    /// The offsets `(first, last)` (inclusive) of any gap a consumer
    /// reports: `DATA_EXPIRED` (dropped) or `DATA_CORRUPT` (quarantined).
    pub fn gap_offsets(&self) -> Option<(u64, u64)> {
        match self {
            Error::DataExpired { first, last, .. } | Error::DataCorrupt { first, last, .. } => {
                Some((*first, *last))
            }
            _ => None,
        }
    }

    /// The message without the `[CODE (n)]` suffix that `Display` adds.
    pub fn message(&self) -> String {
        match self {
            Error::Coded { message, .. } => message.clone(),
            e @ (Error::DataExpired { .. }
            | Error::DataCorrupt { .. }
            | Error::DataFrame { .. }) => {
                let full = e.to_string();
                match full.rfind(" [") {
                    Some(i) => full[..i].to_string(),
                    None => full,
                }
            }
            e => e.to_string(),
        }
    }

    /// A copy that keeps the code and message (errors shared by many futures).
    pub(crate) fn shared(&self) -> Error {
        match self {
            Error::Coded { code, message } => Error::coded(*code, message.clone()),
            Error::DataExpired {
                topic,
                partition,
                first,
                last,
            } => Error::DataExpired {
                topic: topic.clone(),
                partition: *partition,
                first: *first,
                last: *last,
            },
            Error::DataCorrupt {
                topic,
                partition,
                first,
                last,
            } => Error::DataCorrupt {
                topic: topic.clone(),
                partition: *partition,
                first: *first,
                last: *last,
            },
            Error::DataFrame {
                topic,
                partition,
                offset,
                source,
            } => Error::DataFrame {
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                source: source.clone(),
            },
            e => Error::coded(e.code(), e.to_string()),
        }
    }
}

/// A response of the wrong kind for its request: a server bug, reported as
/// `INTERNAL` with what came back.
pub(crate) fn unexpected(r: strom_proto::Response) -> Error {
    Error::coded(
        ErrorCode::INTERNAL,
        format!("unexpected response from the server: {r:?}"),
    )
}
