//! Transport errors.

use std::sync::Arc;

use strom_proto::{ErrorCode, ProtoError};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
    #[error("connection closed by the peer")]
    Closed,
    #[error("bulk payload of {announced} bytes does not match the {expected} bytes expected")]
    BulkMismatch { announced: u64, expected: u64 },
    /// A multiplexed connection ended before this request's answer came;
    /// every request then in flight shares the cause.
    #[error("connection to {peer} was lost: {cause}")]
    Lost {
        peer: String,
        #[source]
        cause: Arc<NetError>,
    },
    #[error("no transport for scheme '{scheme}' (known: {known})")]
    UnknownScheme { scheme: String, known: String },
    #[error("the fill plan does not fit the {buffers} buffers lent for the response")]
    FillPlan { buffers: usize },
    /// A TLS setting that cannot be used (a missing or bad certificate,
    /// key or CA file).
    #[error("TLS configuration: {0}")]
    TlsConfig(String),
    /// A TLS handshake that failed (an untrusted certificate, a plaintext
    /// peer).
    #[error("TLS with {peer}: {reason}")]
    Tls { peer: String, reason: String },
}

impl NetError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        NetError::Io {
            context: context.into(),
            source,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            NetError::Io { .. } | NetError::Closed | NetError::Lost { .. } => {
                ErrorCode::CONNECTION_CLOSED
            }
            NetError::Proto(p) => p.code(),
            NetError::BulkMismatch { .. } => ErrorCode::MALFORMED_FRAME,
            NetError::UnknownScheme { .. } | NetError::FillPlan { .. } => {
                ErrorCode::INVALID_ARGUMENT
            }
            NetError::TlsConfig(_) => ErrorCode::INVALID_ARGUMENT,
            NetError::Tls { .. } => ErrorCode::CONNECTION_FAILED,
        }
    }
}
