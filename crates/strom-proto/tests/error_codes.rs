//! Storage and policy errors carry bare `u16` codes (neither crate may depend
//! on the protocol crate), and the server and client turn them into
//! `ErrorCode(e.code())`. This pins every variant's code to the `ErrorCode`
//! constant of the same meaning, by value and by name, so renumbering either
//! side, or adding a variant without a code here, fails a test.

use std::io;

use strom_policy::PolicyError;
use strom_proto::ErrorCode;
use strom_storage::StorageError;

/// The `ErrorCode` each storage error must report. Exhaustive on purpose: a
/// new variant does not compile until it is given its code here.
fn storage_expected(e: &StorageError) -> (ErrorCode, &'static str) {
    match e {
        StorageError::Io { .. } => (ErrorCode::STORAGE_IO, "STORAGE_IO"),
        StorageError::Corrupt { .. } => (ErrorCode::CORRUPT, "CORRUPT"),
        StorageError::OffsetOutOfRange { .. } => {
            (ErrorCode::OFFSET_OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE")
        }
        StorageError::BadDataRange { .. } => (ErrorCode::BAD_DATA_RANGE, "BAD_DATA_RANGE"),
        StorageError::DiskFull { .. } => (ErrorCode::DISK_FULL, "DISK_FULL"),
        StorageError::BatchTooLarge { .. } => (ErrorCode::BATCH_TOO_LARGE, "BATCH_TOO_LARGE"),
        StorageError::InvalidConfig(_) => {
            (ErrorCode::INVALID_STORAGE_CONFIG, "INVALID_STORAGE_CONFIG")
        }
        StorageError::InvalidArgument(_) => (
            ErrorCode::STORAGE_INVALID_ARGUMENT,
            "STORAGE_INVALID_ARGUMENT",
        ),
        StorageError::DataCorrupt { .. } => (ErrorCode::DATA_CORRUPT, "DATA_CORRUPT"),
        StorageError::PartitionFailed { .. } => (ErrorCode::PARTITION_FAILED, "PARTITION_FAILED"),
    }
}

/// One value of every storage error variant.
fn storage_errors() -> Vec<StorageError> {
    vec![
        StorageError::Io {
            context: "reading".into(),
            source: io::Error::other("x"),
        },
        StorageError::Corrupt { what: "x".into() },
        StorageError::OffsetOutOfRange {
            requested: 9,
            first: 0,
            next: 1,
        },
        StorageError::BadDataRange {
            batch_base: 0,
            pos: 1,
            len: 2,
            data_len: 0,
        },
        StorageError::DiskFull {
            context: "x".into(),
        },
        StorageError::BatchTooLarge { size: 2, limit: 1 },
        StorageError::InvalidConfig("x".into()),
        StorageError::InvalidArgument("x".into()),
        StorageError::DataCorrupt { first: 1, last: 2 },
        StorageError::PartitionFailed { cause: "x".into() },
    ]
}

/// The `ErrorCode` each policy error must report (exhaustive, as above).
fn policy_expected(e: &PolicyError) -> (ErrorCode, &'static str) {
    match e {
        PolicyError::InvalidMetadata { .. } => (ErrorCode::INVALID_METADATA, "INVALID_METADATA"),
        PolicyError::BadSpec(_) => (ErrorCode::BAD_POLICY_SPEC, "BAD_POLICY_SPEC"),
        PolicyError::Selection(_) => (ErrorCode::SELECTION_FAILED, "SELECTION_FAILED"),
        PolicyError::Encode(_) => (ErrorCode::ENCODE_FAILED, "ENCODE_FAILED"),
        PolicyError::Decode(_) => (ErrorCode::DECODE_FAILED, "DECODE_FAILED"),
    }
}

fn policy_errors() -> Vec<PolicyError> {
    vec![
        PolicyError::InvalidMetadata {
            rule: "type".into(),
            path: "/a".into(),
            message: "x".into(),
        },
        PolicyError::BadSpec("x".into()),
        PolicyError::Selection("x".into()),
        PolicyError::Encode("x".into()),
        PolicyError::Decode("x".into()),
    ]
}

fn check(variant: &str, code: u16, expected: ErrorCode, name: &str) {
    assert_eq!(
        code, expected.0,
        "{variant} reports {code}, but ErrorCode::{name} is {}",
        expected.0
    );
    assert_eq!(
        ErrorCode(code).name(),
        name,
        "{variant} reports {code}, which ErrorCode names {}",
        ErrorCode(code).name()
    );
    assert!(
        ErrorCode::ALL.contains(&ErrorCode(code)),
        "{variant}: {code} is not in ErrorCode::ALL"
    );
}

#[test]
fn every_storage_error_code_is_the_error_code_of_the_same_name() {
    let errors = storage_errors();
    let mut seen = std::collections::HashSet::new();
    for e in &errors {
        let (expected, name) = storage_expected(e);
        check(&format!("{e:?}"), e.code(), expected, name);
        assert!(
            seen.insert(e.code()),
            "two storage variants share {}",
            e.code()
        );
        assert!((300..400).contains(&e.code()), "{e:?} is outside 3xx");
    }
}

#[test]
fn every_policy_error_code_is_the_error_code_of_the_same_name() {
    let mut seen = std::collections::HashSet::new();
    for e in &policy_errors() {
        let (expected, name) = policy_expected(e);
        check(&format!("{e:?}"), e.code(), expected, name);
        assert!(
            seen.insert(e.code()),
            "two policy variants share {}",
            e.code()
        );
        assert!((400..500).contains(&e.code()), "{e:?} is outside 4xx");
    }
}

/// The other direction: every 3xx code (but `DATA_EXPIRED`, which the server
/// raises for dropped events) is reported by a storage variant, and every
/// 4xx code by a policy variant, so a code added on the protocol side alone
/// fails here too.
#[test]
fn every_storage_and_policy_error_code_has_its_variant() {
    let storage: Vec<u16> = storage_errors().iter().map(StorageError::code).collect();
    let policy: Vec<u16> = policy_errors().iter().map(PolicyError::code).collect();
    for c in ErrorCode::ALL {
        match c.0 {
            300..=399 if *c != ErrorCode::DATA_EXPIRED => {
                assert!(storage.contains(&c.0), "no storage variant reports {c}")
            }
            400..=499 => assert!(policy.contains(&c.0), "no policy variant reports {c}"),
            _ => {}
        }
    }
}
