//! The one check for names that become file or directory names: topics
//! (`topics/<name>/`), consumer groups (`groups/<name>.ledger`) and
//! anything else a peer names and storage turns into a path. A name that
//! passes is a single path component that cannot leave its directory.

use crate::{Result, StorageError};

/// The longest such name, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Whether `name` is 1-200 bytes from `[A-Za-z0-9._-]` and not `.` or `..`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Refuses a `what` name (`"topic"`, `"consumer group"`) that could not be
/// one safe path component, naming it (shortened, escaped) in the error.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    if is_valid_name(name) {
        return Ok(());
    }
    let shown: String = name
        .chars()
        .take(64)
        .flat_map(char::escape_default)
        .collect();
    let more = if name.chars().count() > 64 { "..." } else { "" };
    Err(StorageError::InvalidArgument(format!(
        "invalid {what} name '{shown}{more}': use 1-{MAX_NAME_LEN} characters from \
         [A-Za-z0-9._-], not '.' or '..'"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_their_directory_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a\\b",
            "x\0y",
            "../../../../tmp/x",
            "é",
        ] {
            assert!(check_name("consumer group", bad).is_err(), "{bad:?}");
        }
        assert!(check_name("topic", &"a".repeat(MAX_NAME_LEN + 1)).is_err());
        for good in ["t", "orders.v2", "a-b_c", "...", &"a".repeat(MAX_NAME_LEN)] {
            assert!(check_name("topic", good).is_ok(), "{good:?}");
        }
        let e = check_name("consumer group", "../x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("consumer group name '../x'"), "{e}");
    }
}
