//! Tiered storage of file partitions (docs/tiering.md): with a server tier
//! (`tier_dir` or `tier_url`), each file partition opens as a
//! `strom_storage::tier::TieredLog`, and a background thread per partition
//! runs its copy pass every `tier_check_ms`, off the append path. The tier
//! store is built once per location and shared by every partition of the
//! process. The copies of a replicated partition share one key prefix in
//! the tier: before each pass the thread gives the log its role, from the
//! partition's replication ([`tier_role`]): the leader copies closed
//! segments below its high watermark, followers record the leader's copies
//! once they verified them against their own files.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strom_proto::TopicSpec;
use strom_storage::tier::{DirTier, ObjectTier, TierRole, TierSettings, TierStore, TieredLog};
use strom_storage::{FileLog, LogConfig, PartitionLog};

use super::{OpenMode, PartitionManager};
use crate::config::ServerConfig;
use crate::error::ServerError;

type Stores = Vec<(String, Arc<dyn TierStore>)>;

/// Tier stores by location, built on first use.
static STORES: Mutex<Stores> = Mutex::new(Vec::new());

/// The server's tier, if it has one.
fn tier_store(config: &ServerConfig) -> Result<Option<Arc<dyn TierStore>>, ServerError> {
    let location = match (&config.tier_dir, &config.tier_url) {
        (Some(d), _) => format!("dir:{}", d.display()),
        (None, Some(u)) => format!("url:{u}"),
        (None, None) => return Ok(None),
    };
    let mut stores = STORES.lock();
    if let Some((_, s)) = stores.iter().find(|(l, _)| *l == location) {
        return Ok(Some(s.clone()));
    }
    let store: Arc<dyn TierStore> = match (&config.tier_dir, &config.tier_url) {
        (Some(d), _) => Arc::new(DirTier::new(d)?),
        (None, Some(u)) => Arc::new(ObjectTier::from_url(u, &[])?),
        (None, None) => return Ok(None),
    };
    tracing::info!(tier = %store.describe(), "tiered storage enabled for file partitions");
    stores.push((location, store.clone()));
    Ok(Some(store))
}

/// The key prefix of a partition in `topics/<topic>.<id>/<p>`:
/// `<topic>.<id>/<p>`.
fn prefix(dir: &Path) -> String {
    let name = |p: Option<&Path>| {
        p.and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    format!("{}/{}", name(dir.parent()), name(Some(dir)))
}

/// Opens a file partition's log: tiered when the server has a tier and
/// the topic does not opt out (`tier: Some(false)`); the topic's
/// `local_retention_*` override the server's. A copy of a replicated
/// partition opens as a follower that records nothing until the tier
/// thread knows its role. Returns whether it is tiered.
pub(super) fn open_file_log(
    spec: &TopicSpec,
    dir: &Path,
    config: &ServerConfig,
    log_config: LogConfig,
    mode: OpenMode,
) -> Result<(Arc<dyn PartitionLog>, bool), ServerError> {
    let wanted = spec.tier != Some(false);
    let store = match tier_store(config)? {
        Some(s) if wanted => s,
        store => {
            if spec.tier == Some(true) && store.is_none() {
                tracing::warn!(topic = %spec.name, "the topic asks for tiered storage but this server has no tier_dir or tier_url; its partitions stay local");
            }
            if dir.join(strom_storage::tier::MANIFEST_FILE).exists() {
                tracing::warn!(dir = %dir.display(), "the partition was tiered but opens without its tier: offsets kept only in the tier are not served");
            }
            let log = match mode {
                OpenMode::Existing => {
                    FileLog::open_with(super::vfs::partition_vfs(), dir, log_config)?
                }
                OpenMode::New => {
                    FileLog::create_with(super::vfs::partition_vfs(), dir, log_config)?
                }
            };
            return Ok((Arc::new(log), false));
        }
    };
    let settings = TierSettings {
        prefix: prefix(dir),
        local_retention_bytes: spec
            .local_retention_bytes
            .or(config.tier_local_retention_bytes),
        local_retention_ms: spec.local_retention_ms.or(config.tier_local_retention_ms),
        cache_segments: config.tier_cache_segments as usize,
        // As `PartitionManager::start` decides it: more than one copy, or
        // a leader-epoch history (a partition that moved).
        role: match spec.replicas() > 1 || dir.join(super::EPOCHS_FILE).exists() {
            false => TierRole::Sole,
            true => TierRole::Follower { below: 0 },
        },
    };
    let create = mode == OpenMode::New;
    let log = TieredLog::open_with(
        super::vfs::partition_vfs(),
        dir,
        log_config,
        create,
        store,
        settings,
    )?;
    Ok((Arc::new(log), true))
}

/// Starts the partition's tier thread: a copy pass every `every`, until
/// the partition shuts down (which unparks it).
pub(super) fn spawn_tier_thread(
    pm: &Arc<PartitionManager>,
    every: Duration,
) -> Result<(), ServerError> {
    let p = pm.clone();
    let thread = super::spawn(pm, "tier", move || {
        while !p.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(every);
            if p.stop.load(Ordering::Acquire) {
                break;
            }
            // One segment per call, so a shutdown waits for one copy at most.
            while !p.stop.load(Ordering::Acquire) {
                p.log.set_tier_role(tier_role(&p));
                match p.log.tier_pass() {
                    Ok(0) => break,
                    Ok(_) => {
                        tracing::debug!(topic = %p.topic, partition = p.id, "copied a segment to the tier")
                    }
                    Err(e) => {
                        tracing::warn!(topic = %p.topic, partition = p.id, error = %e, "tier copy failed; retrying on the next pass");
                        break;
                    }
                }
            }
        }
    })?;
    pm.threads.lock().push(thread);
    Ok(())
}

/// The partition's place among its copies, for its tier passes: the only
/// copy, the leader (copies up to its high watermark, which every in-sync
/// copy holds and no failover truncates), or a follower or a copy without
/// a role yet (records the leader's copies up to the high watermark it
/// knows).
fn tier_role(p: &PartitionManager) -> TierRole {
    if !p.replicated() {
        return TierRole::Sole;
    }
    let below = p.visible();
    match p.replication() {
        Some(r) if r.is_leader() => TierRole::Leader { below },
        _ => TierRole::Follower { below },
    }
}
