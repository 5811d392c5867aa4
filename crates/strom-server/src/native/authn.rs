//! Who a native connection is: the principal it starts with (a same-node
//! peer's uid from the transport, else anonymous), a Strom token it
//! presents once (`Authenticate`), or membership (`trust.rs`). Every
//! request is then decided for that principal by the service layer's
//! [`crate::service::Access`].

use strom_auth::{Operation, Principal, Resource, ResourceKind};
use strom_proto::{ErrorCode, Request, Response};

use super::Session;
use crate::audit::{Actor, FrontEnd};
use crate::error::ServerError;

impl Session {
    /// Checks `req` for this connection's principal; a refusal goes to
    /// the audit log (target `strom::audit`).
    pub(super) fn authorize(&self, req: &Request) -> Result<(), ServerError> {
        self.svc
            .access
            .check_request(&self.principal, req)
            .map_err(|(op, res, e)| {
                let why = format!("{e} (opcode {})", req.opcode());
                let member = self.svc.control.member();
                self.svc
                    .audit
                    .refused(member, &self.actor(), &op, &res, &why);
                e
            })
    }

    /// Records the changes a request made, with who made them.
    pub(super) fn audit(&self, changes: &[(Operation, Resource)]) {
        let member = self.svc.control.member();
        self.svc.audit.done(member, &self.actor(), changes, None);
    }

    fn actor(&self) -> Actor<'_> {
        Actor {
            front_end: FrontEnd::Native,
            peer: Some(&self.peer),
            principal: &self.principal,
        }
    }

    /// Binds the connection to the subject of `token`, once.
    pub(super) fn authenticate(&mut self, id: u64, token: &str) {
        let r = self.check_token(token);
        if let Err(e) = &r {
            tracing::warn!(peer = %self.peer, error = %e, "refused a token");
            self.svc.stats.error(e.code().0);
        }
        self.respond(id, r);
    }

    fn check_token(&mut self, token: &str) -> Result<Response, ServerError> {
        // A token replaces what the transport said (a uid, a certificate),
        // once; a member or a token-bearer does not change who it is.
        if matches!(
            self.principal.mechanism,
            strom_auth::Mechanism::Token | strom_auth::Mechanism::Member
        ) {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "this connection is {} already; a connection authenticates once",
                    self.principal
                ),
            ));
        }
        let p = self.svc.authenticate_token(token)?;
        tracing::info!(peer = %self.peer, principal = %p, "authenticated");
        let principal = p.to_string();
        self.principal = p;
        Ok(Response::Authenticated { principal })
    }

    /// This server's limits, quorum size and security mode (`Limits`).
    pub(super) fn limits(&self) -> Response {
        let c = &self.svc.control;
        let (max_frame_bytes, max_batch_bytes) = c.limits();
        let cfg = &self.svc.config;
        Response::Limits {
            max_frame_bytes,
            max_batch_bytes,
            meta_voters: c.meta_voters(),
            security: match (cfg.auth, cfg.exposed_without_auth()) {
                (true, _) => 2,
                (false, true) => 3,
                (false, false) => 1,
            },
        }
    }

    /// Keeps only what this connection's principal may describe, in a
    /// listing the registry answered in full.
    pub(super) fn filter_listing(&self, resp: Response) -> Response {
        let access = &self.svc.access;
        if !access.enabled() || self.principal.is_member() {
            return resp;
        }
        let may = |kind: ResourceKind, name: &str| {
            let res = strom_auth::Resource {
                kind,
                name: name.to_string(),
            };
            access
                .check(&self.principal, strom_auth::Operation::Describe, &res)
                .is_ok()
        };
        match resp {
            Response::Topics(mut ts) => {
                ts.retain(|t| may(ResourceKind::Topic, &t.spec.name));
                Response::Topics(ts)
            }
            Response::ConsumerGroups(mut gs) => {
                gs.retain(|g| may(ResourceKind::Group, &g.spec.name));
                Response::ConsumerGroups(gs)
            }
            other => other,
        }
    }
}

/// The principal a connection starts as: the subject of its verified
/// client certificate, else the uid the kernel gives for a same-node
/// peer, else anonymous.
pub(super) fn initial(identity: &strom_net::PeerIdentity) -> Principal {
    match (&identity.tls_subject, identity.uid) {
        (Some(cn), _) => Principal::user(cn.clone(), strom_auth::Mechanism::Certificate),
        (None, Some(uid)) => Principal::peer_uid(uid, user_name(uid)),
        (None, None) => Principal::anonymous(),
    }
}

/// The user name of `uid`, if the system knows it.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getpwuid_r writes the
    // strings into `buf` and sets `out` to `&pw` or null.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name points into `buf`, NUL-terminated by getpwuid_r.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    name.to_str().ok().map(str::to_string)
}
