//! Keeps this server's copy of the registry's security table (ACLs,
//! revoked tokens) current, for [`crate::service::Access`]: every
//! `acl_refresh_ms` it asks the registry (here, or at the master or the
//! quorum's leader) for the table if its version moved. Runs only with
//! `auth` on.

use std::sync::Arc;
use std::time::Duration;

use strom_auth::SecurityTable;
use strom_proto::{Request, Response};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ServerConfig;
use crate::service::Services;

/// The super users: the configured ones and the uid running the server.
pub fn super_users(config: &ServerConfig) -> Vec<String> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    let mut v = config.super_users.clone();
    v.push(format!("uid:{me}"));
    v.push(format!("User:{}", crate::service::INTERNAL_SUBJECT));
    v
}

/// Installs the registry's table before the server accepts anyone, when
/// the registry is here (a group without a quorum): no request of a new
/// server's first clients is refused for want of it. Other members (and a
/// quorum's voters) read it every `acl_refresh_ms`.
pub async fn load_local(state: &Arc<Services>) {
    if let (true, Some(r)) = (state.access.enabled(), state.control.master_registry()) {
        state.access.set_table(r.security_table().await);
        // And every change committed here is decided by at once, before
        // it is answered: an admin's next request (from any front end of
        // this server) sees the ACL it just added.
        let weak = Arc::downgrade(state);
        r.on_security_change(Box::new(move |t| {
            if let Some(s) = weak.upgrade() {
                s.access.set_table(t.clone());
            }
        }));
    }
}

pub fn spawn_security_sync(
    state: Arc<Services>,
    mut stopped: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    if !state.access.enabled() {
        return None;
    }
    Some(tokio::spawn(async move {
        let every = Duration::from_millis(state.config.acl_refresh_ms);
        // Until a first table arrives (a member before it joined, a quorum
        // before it elected), ask often: requests are refused meanwhile.
        let first = every.min(Duration::from_millis(100));
        let mut fresh = state.access.loaded();
        loop {
            refresh(&state, &mut fresh).await;
            let wait = if fresh { every } else { first };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stopped.changed() => break,
            }
        }
    }))
}

/// One ask; `fresh` is set once a table was installed, so the first
/// version (0, an empty table) is installed too.
async fn refresh(state: &Services, fresh: &mut bool) {
    if let Some(r) = state.control.master_registry() {
        // The registry is here: read it whole (SCRAM keys included).
        let t = r.security_table().await;
        if !*fresh || t.version != state.access.version() {
            state.access.set_table(t);
            *fresh = true;
        }
        return;
    }
    let have = match *fresh {
        true => state.access.version(),
        false => u64::MAX,
    };
    match state
        .control
        .ask_registry(Request::SecurityTable { have })
        .await
    {
        Ok(Response::SecurityTable { json, .. }) if json.is_empty() => {}
        Ok(Response::SecurityTable { version, json }) => {
            match serde_json::from_str::<SecurityTable>(&json) {
                Ok(t) => {
                    tracing::debug!(
                        version,
                        acls = t.acls.len(),
                        "read the group's security table"
                    );
                    state.access.set_table(t);
                    *fresh = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the registry sent a security table that does not parse")
                }
            }
        }
        Ok(other) => tracing::warn!(answer = ?other.opcode(), "unexpected answer to SecurityTable"),
        Err(e) => tracing::debug!(error = %e, "could not read the group's security table yet"),
    }
}
