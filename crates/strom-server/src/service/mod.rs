//! The protocol-neutral service layer: what a server does, as typed async
//! functions over domain values. Front ends (the native protocol in
//! `native/`; later the Kafka front end, the HTTP endpoint and the C API's
//! embedded mode) decode their requests, call these, and encode the
//! answers. Nothing here knows a wire format.
//!
//! - [`DataService`]: produce, subscribe positions, fetch, commit, scrub and
//!   offsets on the partitions this server hosts.
//! - [`ControlService`]: the server's limits and identity, the registry's
//!   operations (topics, producers, the group) on the master, and the
//!   requests the master sends to members about their partitions.
//! - [`Validation`]: produced batches checked against their topic's
//!   validator, for clients that did not validate.
//!
//! Both depend only downward: on the registry, the member link, the host
//! and its partition managers. `server.rs` builds them.

pub mod access;
mod control;
mod data;
pub mod groups;
mod offsets;
mod peer;
mod registry_ops;
mod tap;
mod tap_health;
mod validate;

pub use access::Access;
pub use control::{ControlService, QuorumPlace};
pub use data::DataService;
pub use peer::ReplicaFetch;
pub use validate::{CheckError, Invalid, Validation};

use crate::config::ServerConfig;
use crate::ownership::DataDirLock;

/// The services of one server process, shared by all its front ends.
pub struct Services {
    pub config: ServerConfig,
    pub data: DataService,
    pub control: ControlService,
    /// Who may do what: the security table and the decision.
    pub access: Access,
    /// This server's copy of the quota table and its meters.
    pub quotas: std::sync::Arc<crate::quota::Quotas>,
    /// The audit trail: changes and refusals, to the log and `strom.audit`.
    pub audit: crate::audit::AuditLog,
    /// Server-wide counters the front ends update (the metrics tap).
    pub stats: crate::stats::ServerStats,
    /// Set once the registry says this member left the group (it was
    /// drained or removed): the process should stop.
    pub left: tokio::sync::watch::Sender<bool>,
    /// Held for the server's whole life: one server per data directory.
    pub(crate) _lock: DataDirLock,
}

/// The subject of the tokens a server makes for its own in-process
/// clients (the transform host): a super user of every group.
pub const INTERNAL_SUBJECT: &str = "strom.member";

impl Services {
    /// The TLS server configuration of `tls_cert` (with `tls_client_ca`),
    /// for a front end that terminates TLS itself; `None` without one.
    pub fn tls_server_config(
        &self,
    ) -> Result<
        Option<std::sync::Arc<strom_net::tokio_rustls::rustls::ServerConfig>>,
        crate::error::ServerError,
    > {
        let (Some(cert), Some(key)) = (&self.config.tls_cert, &self.config.tls_key) else {
            return Ok(None);
        };
        strom_net::server_config(cert, key, self.config.tls_client_ca.as_deref())
            .map(Some)
            .map_err(|e| {
                crate::error::ServerError::coded(
                    strom_proto::ErrorCode::INVALID_ARGUMENT,
                    e.to_string(),
                )
            })
    }

    /// A token for this server's own in-process clients; it never leaves
    /// the process. `Ok(None)` without `auth`; an error until the cluster
    /// secret is known (a joining member reads it before it joins).
    pub fn internal_token(&self) -> Result<Option<String>, String> {
        if !self.access.enabled() {
            return Ok(None);
        }
        let secret = self
            .control
            .link()
            .peers()
            .identity()
            .secret()
            .ok_or("this member has not read its group's cluster secret yet")?;
        let claims =
            strom_auth::Claims::new(INTERNAL_SUBJECT, access::now_secs(), 10 * 365 * 86_400)
                .map_err(|e| e.to_string())?;
        secret
            .token_key()
            .sign(&claims)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// The principal a Strom token proves, checked with this group's key
    /// (every front end: native `Authenticate`, Kafka SASL).
    pub fn authenticate_token(
        &self,
        token: &str,
    ) -> Result<strom_auth::Principal, crate::error::ServerError> {
        let key = self
            .control
            .link()
            .peers()
            .identity()
            .secret()
            .map(|s| s.token_key());
        self.access.authenticate(key.as_ref(), token)
    }
}
