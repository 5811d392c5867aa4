//! Typed errors of the Kafka front end, and the mapping of Strom's error
//! codes onto Kafka's.

use strom_proto::ErrorCode;
use strom_server::ServerError;

/// Why the Kafka listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("binding the Kafka listener to {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("the Kafka listener's TLS settings: {0}")]
    Tls(String),
}

impl KafkaError {
    /// The error's stable code (shared with `strom_proto::ErrorCode`).
    pub fn code(&self) -> u16 {
        match self {
            KafkaError::Bind { .. } => ErrorCode::CONNECTION_FAILED.0,
            KafkaError::Tls(_) => ErrorCode::INVALID_ARGUMENT.0,
        }
    }
}

/// Why a connection was closed: its input broke the protocol.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds max_frame_bytes ({max}); Kafka clients: lower message.max.bytes / fetch sizes")]
    TooLarge { size: i64, max: u32 },
    #[error("frame of {0} bytes is shorter than a request header")]
    TooShort(i64),
    #[error("request header: {0}")]
    Header(String),
    #[error("{api} v{version} body: {detail}")]
    Body {
        api: &'static str,
        version: i16,
        detail: String,
    },
    #[error("no request within {0:?} of connecting (handshake_timeout_ms)")]
    NoRequest(std::time::Duration),
    #[error("a started frame did not arrive within {0:?} (frame_timeout_ms)")]
    Stalled(std::time::Duration),
    #[error("reading from the socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Kafka error codes this front end answers with.
pub mod kcode {
    pub const NONE: i16 = 0;
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const NOT_CONTROLLER: i16 = 41;
    pub const INVALID_REQUEST: i16 = 42;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const TOPIC_DELETION_DISABLED: i16 = 73;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const POLICY_VIOLATION: i16 = 44;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const INVALID_RECORD: i16 = 87;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
}

/// The Kafka error code closest to a Strom error.
pub fn kafka_code(e: &ServerError) -> i16 {
    let c = e.code();
    match c {
        ErrorCode::TOPIC_NOT_FOUND | ErrorCode::PARTITION_NOT_FOUND => {
            kcode::UNKNOWN_TOPIC_OR_PARTITION
        }
        ErrorCode::PARTITION_UNAVAILABLE | ErrorCode::NOT_PARTITION_LEADER => {
            kcode::NOT_LEADER_OR_FOLLOWER
        }
        ErrorCode::NOT_ENOUGH_REPLICAS => kcode::NOT_ENOUGH_REPLICAS,
        ErrorCode::NOT_ENOUGH_REPLICAS_AFTER_APPEND => kcode::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode::OUT_OF_ORDER_SEQUENCE => kcode::OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode::STALE_PRODUCER_EPOCH => kcode::INVALID_PRODUCER_EPOCH,
        ErrorCode::TOPIC_EXISTS => kcode::TOPIC_ALREADY_EXISTS,
        ErrorCode::NOT_MASTER => kcode::NOT_CONTROLLER,
        ErrorCode::BATCH_TOO_LARGE | ErrorCode::FRAME_TOO_LARGE => kcode::MESSAGE_TOO_LARGE,
        ErrorCode::OFFSET_OUT_OF_RANGE => kcode::OFFSET_OUT_OF_RANGE,
        ErrorCode::INVALID_TOPIC_SPEC => kcode::INVALID_TOPIC_EXCEPTION,
        ErrorCode::TOPIC_CLOSED | ErrorCode::QUOTA_EXCEEDED => kcode::POLICY_VIOLATION,
        ErrorCode::NOT_AUTHORIZED => kcode::TOPIC_AUTHORIZATION_FAILED,
        ErrorCode::UNAUTHENTICATED => kcode::SASL_AUTHENTICATION_FAILED,
        ErrorCode::STORAGE_IO | ErrorCode::DISK_FULL | ErrorCode::CORRUPT => {
            kcode::KAFKA_STORAGE_ERROR
        }
        _ => kcode::UNKNOWN_SERVER_ERROR,
    }
}
