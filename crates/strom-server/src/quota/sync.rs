//! Keeps this server's copy of the registry's quota table current: every
//! `acl_refresh_ms` it reads the table (here, or from the master or the
//! quorum's leader) if its version moved. Runs with or without `auth`:
//! topic quotas apply to every client.

use std::sync::Arc;
use std::time::Duration;

use strom_proto::{Request, Response};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::QuotaTable;
use crate::service::Services;

pub fn spawn(state: Arc<Services>, mut stopped: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_millis(state.config.acl_refresh_ms);
        loop {
            refresh(&state).await;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.changed() => break,
            }
        }
    })
}

/// One read; the table is installed only when its version moved.
pub async fn refresh(state: &Services) {
    let have = state.quotas.version();
    if let Some(r) = state.control.master_registry() {
        let t = r.quota_table().await;
        if t.version != have {
            state.quotas.set_table(t);
        }
        return;
    }
    match state
        .control
        .ask_registry(Request::QuotaTable { have })
        .await
    {
        Ok(Response::QuotaTable { json, .. }) if json.is_empty() => {}
        Ok(Response::QuotaTable { json, .. }) => match serde_json::from_str::<QuotaTable>(&json) {
            Ok(t) => state.quotas.set_table(t),
            Err(e) => {
                tracing::warn!(error = %e, "the registry sent a quota table that does not parse")
            }
        },
        Ok(other) => tracing::warn!(answer = ?other.opcode(), "unexpected answer to QuotaTable"),
        Err(e) => tracing::debug!(error = %e, "could not read the group's quota table yet"),
    }
}
