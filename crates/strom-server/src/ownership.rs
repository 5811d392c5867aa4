//! One owner per data directory and per group file.
//!
//! A server holds an exclusive advisory lock (`flock`) on `<data_dir>/LOCK`
//! for its whole life. The kernel drops the lock when the process dies, so a
//! `kill -9` leaves nothing stale behind, and a second server on the same
//! directory fails at once with the directory and the holder's pid.
//!
//! Before a server writes a group file it did not create, it checks that the
//! file does not belong to another group that is still alive: a group file
//! carries its group's id, and a file of another group whose members answer
//! is never replaced (a server joins such a group with `--join`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use strom_net::{OutFrame, TcpTransport, Transport};
use strom_proto::{
    ErrorCode, FrameKind, GroupFile, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

use crate::error::ServerError;
use crate::group::read_group_file;

/// How long a group file's member gets to answer before it counts as dead.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// The held lock on a data directory; released when dropped or when the
/// process dies.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock on `dir` (which must exist) and records this process's
    /// pid in the lock file, or fails naming the pid that holds it.
    pub fn acquire(dir: &Path) -> Result<Self, ServerError> {
        let path = dir.join("LOCK");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ServerError::io(format!("opening the lock file {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim().parse::<u32>() {
                    Ok(pid) => format!("pid {pid}"),
                    Err(_) => "another process".to_string(),
                };
                return Err(ServerError::coded(
                    ErrorCode::DATA_DIR_LOCKED,
                    format!(
                        "data directory {} is in use by another strom server ({holder}); \
                         stop that server first, or give this one its own --data-dir",
                        dir.display()
                    ),
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(ServerError::io(
                    format!("locking the data directory {}", dir.display()),
                    e,
                ))
            }
        }
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(pid.as_bytes()))
            .map_err(|e| ServerError::io(format!("writing the lock file {}", path.display()), e))?;
        Ok(DataDirLock { _file: file })
    }
}

/// May a server of group `group_id` write `path`? Yes when the file is
/// missing or unreadable, belongs to this group, or names only members that
/// no longer answer (then the replacement is logged). No when another
/// group's member still answers.
pub async fn check_group_file(path: &Path, group_id: u64) -> Result<(), ServerError> {
    if !path.exists() {
        return Ok(());
    }
    let group = match read_group_file(path) {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "replacing an unreadable group file");
            return Ok(());
        }
    };
    if group.group_id != 0 && group.group_id == group_id {
        return Ok(());
    }
    if let Some(live) = first_live_member(&group).await {
        return Err(ServerError::coded(
            ErrorCode::GROUP_FILE_LIVE,
            format!(
                "group file {} belongs to a running group (member {} at {} answers); \
                 refusing to overwrite it. Join that group with `strom server --join {}`, \
                 or give this server another --group-file",
                path.display(),
                live.0,
                live.1,
                path.display()
            ),
        ));
    }
    tracing::info!(
        path = %path.display(),
        members = group.members.len(),
        "replacing a group file whose members are all gone"
    );
    Ok(())
}

async fn first_live_member(group: &GroupFile) -> Option<(u32, String)> {
    let mut probes = tokio::task::JoinSet::new();
    for m in &group.members {
        let (id, addr) = (m.id, m.addr.clone());
        probes.spawn(async move { probe(&addr).await.then_some((id, addr)) });
    }
    while let Some(r) = probes.join_next().await {
        if let Ok(Some(live)) = r {
            return Some(live);
        }
    }
    None
}

/// Does a Strom server answer `Hello` at `addr`?
async fn probe(addr: &str) -> bool {
    let attempt = async {
        let mut conn = TcpTransport::default().connect(addr).await.ok()?;
        let hello = Request::Hello {
            client: "strom-server group-file check".into(),
            max_version: PROTOCOL_VERSION,
            nonce: Default::default(),
        };
        conn.writer
            .write(&OutFrame::request(MIN_PROTOCOL_VERSION, 1, &hello))
            .await
            .ok()?;
        conn.writer.flush().await.ok()?;
        let (h, body) = conn.reader.next().await.ok()??;
        (h.kind == FrameKind::Response).then_some(())?;
        matches!(
            Response::decode(h.version, h.opcode, &body),
            Ok(Response::Hello { .. })
        )
        .then_some(())
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, attempt).await,
        Ok(Some(()))
    )
}
