//! Where a stage-out goes, and how it becomes complete. Everything is
//! written under a hidden temporary directory next to the final one
//! (`DIR/.TOPIC.stage-out-PID.tmp`); `MANIFEST.json` is written last
//! (temp name, fsync, rename), then the whole directory is renamed to
//! `DIR/TOPIC`. So `DIR/TOPIC` exists only once a stage-out is complete,
//! and a crash leaves at most a hidden `.tmp` directory behind.
//!
//! An existing `DIR/TOPIC` is never overwritten without `--force`, and
//! even with it only when it holds a stage-out manifest of the same topic.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The manifest's file name inside `DIR/TOPIC`.
pub const MANIFEST: &str = "MANIFEST.json";
/// The manifest's `format_name`.
pub const FORMAT_NAME: &str = "strom-stage-out";

/// The temporary directory a stage-out is written into, and where it goes.
pub struct Target {
    /// `--to`.
    parent: PathBuf,
    /// `DIR/TOPIC`.
    final_dir: PathBuf,
    /// `DIR/.TOPIC.stage-out-PID.tmp`, removed on drop unless committed.
    tmp_dir: PathBuf,
    /// `--force` and `DIR/TOPIC` exists (checked to be a stage-out).
    replace: bool,
    committed: bool,
}

/// Refuses topic names that are not one plain path component.
fn check_name(topic: &str) -> anyhow::Result<()> {
    let plain =
        !topic.is_empty() && topic != "." && topic != ".." && !topic.contains(['/', '\\', '\0']);
    if !plain {
        bail!("topic name '{topic}' cannot name a directory; stage-out needs a plain file name");
    }
    Ok(())
}

/// `--to`: an existing directory, or one that can be created.
fn check_parent(to: &Path) -> anyhow::Result<()> {
    match fs::metadata(to) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("--to {}: is a file, not a directory", to.display()),
        Err(e) if e.kind() == ErrorKind::NotFound => fs::create_dir_all(to)
            .with_context(|| format!("--to {}: cannot create the directory", to.display())),
        Err(e) => Err(e).with_context(|| format!("--to {}: cannot read it", to.display())),
    }
}

/// What the manifest at `dir` says, if it is a stage-out manifest.
fn read_manifest(dir: &Path) -> Option<serde_json::Value> {
    let text = fs::read(dir.join(MANIFEST)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    (v["format_name"] == FORMAT_NAME).then_some(v)
}

/// Whether an existing `DIR/TOPIC` may be replaced; errors say why not.
fn check_existing(final_dir: &Path, topic: &str, force: bool) -> anyhow::Result<bool> {
    if fs::symlink_metadata(final_dir).is_err() {
        return Ok(false);
    }
    let shown = final_dir.display();
    match read_manifest(final_dir) {
        Some(m) if m["topic"] == topic => {
            if !force {
                bail!(
                    "{shown} already holds a complete stage-out of topic '{topic}' \
                     ({} events, format {}); pass --force to replace it",
                    m["events"],
                    m["format"]
                );
            }
            Ok(true)
        }
        Some(m) => bail!(
            "{shown} holds a stage-out of another topic ({}); not touching it, even with --force",
            m["topic"]
        ),
        None => bail!(
            "{shown} exists and is not a complete stage-out (no valid {MANIFEST}); \
             not touching it, even with --force: remove it yourself"
        ),
    }
}

/// Hidden leftovers of earlier runs that did not finish.
fn stale_tmp_dirs(parent: &Path, topic: &str) -> Vec<PathBuf> {
    let prefix = format!(".{topic}.stage-out-");
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(&prefix) && (n.ends_with(".tmp") || n.ends_with(".old"))
        })
        .map(|e| e.path())
        .collect()
}

impl Target {
    /// Checks `--to`, the topic name and any existing stage-out, then
    /// creates the temporary directory.
    pub fn prepare(to: &Path, topic: &str, force: bool) -> anyhow::Result<Target> {
        check_name(topic)?;
        check_parent(to)?;
        let final_dir = to.join(topic);
        let replace = check_existing(&final_dir, topic, force)?;
        for stale in stale_tmp_dirs(to, topic) {
            tracing::warn!(
                "{} is left from a stage-out that did not finish; remove it when no stage-out runs",
                stale.display()
            );
        }
        let tmp_dir = to.join(format!(".{topic}.stage-out-{}.tmp", std::process::id()));
        fs::create_dir(&tmp_dir).with_context(|| {
            format!(
                "--to {}: cannot write there (creating {})",
                to.display(),
                tmp_dir.display()
            )
        })?;
        Ok(Target {
            parent: to.to_path_buf(),
            final_dir,
            tmp_dir,
            replace,
            committed: false,
        })
    }

    /// The directory to write into until [`commit`](Self::commit).
    pub fn dir(&self) -> &Path {
        &self.tmp_dir
    }

    /// Writes the manifest last, then moves the stage-out to `DIR/TOPIC`
    /// (replacing the old one with `--force`). Returns `DIR/TOPIC`.
    pub fn commit(mut self, manifest: &serde_json::Value) -> anyhow::Result<PathBuf> {
        let text = serde_json::to_vec_pretty(manifest)?;
        write_synced(&self.tmp_dir, MANIFEST, &text)?;
        sync_dir(&self.tmp_dir)?;
        let old = self.parent.join(format!(
            ".{}.stage-out-{}.old",
            file_name(&self.final_dir),
            std::process::id()
        ));
        if self.replace {
            fs::rename(&self.final_dir, &old).with_context(|| {
                format!(
                    "moving the old stage-out {} aside",
                    self.final_dir.display()
                )
            })?;
        }
        fs::rename(&self.tmp_dir, &self.final_dir).with_context(|| {
            format!(
                "renaming {} to {}",
                self.tmp_dir.display(),
                self.final_dir.display()
            )
        })?;
        self.committed = true;
        sync_dir(&self.parent)?;
        if self.replace {
            fs::remove_dir_all(&old)
                .with_context(|| format!("removing the old stage-out, now {}", old.display()))?;
        }
        Ok(self.final_dir.clone())
    }
}

impl Drop for Target {
    /// An unfinished stage-out is removed, so it cannot be mistaken for one.
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = fs::remove_dir_all(&self.tmp_dir) {
                tracing::warn!(
                    "could not remove the unfinished stage-out {}: {e}",
                    self.tmp_dir.display()
                );
            }
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Writes `dir/name` through `name.tmp`, fsynced before the rename.
pub fn write_synced(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    let dest = dir.join(name);
    fs::rename(&tmp, &dest).with_context(|| format!("renaming to {}", dest.display()))
}

/// fsync of a directory, so the names in it are durable.
pub fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync of directory {}", dir.display()))
}

/// fsync of a file written earlier.
pub fn sync_file(path: &Path) -> anyhow::Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("fsync of {}", path.display()))
}
