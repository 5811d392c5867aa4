//! The topic registry (master database), held by member 0 of a group:
//! topics with their specs and policies, where each partition lives,
//! end-of-stream bookkeeping (registered and closed producers), and the
//! group's members with their last heartbeat.
//!
//! It is a state machine fed by a command log, the shape a Raft log
//! replays: each operation validates against the current state, makes every
//! choice (ids, placement), performs the member calls that must come first
//! (hosting partitions), then *commits* a [`RegistryCommand`]: appended to
//! `registry.log` and fdatasync'ed, and only then applied to the in-memory
//! [`RegistryState`]. If the append fails the state is unchanged and the
//! caller gets the error. Heartbeat times are volatile and kept outside the
//! machine. Control-plane operations are serialized by one async lock; the
//! data path never takes it.
//!
//! Modules: `machine` (state and commands, pure), `files`, `snapshot` and
//! `store` (persistence; the file framing is `strom_storage::record`),
//! `topics` (the topic operations), `leases` (producer leases: open, renew,
//! expire), `group_machine` and `groups` (consumer groups: their commands,
//! and join, heartbeat, leave, expiry, describe), `assign` and
//! `coordinator` (partitioned groups: the sticky assignor and the handoffs),
//! `kafka_groups` (Kafka groups as their coordinators report them),
//! `replicated` (the state machine as the metadata quorum runs it) and
//! `quorum` (the registry on the quorum: commits through Raft, leadership,
//! voters).

mod assign;
mod coordinator;
mod describe;
mod files;
mod group_machine;
mod groups;
mod kafka_groups;
mod leases;
mod machine;
mod member_machine;
mod moves;
mod quorum;
mod quotas;
mod replica_machine;
mod replicas;
mod replicated;
mod security;
mod security_machine;
mod snapshot;
mod store;
#[cfg(test)]
mod tests;
mod topics;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_proto::{ErrorCode, GroupFile, GroupMember, MemberInfo, Request};
use strom_storage::vfs::{RealFs, Vfs};
use tokio::sync::Mutex;

use crate::error::ServerError;
use crate::group::write_group_file;
use crate::members::MemberLink;

use machine::{RegistryCommand, RegistryState};
use quorum::Journal;
pub use quorum::QuorumSetup;
pub use replicas::ROLES_EVERY;
pub use replicated::RegistryMachine;
use store::{Limits, Store};

/// A member not heard from for this long is reported dead (the default of
/// `member_timeout_ms`).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

pub use crate::config::LEASE_RANGE_MS;

pub struct Registry {
    /// Consumer-group heartbeats (volatile, under their own lock).
    coord: parking_lot::Mutex<groups::Coordinator>,
    /// The lease granted to a producer that asks for the default (0).
    default_lease_ms: u32,
    /// Reaches members (this server included) for host/seal/drop/stats.
    link: Arc<MemberLink>,
    group_id: std::sync::atomic::AtomicU64,
    /// The metadata quorum this registry commits through, if any, and the
    /// term its state was loaded in (0: not ready to lead).
    quorum: Option<quorum::Leadership>,
    group_file: Option<PathBuf>,
    /// Members expected before the group file is first written (launcher size).
    expected: u32,
    inner: Mutex<Inner>,
    /// Called with the new security table after every ACL, token or SCRAM
    /// change committed here, before the change is answered: the server
    /// that holds the registry decides requests by it at once.
    security_hook: std::sync::OnceLock<SecurityHook>,
}

/// See [`Registry::on_security_change`].
pub type SecurityHook = Box<dyn Fn(&strom_auth::SecurityTable) + Send + Sync>;

/// What the registry's lock guards: the machine, its log, and volatile state.
struct Inner {
    state: RegistryState,
    journal: Journal,
    /// This member's id (the registry's own member is always alive).
    me: u32,
    /// When each member was last heard from (not part of the machine).
    last_seen: HashMap<u32, Instant>,
    /// The least id the next topic may take: a failed create uses up its id
    /// (a member may still hold its partitions) while this process lives.
    topic_id_floor: u64,
    /// When each leased open producer expires unless renewed (volatile:
    /// after a restart every one gets a full lease of grace).
    lease_deadline: HashMap<(String, u64), Instant>,
    /// Every address of each member that listens on more than one (from
    /// its joins and heartbeats; volatile, like `last_seen`).
    addrs: HashMap<u32, Vec<String>>,
    /// When this state was loaded (opened, or taken over as leader).
    since: Instant,
    /// A member not heard from for this long is dead (`member_timeout_ms`).
    timeout: Duration,
}

