//! How a server takes its place in a metadata quorum at startup
//! (docs/replication.md): member 0 of a new group starts the quorum as its
//! only voter (the leader then grows it to `meta_voters` as members join);
//! a restarted voter or learner starts its quorum handle before it rejoins,
//! so it can vote in the election that finds the next leader; a new member
//! starts its handle when the leader first reaches it.

use std::collections::BTreeMap;
use std::path::Path;

use strom_meta::MetaError;
use strom_proto::ErrorCode;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::ownership::check_group_file;
use crate::registry::QuorumSetup;
use crate::service::{QuorumPlace, Services};

/// The quorum's directory under a data dir.
const META_DIR: &str = "meta";

/// Files of a registry kept without a quorum (`meta_voters = 1`).
const LOCAL_REGISTRY: [&str; 3] = ["registry.log", "registry.snapshot", "registry.json"];

/// Where this server keeps its share of the quorum, and how it leads.
pub(crate) fn place(
    config: &ServerConfig,
    expected: u32,
    stop: watch::Receiver<bool>,
) -> QuorumPlace {
    QuorumPlace {
        dir: config.data_dir.join(META_DIR),
        setup: QuorumSetup {
            group_file: config.group_file.clone().or_else(|| config.join.clone()),
            expected,
            voters: config.meta_voters,
            default_lease_ms: config.producer_lease_ms,
            member_timeout_ms: config.member_timeout_ms,
        },
        stop,
    }
}

/// Whether the server of `data_dir` took part in a metadata quorum.
pub(crate) fn took_part(data_dir: &Path) -> bool {
    data_dir.join(META_DIR).exists()
}

/// Starts the quorum handle where startup must: on member 0 (creating a
/// one-voter quorum in a new group), and on any member that took part
/// before (its id is in `member-id`).
pub(crate) async fn boot(state: &Services, first: bool) -> Result<(), ServerError> {
    let data_dir = &state.config.data_dir;
    let dir = data_dir.join(META_DIR);
    let fresh = !took_part(data_dir);
    if first {
        if fresh {
            refuse_local_registry(data_dir)?;
            if let Some(g) = &state.config.group_file {
                check_group_file(g, 0).await?;
            }
        }
        let meta = state.control.start_quorum().await?;
        let me = BTreeMap::from([(0, state.control.addr().to_string())]);
        match meta.initialize(me).await {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "started a new metadata quorum; the leader adds voters as members join")
            }
            Err(MetaError::AlreadyInitialized) => {}
            Err(e) => return Err(ServerError::coded(ErrorCode(e.code()), e.to_string())),
        }
        return Ok(());
    }
    if fresh {
        return Ok(());
    }
    match crate::member_id::read(data_dir) {
        Some(id) => {
            state.control.link().set_member(id);
            state.control.start_quorum().await?;
            Ok(())
        }
        None => {
            tracing::warn!(dir = %dir.display(), "a metadata quorum directory without a member-id; it is started when the leader reaches this member");
            Ok(())
        }
    }
}

/// A data dir whose registry was kept without a quorum cannot start one:
/// moving that registry into a quorum is not supported.
fn refuse_local_registry(data_dir: &Path) -> Result<(), ServerError> {
    match LOCAL_REGISTRY.iter().find(|f| data_dir.join(f).exists()) {
        Some(f) => Err(ServerError::coded(
            ErrorCode::INVALID_ARGUMENT,
            format!(
                "{} holds a registry kept without a quorum ({f}); meta_voters above 1 needs a new group (moving a registry into a quorum is not supported)",
                data_dir.display()
            ),
        )),
        None => Ok(()),
    }
}
