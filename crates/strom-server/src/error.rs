//! Server errors, each mapped to a stable [`ErrorCode`] sent to clients.

use strom_net::NetError;
use strom_proto::ErrorCode;
use strom_storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{message}")]
    Coded { code: ErrorCode, message: String },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl ServerError {
    pub fn coded(code: ErrorCode, message: impl Into<String>) -> Self {
        ServerError::Coded {
            code,
            message: message.into(),
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io {
            context: context.into(),
            source,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ServerError::Coded { code, .. } => *code,
            ServerError::Storage(e) => ErrorCode(e.code()),
            ServerError::Net(e) => e.code(),
            ServerError::Io { source, .. } if strom_storage::is_disk_full(source) => {
                ErrorCode::DISK_FULL
            }
            ServerError::Io { .. } => ErrorCode::STORAGE_IO,
        }
    }
}
