//! The group file: written atomically (temp file, fsync, rename) so a client
//! never reads a half-written one.

use std::io::Write;
use std::path::Path;

use strom_proto::GroupFile;

use crate::error::ServerError;

pub fn write_group_file(path: &Path, group: &GroupFile) -> Result<(), ServerError> {
    let text = serde_json::to_vec_pretty(group)
        .map_err(|e| ServerError::io("encoding the group file", std::io::Error::other(e)))?;
    write_atomic(path, &text)
}

pub fn read_group_file(path: &Path) -> Result<GroupFile, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("cannot read group file {}: {e}", path.display()))?;
    let g: GroupFile = serde_json::from_slice(&text)
        .map_err(|e| format!("group file {} is not valid: {e}", path.display()))?;
    if g.members.is_empty() {
        return Err(format!("group file {} lists no members", path.display()));
    }
    Ok(g)
}

/// Reads a JSON state file; a missing file is the default (a fresh start).
pub(crate) fn read_json_or_default<T: serde::de::DeserializeOwned + Default>(
    path: &Path,
) -> Result<T, ServerError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            ServerError::coded(
                strom_proto::ErrorCode::CORRUPT,
                format!("{} is not valid: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(ServerError::io(format!("reading {}", path.display()), e)),
    }
}

/// Encodes `value` as JSON and replaces `path` with it atomically and durably.
pub(crate) fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), ServerError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| {
        ServerError::io(
            format!("encoding {}", path.display()),
            std::io::Error::other(e),
        )
    })?;
    write_atomic(path, &bytes)
}

/// Replaces `path` with `bytes` atomically and durably.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ServerError> {
    let ctx = |what: &str| format!("{what} {}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| ServerError::io(ctx("creating the directory of"), e))?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)
        .map_err(|e| ServerError::io(ctx("creating a temp file for"), e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| ServerError::io(ctx("writing"), e))?;
    std::fs::rename(&tmp, path).map_err(|e| ServerError::io(ctx("renaming into"), e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}
