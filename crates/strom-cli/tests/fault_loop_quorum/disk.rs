//! The quorum fault loop's disk faults: for a while, a joined member's
//! copies of the partitions it follows get every write refused with ENOSPC
//! (a full disk) or every fdatasync failed with EIO, through the member's
//! fault control file (`STROM_TEST_IO_FAULTS`, `strom_storage::faulty`).
//! A full disk clears by itself; a copy whose fdatasync failed stops until
//! it is reopened, so the member is restarted after the fault clears.
//! Meanwhile its partitions' leaders must acknowledge an `acks=all` push
//! only once `min_in_sync` copies hold it durably, and the checker must
//! still find every acknowledged event.

use std::path::{Path, PathBuf};
use std::time::Duration;

use strom_client::Driver;

use crate::common::faults::Log;
use crate::common::Rng;

/// The variable naming a member's fault control file.
pub const FAULTS_VAR: &str = "STROM_TEST_IO_FAULTS";

/// The fault control file of the member whose data dir is `dir`.
pub fn control(dir: &Path) -> PathBuf {
    dir.with_extension("faults")
}

/// Puts `faults` in force on the member of `dir` (atomically).
fn set(dir: &Path, faults: &str, log: &Log) {
    let tmp = dir.with_extension("faults.tmp");
    if let Err(e) = std::fs::write(&tmp, faults).and_then(|()| std::fs::rename(&tmp, control(dir)))
    {
        log.fail(format!("writing {}: {e}", control(dir).display()));
    }
}

/// The path parts of the copies of `topic` member `id` follows: its
/// partitions' directories, `/<topic>.<topic id>/<p>/`.
fn followed(d: &Driver, dir: &Path, topic: &str, id: u32) -> Vec<(u32, String)> {
    let Ok(info) = d.describe(topic) else {
        return Vec::new();
    };
    let prefix = format!("{topic}.");
    let Some(topic_dir) = std::fs::read_dir(dir.join("topics"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&prefix))
    else {
        return Vec::new();
    };
    info.partitions
        .iter()
        .filter(|p| p.member != id && p.replicas.contains(&id))
        .map(|p| (p.id, format!("/{topic_dir}/{}/", p.id)))
        .collect()
}

/// One disk fault on member `id` (data dir `dir`): held 0.5-5 s (past the
/// 3 s after which a follower leaves the in-sync replicas, or not), then
/// cleared; `restart` kills and restarts the member after an fsync fault.
pub fn cycle(
    rng: &mut Rng,
    d: &Driver,
    topic: &str,
    (id, dir): (u32, &Path),
    restart: &mut dyn FnMut(),
    log: &Log,
) {
    let copies = followed(d, dir, topic, id);
    if copies.is_empty() {
        log.say(format!(
            "member {id} follows no partition now; no disk fault"
        ));
        return;
    }
    let (what, rule) = match rng.below(2) {
        0 => ("disk full (ENOSPC on every write)", "write ENOSPC"),
        _ => ("fsync fails (EIO)", "sync EIO"),
    };
    let lines: String = copies
        .iter()
        .map(|(_, part)| format!("{rule} {part}\n"))
        .collect();
    let hold = Duration::from_millis(500 + rng.below(4500));
    let parts: Vec<u32> = copies.iter().map(|(p, _)| *p).collect();
    log.say(format!(
        "disk fault on member {id}: {what} on its copies of partitions {parts:?}, for {hold:?}"
    ));
    set(dir, &lines, log);
    std::thread::sleep(hold);
    set(dir, "", log);
    if rule.starts_with("sync") {
        restart();
        log.say(format!("disk fault on member {id} cleared; restarted it"));
    } else {
        log.say(format!("disk fault on member {id} cleared"));
    }
}
