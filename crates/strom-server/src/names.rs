//! The checks of names that become paths (topics, consumer groups), as
//! server errors with the code each request refuses them with. One check
//! for all of them: [`strom_storage::check_name`].

use strom_proto::ErrorCode;

use crate::error::ServerError;

/// Topic names become directory names: see [`check_name`].
pub fn check_topic_name(name: &str) -> Result<(), ServerError> {
    check_name("topic", name, ErrorCode::INVALID_TOPIC_SPEC)
}

/// A `what` name (topic, consumer group) that becomes a path, checked by
/// the one check storage applies to all of them
/// ([`strom_storage::check_name`]); refused with `code`.
pub fn check_name(what: &str, name: &str, code: ErrorCode) -> Result<(), ServerError> {
    strom_storage::check_name(what, name).map_err(|e| {
        let why = match e {
            strom_storage::StorageError::InvalidArgument(why) => why,
            e => e.to_string(),
        };
        ServerError::coded(code, why)
    })
}
