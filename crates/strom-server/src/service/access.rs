//! Who may do what (docs/security.md): the service layer's one place for
//! authorization, used by every front end.
//!
//! [`Access`] holds this server's copy of the registry's security table
//! (ACLs and revoked tokens, refreshed by the server's security loop) and
//! the `super_users` setting, and decides each request for the principal
//! of its connection ([`strom_auth::SecurityTable::decide`]).
//! [`needs`] says what a native request needs: the Kafka front end asks
//! the registry with the same requests, so one table covers both. With
//! `auth` off (the default, served only to loopback and same-node
//! clients: protected mode) every request is allowed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use strom_auth::{Decision, Operation, Principal, Resource, SecurityTable, TokenKey};
use strom_proto::{ErrorCode, Request};

use crate::error::ServerError;

/// Authorization state of one server.
pub struct Access {
    enabled: bool,
    super_users: Vec<String>,
    table: RwLock<Arc<SecurityTable>>,
    /// Set once the table was read from the registry.
    loaded: AtomicBool,
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Access {
    pub fn new(enabled: bool, super_users: Vec<String>) -> Self {
        Access {
            enabled,
            super_users,
            table: RwLock::new(Arc::new(SecurityTable::default())),
            loaded: AtomicBool::new(false),
        }
    }

    /// Whether requests are checked at all (`auth`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether a table from the registry was installed.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// The version of the table this server decides with.
    pub fn version(&self) -> u64 {
        self.table.read().version
    }

    pub fn table(&self) -> Arc<SecurityTable> {
        self.table.read().clone()
    }

    /// Installs a table read from the registry.
    pub fn set_table(&self, t: SecurityTable) {
        *self.table.write() = Arc::new(t);
        self.loaded.store(true, Ordering::Release);
    }

    /// Whether `who` may do `op` to `res`; `NOT_AUTHORIZED` naming all
    /// three (and why) if not.
    pub fn check(&self, who: &Principal, op: Operation, res: &Resource) -> Result<(), ServerError> {
        if !self.enabled || who.is_member() {
            return Ok(());
        }
        if written_by_servers(op, res) {
            return Err(refused(
                who,
                op,
                res,
                "the audit topic is created and written only by the servers",
            ));
        }
        if !self.loaded.load(Ordering::Acquire) {
            return Err(refused(
                who,
                op,
                res,
                "this server has not read the group's ACLs yet; retry shortly",
            ));
        }
        match self
            .table
            .read()
            .decide(who, op, res, &self.super_users, now_secs())
        {
            Decision::Allow => Ok(()),
            Decision::Deny(why) => Err(refused(who, op, res, &why)),
        }
    }

    /// Every check [`needs`] lists for `req`; the first refused, with
    /// what it was for.
    pub fn check_request(
        &self,
        who: &Principal,
        req: &Request,
    ) -> Result<(), (Operation, Resource, ServerError)> {
        if !self.enabled || who.is_member() {
            return Ok(());
        }
        needs(req)
            .into_iter()
            .try_for_each(|(op, res)| match self.check(who, op, &res) {
                Ok(()) => Ok(()),
                Err(e) => Err((op, res, e)),
            })
    }

    /// The principal a Strom token proves, signed with the key of
    /// `secret` (the cluster secret); `UNAUTHENTICATED` if it proves none.
    pub fn authenticate(
        &self,
        key: Option<&TokenKey>,
        token: &str,
    ) -> Result<Principal, ServerError> {
        let unauthenticated = |m: String| ServerError::coded(ErrorCode::UNAUTHENTICATED, m);
        let key = key.ok_or_else(|| {
            unauthenticated("this server has no cluster secret to check tokens with yet".into())
        })?;
        let claims = key
            .verify(token, now_secs())
            .map_err(|e| unauthenticated(e.to_string()))?;
        if self.table.read().revoked.contains(&claims.jti) {
            return Err(unauthenticated(format!(
                "the token {} was revoked",
                claims.jti
            )));
        }
        claims
            .principal()
            .map_err(|e| unauthenticated(e.to_string()))
    }
}

/// Whether `op` on `res` is one only members may do: creating, writing
/// or altering the audit topic.
fn written_by_servers(op: Operation, res: &Resource) -> bool {
    res.kind == strom_auth::ResourceKind::Topic
        && res.name == crate::audit::AUDIT_TOPIC
        && matches!(op, Operation::Create | Operation::Write | Operation::Alter)
}

fn refused(who: &Principal, op: Operation, res: &Resource, why: &str) -> ServerError {
    let hint = match who.is_anonymous() {
        true => " (this connection is anonymous: present a token with --token or STROM_TOKEN, or connect over shm:// on this node)",
        false => "",
    };
    ServerError::coded(
        ErrorCode::NOT_AUTHORIZED,
        format!("{who} may not {op} {res}: {why}{hint}"),
    )
}

/// What `req` creates, deletes or alters (for the audit trail).
pub fn changes(req: &Request) -> Vec<(Operation, Resource)> {
    let mut v = needs(req);
    v.retain(|(op, _)| matches!(op, Operation::Create | Operation::Delete | Operation::Alter));
    v
}

/// What `req` does to which resources. Requests only members send (which
/// `native/trust.rs` admits from members alone) and requests about the
/// connection itself need nothing here.
pub fn needs(req: &Request) -> Vec<(Operation, Resource)> {
    use Operation::*;
    use Request as R;
    let topic = |op, t: &str| vec![(op, Resource::topic(t))];
    let group = |op, g: &str, t: &str| vec![(op, Resource::group(g)), (Read, Resource::topic(t))];
    let cluster = |op| vec![(op, Resource::cluster())];
    match req {
        R::CreateTopic { spec, .. } => topic(Create, &spec.name),
        R::DescribeTopic { name, .. } => topic(Describe, name),
        R::DeleteTopic { name } => topic(Delete, name),
        R::CompleteTopic { name } => topic(Write, name),
        R::RegisterProducer { topic: t }
        | R::OpenProducer { topic: t, .. }
        | R::CloseProducer { topic: t, .. }
        | R::Produce { topic: t, .. } => topic(Write, t),
        R::RenewLeases { producers } => producers
            .iter()
            .map(|(t, _)| (Write, Resource::topic(t.clone())))
            .collect(),
        R::Subscribe { topic: t, .. }
        | R::FetchData { topic: t, .. }
        | R::Commit { topic: t, .. } => topic(Read, t),
        R::Offsets { topic: t, .. } | R::PartitionStats { topic: t, .. } => topic(Describe, t),
        R::AddPartitions { topic: t, .. } | R::Scrub { topic: t, .. } => topic(Alter, t),
        R::JoinConsumerGroup { spec, .. } | R::GroupSubscribe { spec, .. } => {
            group(Read, &spec.name, &spec.topic)
        }
        R::GroupAck {
            topic: t, group: g, ..
        } => group(Read, g, t),
        R::GroupCommit {
            topic: t, group: g, ..
        } => group(Read, g, t),
        R::ConsumerHeartbeat { group: g, .. } | R::LeaveConsumerGroup { group: g, .. } => {
            vec![(Read, Resource::group(g.clone()))]
        }
        R::DescribeConsumerGroup { group: g } => vec![(Describe, Resource::group(g.clone()))],
        R::ConsumerGroupStats { spec, .. } => vec![(Describe, Resource::group(spec.name.clone()))],
        R::DeleteConsumerGroup { group: g } => vec![(Delete, Resource::group(g.clone()))],
        // Listings answer only what the principal may describe (the
        // front end filters them).
        R::ListTopics | R::ListConsumerGroups => vec![],
        R::Members | R::ServerSnapshot => cluster(Describe),
        R::SecurityTable { .. } | R::QuotaTable { .. } => cluster(Describe),
        R::MovePartition { .. }
        | R::DrainMember { .. }
        | R::AlterAcls { .. }
        | R::RevokeToken { .. }
        | R::SetScramUser { .. }
        | R::AlterQuotas { .. } => cluster(Alter),
        // About the connection itself (or stream-local), or member-only.
        R::Hello { .. }
        | R::ProveMember { .. }
        | R::Authenticate { .. }
        | R::Limits
        | R::Credit { .. }
        | R::Unsubscribe { .. } => vec![],
        R::Join { .. }
        | R::Heartbeat { .. }
        | R::HostPartitions { .. }
        | R::SealPartitions { .. }
        | R::DropPartitions { .. }
        | R::SetReplicaRoles { .. }
        | R::ReplicaFetch { .. }
        | R::ReportIsr { .. }
        | R::ReleasePartitions { .. }
        | R::FenceGroupPartition { .. }
        | R::DropConsumerGroup { .. }
        | R::KafkaGroupView { .. }
        | R::MetaRpc { .. } => cluster(Admin),
    }
}
