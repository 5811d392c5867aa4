//! Stable error codes shared by every Strom interface (Rust, C, Python, CLI)
//! and the codec's own error type.
//!
//! A code is a `u16` that never changes meaning once released; retired codes
//! are never reused. Codes are grouped by hundreds: 1xx protocol, 2xx topics
//! and registry, 3xx storage, 4xx policies, 5xx client and network, 6xx
//! consumer-side data handling.

use std::fmt;

/// A stable numeric error code. Unknown codes (from a newer peer) are kept as-is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorCode(pub u16);

macro_rules! codes {
    ($($name:ident = $val:expr, $text:expr;)*) => {
        impl ErrorCode {
            $(pub const $name: ErrorCode = ErrorCode($val);)*
            /// Short stable name of the code (`"TOPIC_NOT_FOUND"`), or `"UNKNOWN"`.
            pub fn name(self) -> &'static str {
                match self.0 { $($val => stringify!($name),)* _ => "UNKNOWN" }
            }
            /// One-line description of what the code means.
            pub fn describe(self) -> &'static str {
                match self.0 { $($val => $text,)* _ => "unknown error code" }
            }
            /// Every code this build knows, for documentation and bindings.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode($val)),*];
        }
    };
}

codes! {
    INTERNAL = 1, "internal error; please report it";
    MALFORMED_FRAME = 100, "a frame or message could not be decoded";
    FRAME_TOO_LARGE = 101, "a frame exceeds the configured maximum frame size";
    UNSUPPORTED_VERSION = 102, "the peer speaks an unsupported protocol version";
    UNKNOWN_OPCODE = 103, "the request type is not known to this server";
    NOT_A_MEMBER = 104, "a member-to-member request on a connection that has not proven membership of the group (cluster secret), or for another member's id";
    UNAUTHENTICATED = 105, "the connection's identity could not be established (a missing, malformed, expired, revoked or foreign token, certificate or password)";
    NOT_AUTHORIZED = 106, "the connection's principal may not do this operation on this resource (ACLs, a token's scope)";
    TOPIC_NOT_FOUND = 200, "no topic with that name";
    TOPIC_EXISTS = 201, "a topic with that name already exists";
    PARTITION_NOT_FOUND = 202, "no such partition in the topic";
    INVALID_TOPIC_SPEC = 203, "the topic specification is invalid";
    TOPIC_CLOSED = 204, "the topic's stream has ended; no more events can be produced";
    NOT_MASTER = 205, "this server does not hold the topic registry";
    PRODUCER_NOT_FOUND = 206, "unknown producer id for this topic";
    PARTITION_UNAVAILABLE = 207, "the member hosting the partition is down or the partition could not be opened";
    DATA_DIR_LOCKED = 208, "another server process holds the data directory";
    GROUP_FILE_LIVE = 209, "the group file names live members of another group";
    CONSUMER_GROUP_NOT_FOUND = 210, "no consumer group with that name";
    CONSUMER_GROUP_MISMATCH = 211, "the consumer group exists for another topic or mode";
    FENCED = 212, "another member holds the partition now (stale consumer or epoch)";
    UNKNOWN_CONSUMER = 213, "the consumer is not a member of the group (its session expired); join again";
    PRODUCER_EXPIRED = 214, "the producer's lease ran out; its part of the stream was closed";
    NOT_ENOUGH_REPLICAS = 215, "too few in-sync replicas for an acks=all append (min_in_sync)";
    NOT_PARTITION_LEADER = 216, "this member does not lead the partition (now); the registry names its leader";
    OUT_OF_ORDER_SEQUENCE = 217, "an idempotent producer's batch does not follow its previous one in the partition (an earlier batch is missing, or this one is too old to be answered)";
    MEMBER_REMOVED = 218, "the member left the group (drained or removed) and may not rejoin under its id";
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 219, "the leader stored an acks=all append, but the in-sync replicas fell below min_in_sync before it was acknowledged; it may or may not be kept (an idempotent producer resends it)";
    STALE_PRODUCER_EPOCH = 220, "a Kafka idempotent producer's batch is of an epoch older than the producer's current one";
    QUOTA_EXCEEDED = 230, "a storage quota (stored bytes of a topic or topic prefix on this member) is used up: delete or expire data, or raise the quota (strom quota set)";
    STORAGE_IO = 300, "storage I/O error";
    CORRUPT = 301, "corrupt data detected in storage";
    OFFSET_OUT_OF_RANGE = 302, "offset is outside the partition's range";
    BAD_DATA_RANGE = 303, "requested data range is outside the event's data";
    DISK_FULL = 304, "disk full";
    BATCH_TOO_LARGE = 305, "batch exceeds the size limit";
    INVALID_STORAGE_CONFIG = 307, "invalid storage configuration";
    STORAGE_INVALID_ARGUMENT = 308, "storage rejected an argument (empty batch, name too long)";
    DATA_CORRUPT = 309, "a range of offsets is unreadable (damaged on disk) and was quarantined";
    DATA_EXPIRED = 310, "events were dropped by the overflow policy before this reader got them";
    PARTITION_FAILED = 311, "the partition stopped after a failed fsync or write; it must be reopened";
    INVALID_METADATA = 400, "metadata rejected by the topic's validator";
    BAD_POLICY_SPEC = 401, "bad validator, selector or serializer specification";
    SELECTION_FAILED = 402, "the partition selector could not choose a partition";
    ENCODE_FAILED = 403, "metadata could not be serialized";
    DECODE_FAILED = 404, "metadata could not be deserialized";
    CONNECTION_FAILED = 500, "could not connect to a server";
    CONNECTION_CLOSED = 501, "the connection to a server was lost";
    TIMEOUT = 502, "the operation timed out";
    SHUTTING_DOWN = 503, "the driver or server is shutting down";
    INVALID_ARGUMENT = 504, "an argument is invalid";
    GROUP_FILE = 505, "the group file is missing or invalid";
    DATA_BROKER = 600, "the data broker could not provide destination buffers";
    DATA_SELECTOR = 601, "the data selector returned an invalid selection";
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Why a frame or message could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("truncated input: needed {needed} more bytes for {what}, {remaining} remain")]
    Truncated {
        what: &'static str,
        needed: u64,
        remaining: usize,
    },
    #[error("frame of {len} bytes exceeds the maximum frame size of {max} bytes")]
    FrameTooLarge { len: u64, max: u32 },
    #[error("bad magic 0x{0:04x}: the peer does not speak the Strom protocol")]
    BadMagic(u16),
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown {what} {value}")]
    Unknown { what: &'static str, value: u64 },
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

impl ProtoError {
    /// The stable code a peer sees for this decode failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtoError::FrameTooLarge { .. } => ErrorCode::FRAME_TOO_LARGE,
            ProtoError::UnsupportedVersion(_) => ErrorCode::UNSUPPORTED_VERSION,
            ProtoError::Unknown { what: "opcode", .. } => ErrorCode::UNKNOWN_OPCODE,
            _ => ErrorCode::MALFORMED_FRAME,
        }
    }

    pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        ProtoError::Invalid {
            what,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_named() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.0), "duplicate code {}", c.0);
            assert_ne!(c.name(), "UNKNOWN");
        }
        assert_eq!(ErrorCode(9999).name(), "UNKNOWN");
        assert_eq!(ErrorCode::TOPIC_NOT_FOUND.0, 200);
    }
}
