//! Who may send what on a native connection (docs/safety.md, "What members
//! trust"). A connection is anonymous until it proves, with the cluster
//! secret, that a member of the group opened it (`Hello` with a nonce, then
//! `ProveMember`, [`crate::member_auth`]); it is then bound to the member id
//! it proved, for its whole life. Member-to-member requests are refused
//! (`NOT_A_MEMBER`) on any other connection, and a request that names a
//! member (a follower's fetch, a heartbeat, a rejoin) must name that one.

use bytes::Bytes;
use strom_proto::{ErrorCode, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use super::{answer, Session};
use crate::error::ServerError;
use crate::member_auth::{self, NONCE_RANGE, NO_ID};

fn refuse(m: String) -> ServerError {
    ServerError::coded(ErrorCode::NOT_A_MEMBER, m)
}

/// Requests only members send each other: the registry's orders to the
/// partitions' hosts, replication, membership, the quorum's Raft RPCs.
pub(super) fn member_only(req: &Request) -> bool {
    matches!(
        req,
        Request::Join { .. }
            | Request::Heartbeat { .. }
            | Request::HostPartitions { .. }
            | Request::SealPartitions { .. }
            | Request::DropPartitions { .. }
            | Request::SetReplicaRoles { .. }
            | Request::ReplicaFetch { .. }
            | Request::ReportIsr { .. }
            | Request::ReleasePartitions { .. }
            | Request::FenceGroupPartition { .. }
            | Request::DropConsumerGroup { .. }
            | Request::KafkaGroupView { .. }
            | Request::MetaRpc { .. }
    )
}

impl Session {
    /// Whether this connection may send `req`.
    pub(super) fn admit(&self, req: &Request) -> Result<(), ServerError> {
        if !member_only(req) {
            return Ok(());
        }
        let what = || format!("opcode {}", req.opcode());
        let Some(proved) = self.member else {
            return Err(refuse(format!(
                "{} is a member-to-member request and this connection has not proven membership of the group (a server proves it with the cluster secret when it connects)",
                what()
            )));
        };
        let named = match req {
            // A first join has no id yet; a rejoin names the one it proved.
            Request::Join { member, .. } => *member,
            Request::Heartbeat { member, .. } => Some(*member),
            Request::ReplicaFetch { follower, .. } => Some(*follower),
            _ if proved == NO_ID => {
                return Err(refuse(format!(
                    "{}: this connection proved the cluster secret but no member id (it has not joined)",
                    what()
                )))
            }
            _ => None,
        };
        match named {
            Some(m) if m != proved => Err(refuse(format!(
                "{} names member {m}, but this connection proved member {}",
                what(),
                if proved == NO_ID {
                    "none".to_string()
                } else {
                    proved.to_string()
                }
            ))),
            _ => Ok(()),
        }
    }

    /// Settles the connection's protocol version: the newest both sides
    /// speak. The answer goes out at the version the client sent its
    /// `Hello` at (the oldest, unless it is a member proving itself), as the
    /// client cannot know more yet. A member's nonce gets one back.
    pub(super) async fn hello(
        &mut self,
        id: u64,
        frame_version: u8,
        client: &str,
        max_version: u8,
        nonce: Bytes,
    ) {
        if max_version < MIN_PROTOCOL_VERSION {
            let e = ServerError::coded(
                ErrorCode::UNSUPPORTED_VERSION,
                format!("client '{client}' speaks protocol versions up to {max_version}; this server speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"),
            );
            return self.respond(id, Err(e));
        }
        let ours = if nonce.is_empty() {
            self.nonces = None;
            Bytes::new()
        } else {
            if !NONCE_RANGE.contains(&nonce.len()) {
                let e = ServerError::coded(
                    ErrorCode::INVALID_ARGUMENT,
                    format!(
                        "a Hello nonce of {} bytes; nonces hold {NONCE_RANGE:?} bytes",
                        nonce.len()
                    ),
                );
                return self.respond(id, Err(e));
            }
            match member_auth::nonce() {
                Ok(ours) => {
                    self.nonces = Some((ours.clone(), nonce));
                    ours
                }
                Err(e) => return self.respond(id, Err(e)),
            }
        };
        let version = max_version.min(PROTOCOL_VERSION);
        let g = self.svc.control.hello().await;
        let resp = Response::Hello {
            member: g.member,
            master: g.master,
            members: g.members,
            version,
            nonce: ours,
        };
        let at = frame_version.clamp(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION);
        answer(&self.writer, at, id, resp);
        self.version = version;
        tracing::debug!(peer = %self.peer, client, version, "hello");
    }

    /// Checks a member's proof against the nonces of this connection's
    /// `Hello` (each pair serves one proof) and binds the connection to the
    /// member it proved; answers with this server's own proof.
    pub(super) fn prove_member(&mut self, id: u64, member: u32, proof: &[u8]) {
        let r = self.check_proof(member, proof);
        self.respond(id, r);
    }

    fn check_proof(&mut self, member: u32, proof: &[u8]) -> Result<Response, ServerError> {
        let Some((ours, theirs)) = self.nonces.take() else {
            return Err(refuse(
                "ProveMember needs a Hello that carried a nonce first, on the same connection"
                    .into(),
            ));
        };
        let Some(secret) = self.svc.control.link().peers().identity().secret() else {
            return Err(refuse(
                "this server holds no cluster secret yet (it has not joined its group)".into(),
            ));
        };
        if !secret.check_member_proof(&ours, &theirs, member, proof) {
            tracing::warn!(peer = %self.peer, member, "a connection failed to prove group membership (another cluster secret?)");
            return Err(refuse(format!(
                "the proof for member {member} does not match this group's cluster secret; give the server the group's secret file (--cluster-secret-file)"
            )));
        }
        self.member = Some(member);
        self.principal = strom_auth::Principal::member(member);
        let me = self.svc.control.member();
        tracing::debug!(peer = %self.peer, member, "member proved");
        Ok(Response::MemberProven {
            member: me,
            proof: secret.server_proof(&ours, &theirs, me),
        })
    }
}