impl Inner {
    /// Registry state just loaded (opened, or taken over as the quorum's
    /// new leader) with fresh volatile state: known members count as dead
    /// until they heartbeat again, and every leased open producer gets a
    /// full lease, as members get a full heartbeat timeout.
    fn loaded(state: RegistryState, journal: Journal, me: u32) -> Inner {
        let now = Instant::now();
        // Long enough ago for any timeout.
        let unheard = now.checked_sub(Duration::from_secs(3600)).unwrap_or(now);
        let mut last_seen: HashMap<u32, Instant> =
            state.members.keys().map(|id| (*id, unheard)).collect();
        last_seen.insert(me, now);
        let lease_deadline = state
            .topics
            .values()
            .flat_map(|t| {
                t.leases.iter().map(|(p, ms)| {
                    (
                        (t.spec.name.clone(), *p),
                        now + Duration::from_millis(u64::from(*ms)),
                    )
                })
            })
            .collect();
        Inner {
            topic_id_floor: state.next_topic_id,
            state,
            journal,
            me,
            last_seen,
            lease_deadline,
            addrs: HashMap::new(),
            since: now,
            timeout: HEARTBEAT_TIMEOUT,
        }
    }

    /// Makes `cmd` durable (appended to `registry.log` and fdatasync'ed,
    /// or committed by the quorum), then applies it. If that fails, the
    /// state is unchanged and the error is returned.
    async fn commit(&mut self, cmd: RegistryCommand) -> Result<(), ServerError> {
        self.state.check(&cmd).map_err(|e| {
            ServerError::coded(
                ErrorCode::INTERNAL,
                format!("registry command rejected: {e}"),
            )
        })?;
        self.journal.append(&cmd).await?;
        self.state.apply_checked(&cmd);
        self.journal.compact_if_due(&self.state);
        Ok(())
    }

    /// [`commit`](Self::commit) on the local journal, which never waits
    /// (for opening, outside any runtime).
    fn commit_local(&mut self, cmd: RegistryCommand) -> Result<(), ServerError> {
        self.state.check(&cmd).map_err(|e| {
            ServerError::coded(
                ErrorCode::INTERNAL,
                format!("registry command rejected: {e}"),
            )
        })?;
        self.journal.append_local(&cmd)?;
        self.state.apply_checked(&cmd);
        self.journal.compact_if_due(&self.state);
        Ok(())
    }

    fn alive(&self, id: u32) -> bool {
        id == self.me
            || self
                .last_seen
                .get(&id)
                .is_some_and(|t| t.elapsed() < self.timeout)
    }

    /// The members heard from within the timeout, by id, but those being
    /// drained: where new partitions may go.
    fn live_members(&self) -> Vec<u32> {
        self.state
            .members
            .keys()
            .copied()
            .filter(|id| self.alive(*id) && !self.state.draining.contains_key(id))
            .collect()
    }

    fn addr_of(&self, member: u32) -> String {
        self.state.members.get(&member).cloned().unwrap_or_default()
    }

