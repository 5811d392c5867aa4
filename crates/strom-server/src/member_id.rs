//! The `member-id` file of a data dir: which member of its group the data
//! belongs to. Every member records it, member 0 (the launched master, or
//! the quorum's founder) included, so a server restarted on the data dir,
//! whether by its launcher or with `--join`, comes back as the same member
//! and keeps its copies. A data dir that holds a member's data without the
//! file is refused for `--join` with what to do: joining would make it a
//! new member, which releases the copies it holds.

use std::path::Path;

use strom_proto::ErrorCode;

use crate::error::ServerError;
use crate::group::write_atomic;

/// The file's name in a data dir.
pub const FILE: &str = "member-id";

/// The member a data dir belongs to, if it records one.
pub fn read(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join(FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Records `id` as the data dir's member (atomically, once).
pub fn record(data_dir: &Path, id: u32) -> Result<(), ServerError> {
    if read(data_dir) == Some(id) {
        return Ok(());
    }
    write_atomic(&data_dir.join(FILE), id.to_string().as_bytes())
}

fn refuse(m: String) -> ServerError {
    ServerError::coded(ErrorCode::INVALID_ARGUMENT, m)
}

/// Whether the dir holds what a member keeps: partitions, or a share in
/// the metadata quorum.
fn holds_member_data(data_dir: &Path) -> bool {
    let non_empty = |d: &str| {
        std::fs::read_dir(data_dir.join(d)).is_ok_and(|mut entries| entries.next().is_some())
    };
    non_empty("topics") || non_empty("meta")
}

/// Checks a `--join` on `data_dir` (with `--member-id asked`, if given):
/// the member it joins as is the one the dir records; a dir with a
/// member's data and no record is refused.
pub fn check_join(data_dir: &Path, asked: Option<u32>) -> Result<Option<u32>, ServerError> {
    let dir = data_dir.display();
    match (read(data_dir), asked) {
        (Some(kept), Some(asked)) if kept != asked => Err(refuse(format!(
            "--member-id {asked}, but the data dir {dir} belongs to member {kept}; \
             a replacement starts on an empty data dir"
        ))),
        (Some(kept), _) => Ok(Some(kept)),
        (None, asked) if holds_member_data(data_dir) => Err(refuse(format!(
            "the data dir {dir} holds a member's partitions but no {FILE} file, so joining \
             would make it a new member and release them; if it was member N of this group \
             (member 0 of a launched group: rank-0), write its id with `echo N > {dir}/{FILE}` \
             and start it again{}; to join as a new member, start on an empty data dir",
            match asked {
                Some(a) => format!(" (--member-id {a} is not enough on its own)"),
                None => String::new(),
            }
        ))),
        (None, asked) => Ok(asked),
    }
}

/// Checks that a server starting as member 0 (a launched rank 0, or a
/// server on its own) is not on another member's data dir, and records it.
pub fn record_master(data_dir: &Path) -> Result<(), ServerError> {
    match read(data_dir) {
        Some(kept) if kept != 0 => Err(refuse(format!(
            "the data dir {} belongs to member {kept}, but this server starts as member 0 \
             (rank 0, or a server of its own); start member {kept} with --join on it, or \
             give member 0 its own data dir",
            data_dir.display()
        ))),
        _ => record(data_dir, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_takes_the_recorded_id_and_refuses_another() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(check_join(d.path(), None).unwrap(), None, "an empty dir");
        assert_eq!(check_join(d.path(), Some(4)).unwrap(), Some(4));
        record(d.path(), 2).unwrap();
        assert_eq!(check_join(d.path(), None).unwrap(), Some(2));
        assert_eq!(check_join(d.path(), Some(2)).unwrap(), Some(2));
        let e = check_join(d.path(), Some(3)).unwrap_err().to_string();
        assert!(e.contains("belongs to member 2"), "{e}");
    }

    #[test]
    fn a_dir_with_partitions_and_no_record_is_refused_with_what_to_do() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("topics/t.0/0")).unwrap();
        let e = check_join(d.path(), None).unwrap_err().to_string();
        assert!(
            e.contains("no member-id file") && e.contains("echo N >"),
            "{e}"
        );
        record_master(d.path()).unwrap();
        assert_eq!(read(d.path()), Some(0));
        assert_eq!(check_join(d.path(), None).unwrap(), Some(0));
    }

    #[test]
    fn member_0_does_not_start_on_another_members_dir() {
        let d = tempfile::tempdir().unwrap();
        record(d.path(), 5).unwrap();
        let e = record_master(d.path()).unwrap_err().to_string();
        assert!(e.contains("belongs to member 5"), "{e}");
    }
}