    fn group_members(&self) -> Vec<GroupMember> {
        self.state
            .members
            .iter()
            .map(|(id, addr)| GroupMember {
                id: *id,
                addr: addr.clone(),
                addrs: self.addrs.get(id).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// Records `member`'s addresses; true if they changed.
    fn set_addrs(&mut self, member: u32, addrs: Vec<String>) -> bool {
        let addrs = if addrs.len() > 1 { addrs } else { Vec::new() };
        let old = self.addrs.insert(member, addrs.clone()).unwrap_or_default();
        old != addrs
    }
}

impl Registry {
    pub fn open(
        data_dir: &Path,
        group_file: Option<PathBuf>,
        expected: u32,
        link: Arc<MemberLink>,
    ) -> Result<Self, ServerError> {
        Self::open_with(
            Arc::new(RealFs),
            data_dir,
            group_file,
            expected,
            link,
            Limits::default(),
        )
    }

    fn open_with(
        vfs: Arc<dyn Vfs>,
        data_dir: &Path,
        group_file: Option<PathBuf>,
        expected: u32,
        link: Arc<MemberLink>,
        limits: Limits,
    ) -> Result<Self, ServerError> {
        let (store, state) = Store::open(vfs, data_dir, limits)?;
        let mut inner = Inner::loaded(state, Journal::Local(store), 0);
        inner.set_addrs(0, link.addrs());
        let mut first = Vec::new();
        if inner.state.group_id == 0 {
            // Recorded before any group file carries it.
            first.push(RegistryCommand::SetGroupId {
                group_id: new_group_id(),
            });
        }
        let addr = link.addr().to_string();
        if inner.state.members.get(&0) != Some(&addr) {
            first.push(RegistryCommand::MemberJoined { id: 0, addr });
        }
        for cmd in first {
            inner.commit_local(cmd)?;
        }
        let coord = Registry::fresh_coordinator(&inner);
        Ok(Registry {
            coord: parking_lot::Mutex::new(coord),
            default_lease_ms: 10_000,
            link,
            group_id: inner.state.group_id.into(),
            quorum: None,
            group_file,
            expected: expected.max(1),
            inner: Mutex::new(inner),
            security_hook: Default::default(),
        })
    }

    /// Every known consumer gets a full session to heartbeat again.
    fn fresh_coordinator(inner: &Inner) -> groups::Coordinator {
        let mut coord = groups::Coordinator::default();
        Registry::grant_sessions(&mut coord, inner, Instant::now());
        coord
    }

    /// Sets how long a member may go unheard before it is dead (and its
    /// replicated partitions fail over): `member_timeout_ms`.
    pub fn with_member_timeout(mut self, ms: u64) -> Self {
        self.inner.get_mut().timeout = Duration::from_millis(ms);
        self
    }

    /// Sets the lease granted to producers that ask for the default
    /// (`producer_lease_ms`), clamped to [`LEASE_RANGE_MS`].
    pub fn with_default_lease(mut self, ms: u32) -> Self {
        self.default_lease_ms = ms.clamp(LEASE_RANGE_MS.0, LEASE_RANGE_MS.1);
        self
    }

    /// The group's id, written into the group file.
    pub fn group_id(&self) -> u64 {
        self.group_id.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Re-reads the master's own addresses (a front end advertised one)
    /// and publishes them.
    pub async fn refresh_own_addrs(&self) {
        let mut inner = self.inner.lock().await;
        let me = inner.me;
        if inner.set_addrs(me, self.link.addrs()) {
            self.publish_group(&inner);
        }
    }

    /// Writes the group file once the expected members have all joined.
    fn publish_group(&self, inner: &Inner) {
        let Some(path) = &self.group_file else { return };
        if (inner.state.members.len() as u32) < self.expected {
            return;
        }
        let g = GroupFile {
            members: inner.group_members(),
            master: inner.me,
            group_id: inner.state.group_id,
        };
        if let Err(e) = write_group_file(path, &g) {
            tracing::error!(path = %path.display(), error = %e, "cannot write the group file");
        }
    }

    pub async fn publish_initial(&self) {
        let inner = self.inner.lock().await;
        self.publish_group(&inner);
    }

    pub async fn members(&self) -> Vec<MemberInfo> {
        let roles = self.roles();
        let inner = self.inner.lock().await;
        inner
            .state
            .members
            .iter()
            .map(|(id, addr)| MemberInfo {
                id: *id,
                addr: addr.clone(),
                alive: inner.alive(*id),
                last_seen_ms: match inner.last_seen.get(id) {
                    Some(t) if *id != inner.me => t.elapsed().as_millis() as u64,
                    _ => 0,
                },
                addrs: inner.addrs.get(id).cloned().unwrap_or_default(),
                role: roles.get(id).copied().unwrap_or_default().to_string(),
                draining: inner.state.draining.contains_key(id),
            })
            .collect()
    }

    /// Admits a member (or a restarted one under its old id); returns its id.
    /// Every member with all its addresses (what the group file lists).
    pub async fn group_members(&self) -> Vec<GroupMember> {
        self.inner.lock().await.group_members()
    }

    pub async fn join(
        &self,
        want: Option<u32>,
        addr: String,
        addrs: Vec<String>,
        restarted: bool,
    ) -> Result<u32, ServerError> {
        let mut inner = self.inner.lock().await;
        if let Some(id) = want.filter(|id| inner.state.removed.contains(id)) {
            return Err(left_the_group(id));
        }
        let id = match want {
            // Member 0 rejoins a quorum's leader after a restart; without a
            // quorum, 0 is the registry master itself.
            Some(0) if self.quorum.is_none() || !inner.state.members.contains_key(&0) => {
                return Err(ServerError::coded(
                    ErrorCode::INVALID_ARGUMENT,
                    "member id 0 is the registry master; a joining server cannot take it",
                ))
            }
            Some(id) if id == inner.me => {
                return Err(ServerError::coded(
                    ErrorCode::INVALID_ARGUMENT,
                    format!(
                    "member id {id} is the registry leader's own; a joining server cannot take it"
                ),
                ))
            }
            Some(id) => id,
            // Ids of members that left are not given out again.
            None => inner
                .state
                .members
                .keys()
                .chain(inner.state.removed.iter())
                .max()
                .map_or(1, |m| m + 1),
        };
        let known = inner.state.members.contains_key(&id);
        inner
            .commit(RegistryCommand::MemberJoined {
                id,
                addr: addr.clone(),
            })
            .await?;
        inner.last_seen.insert(id, Instant::now());
        inner.set_addrs(id, addrs);
        self.publish_group(&inner);
        tracing::info!(member = id, addr = %addr, restarted, "member joined");
        self.quorum_follows(id, &addr).await;
        let moved = if restarted && known {
            Self::after_restart(&mut inner, id).await?
        } else {
            Vec::new()
        };
        // Re-send what the member should host (a restarted member may have
        // missed a seal or a new partition while it was down).
        let roles: Vec<replicas::RoleCall> = inner
            .state
            .topics
            .values()
            .flat_map(|t| replicas::role_calls(&inner, t, Some(id)))
            .collect();
        let work: Vec<Request> = inner
            .state
            .topics
            .values()
            .filter_map(|t| {
                let parts = t.holders().remove(&id)?;
                Some(Request::HostPartitions {
                    topic_id: t.id,
                    spec: t.spec.clone(),
                    partitions: parts,
                    sealed: t.state().ended,
                })
            })
            .collect();
        // Copies it kept of partitions that moved away while it was down.
        let release = moves::released_on_join(&inner, id);
        // The other holders of what failed over learn their new roles.
        let others: Vec<replicas::RoleCall> = moved
            .iter()
            .filter_map(|name| inner.state.topics.get(name))
            .flat_map(|t| replicas::role_calls(&inner, t, None))
            .filter(|(member, _, _)| *member != id)
            .collect();
        drop(inner);
        let link = self.link.clone();
        tokio::spawn(async move {
            for (member, at, req) in others {
                if let Err(e) = link.call(member, &at, req).await {
                    tracing::debug!(member, error = %e, "could not send replica roles; sent again later");
                }
            }
            let roles = roles.into_iter().map(|(_, _, req)| req);
            for req in release.into_iter().chain(work).chain(roles) {
                if let Err(e) = link.call(id, &addr, req).await {
                    tracing::warn!(member = id, error = %e, "re-hosting partitions on a rejoined member failed");
                }
            }
        });
        Ok(id)
    }

    pub async fn heartbeat(
        &self,
        member: u32,
        addr: String,
        addrs: Vec<String>,
    ) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        if inner.state.removed.contains(&member) {
            return Err(left_the_group(member));
        }
        let Some(known) = inner.state.members.get(&member) else {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("member {member} is not part of this group; join first"),
            ));
        };
        let moved = *known != addr;
        inner.last_seen.insert(member, Instant::now());
        if moved {
            inner
                .commit(RegistryCommand::MemberAddress { id: member, addr })
                .await?;
        }
        if inner.set_addrs(member, addrs) || moved {
            self.publish_group(&inner);
        }
        Ok(())
    }
}

fn left_the_group(id: u32) -> ServerError {
    ServerError::coded(
        ErrorCode::MEMBER_REMOVED,
        format!("member {id} left the group (it was drained or removed); start a server on an empty data directory to join as a new member"),
    )
}

/// A random non-zero group id (no RNG dependency: clock, pid and a hash).
fn new_group_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}
