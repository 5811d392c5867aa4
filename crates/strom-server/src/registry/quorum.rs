//! The registry on the metadata quorum (issue 17, docs/replication.md).
//!
//! With `meta_voters` above 1, every member that takes part in the quorum
//! (voters, and learners on their way to voting) holds a [`Registry`], but
//! only the Raft leader's serves. Its commands are committed through Raft
//! (`propose`) instead of `registry.log`, and applied to its own copy of the
//! state once the quorum holds them; every member's [`RegistryMachine`]
//! applies them too. When a member becomes leader, it loads the machine's
//! state with a linearizable read, starts its volatile state afresh (as a
//! restarted master does: members and producers get a full timeout), and
//! only then answers registry requests. A commit whose outcome is unknown
//! (the leader lost its quorum or its term) makes the registry reload
//! before it serves again, so it never serves a state the quorum does not
//! hold.
//!
//! The leader also grows the voting set to the configured size: live
//! members are added as learners, and once enough have caught up, they
//! all become voters in one membership change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_meta::{Meta, MetaError};
use strom_proto::{ErrorCode, GroupMember};
use tokio::sync::{watch, Mutex};

use super::machine::{RegistryCommand, RegistryState};
use super::replicated::{encode, RegistryMachine};
use super::store::Store;
use super::{Inner, Registry};
use crate::error::ServerError;
use crate::members::MemberLink;

/// How long a commit may wait for the quorum before it is reported as
/// failed (its outcome is then unknown, and the registry reloads).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a quorum member checks whether it leads.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// Where the registry's commands are made durable.
pub(super) enum Journal {
    /// `registry.log` in the data dir (a registry without a quorum).
    Local(Store),
    /// The metadata quorum.
    Quorum(Leadership),
}

/// A quorum registry's handle on Raft, and the term its state is loaded in.
#[derive(Clone)]
pub(super) struct Leadership {
    pub(super) meta: Arc<Meta<RegistryMachine>>,
    /// The term the registry's state was loaded in; 0 while it is not.
    ready: Arc<AtomicU64>,
}

/// What a quorum member needs to run the registry when it leads.
#[derive(Clone)]
pub struct QuorumSetup {
    /// The group file to keep up to date while leading.
    pub group_file: Option<std::path::PathBuf>,
    /// Members expected before the group file is first written.
    pub expected: u32,
    /// Voters the leader grows the quorum to (1, 3 or 5).
    pub voters: u32,
    /// The default producer lease (`producer_lease_ms`).
    pub default_lease_ms: u32,
    /// `member_timeout_ms`.
    pub member_timeout_ms: u64,
}

fn meta_error(e: MetaError) -> ServerError {
    ServerError::coded(ErrorCode(e.code()), e.to_string())
}

impl Journal {
    /// Appends on the local journal, which never waits.
    pub(super) fn append_local(&mut self, cmd: &RegistryCommand) -> Result<(), ServerError> {
        match self {
            Journal::Local(store) => Ok(store.append(cmd).map(|_| ())?),
            Journal::Quorum(_) => Err(ServerError::coded(
                ErrorCode::INTERNAL,
                "a quorum registry commits through the quorum",
            )),
        }
    }

    /// Makes `cmd` durable: in `registry.log`, or committed by a quorum.
    pub(super) async fn append(&mut self, cmd: &RegistryCommand) -> Result<(), ServerError> {
        let lead = match self {
            Journal::Local(_) => return self.append_local(cmd),
            Journal::Quorum(l) => l,
        };
        let outcome = tokio::time::timeout(COMMIT_TIMEOUT, lead.meta.propose(encode(cmd))).await;
        let err = match outcome {
            Ok(Ok(_)) => return Ok(()),
            // Refused by the machine: nothing changed anywhere.
            Ok(Err(MetaError::Rejected(why))) => {
                return Err(ServerError::coded(
                    ErrorCode::INTERNAL,
                    format!("registry command refused by the quorum: {why}"),
                ))
            }
            Ok(Err(e)) => meta_error(e),
            Err(_) => ServerError::coded(
                ErrorCode::TIMEOUT,
                format!(
                    "the metadata quorum did not commit within {COMMIT_TIMEOUT:?} (too few voters reachable)"
                ),
            ),
        };
        // The command may or may not be committed: reload before serving.
        lead.ready.store(0, Ordering::Release);
        tracing::warn!(error = %err, "a registry commit failed; the registry reloads from the quorum before serving again");
        Err(err)
    }

    pub(super) fn compact_if_due(&mut self, state: &RegistryState) {
        let Journal::Local(store) = self else { return };
        if store.compaction_due() {
            if let Err(e) = store.compact(state) {
                tracing::warn!(error = %e, "could not compact the registry log; it keeps growing and compaction is retried after the next change");
            }
        }
    }
}

impl Registry {
    /// A registry that commits through `meta`. It serves nothing until this
    /// member leads and [`Registry::watch`] has loaded the state.
    pub fn on_quorum(
        meta: Arc<Meta<RegistryMachine>>,
        link: Arc<MemberLink>,
        setup: &QuorumSetup,
    ) -> Registry {
        let lead = Leadership {
            meta,
            ready: Arc::new(AtomicU64::new(0)),
        };
        let inner = Inner::loaded(
            RegistryState::default(),
            Journal::Quorum(lead.clone()),
            link.member(),
        );
        Registry {
            coord: parking_lot::Mutex::new(Default::default()),
            default_lease_ms: 10_000,
            link,
            group_id: 0.into(),
            quorum: Some(lead),
            group_file: setup.group_file.clone(),
            expected: setup.expected.max(1),
            inner: Mutex::new(inner),
            security_hook: Default::default(),
        }
        .with_default_lease(setup.default_lease_ms)
        .with_member_timeout(setup.member_timeout_ms)
    }

    /// Whether this registry serves: always without a quorum; with one,
    /// while this member leads and its state is loaded for the term.
    pub fn leads(&self) -> bool {
        match &self.quorum {
            None => true,
            Some(l) => {
                let ready = l.ready.load(Ordering::Acquire);
                ready != 0 && l.meta.leader_term() == Some(ready)
            }
        }
    }

    /// The quorum's leader as this member knows it (id, address).
    pub fn leader_hint(&self) -> Option<(u32, String)> {
        let l = self.quorum.as_ref()?;
        let (id, addr) = l.meta.leader()?;
        Some((u32::try_from(id).ok()?, addr))
    }

    /// The group's members as this member's copy of the quorum's state has
    /// them (it may lag the leader's).
    pub fn known_members(&self) -> Vec<GroupMember> {
        let Some(meta) = self.meta() else {
            return Vec::new();
        };
        meta.read(|m| {
            m.state()
                .members
                .iter()
                .map(|(id, addr)| GroupMember {
                    id: *id,
                    addr: addr.clone(),
                    addrs: Vec::new(),
                })
                .collect()
        })
    }

    /// Each member's part in keeping the registry: `master` without a
    /// quorum; `leader`, `voter` or `learner` with one.
    pub(super) fn roles(&self) -> HashMap<u32, &'static str> {
        let Some(l) = &self.quorum else {
            return HashMap::from([(self.link.member(), "master")]);
        };
        let (voters, learners) = l.meta.members();
        let leader = l.meta.leader().map(|(id, _)| id);
        let role = |id: u64, voter: bool| match (Some(id) == leader, voter) {
            (true, _) => "leader",
            (false, true) => "voter",
            (false, false) => "learner",
        };
        let voters = voters.keys().map(|id| (*id, role(*id, true)));
        let learners = learners.keys().map(|id| (*id, role(*id, false)));
        voters
            .chain(learners)
            .filter_map(|(id, r)| Some((u32::try_from(id).ok()?, r)))
            .collect()
    }

    /// The quorum handle, if this registry runs on one.
    pub fn meta(&self) -> Option<&Arc<Meta<RegistryMachine>>> {
        self.quorum.as_ref().map(|l| &l.meta)
    }

    /// Until `stopped`: whenever this member leads in a term its state was
    /// not loaded in, loads it and starts serving; while it leads, grows
    /// the voting set to `voters`.
    pub async fn watch(self: Arc<Self>, voters: u32, mut stopped: watch::Receiver<bool>) {
        let Some(lead) = self.quorum.clone() else {
            return;
        };
        let mut last_grow = Instant::now() - Duration::from_secs(60);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(WATCH_EVERY) => {}
                _ = stopped.changed() => return,
            }
            let Some(term) = lead.meta.leader_term() else {
                continue;
            };
            if lead.ready.load(Ordering::Acquire) != term {
                if let Err(e) = self.take_over(&lead, term).await {
                    tracing::warn!(term, error = %e, "could not take over the registry as the new leader; retrying");
                }
                continue;
            }
            if last_grow.elapsed() >= Duration::from_secs(1) {
                last_grow = Instant::now();
                self.follow_addresses(&lead).await;
                self.replace_removed_voters(&lead).await;
                self.grow_voters(&lead, voters).await;
            }
        }
    }

    /// Loads the quorum's state as leader of `term`, with fresh volatile
    /// state, records this member's address, and publishes the group file
    /// naming this member as the master.
    async fn take_over(&self, lead: &Leadership, term: u64) -> Result<(), ServerError> {
        let state = lead
            .meta
            .read_linearizable(|m| m.state().clone())
            .await
            .map_err(meta_error)?;
        let me = self.link.member();
        let mut inner = self.inner.lock().await;
        let timeout = inner.timeout;
        *inner = Inner::loaded(state, Journal::Quorum(lead.clone()), me);
        inner.timeout = timeout;
        inner.set_addrs(me, self.link.addrs());
        *self.coord.lock() = Registry::fresh_coordinator(&inner);
        if inner.state.group_id == 0 {
            inner
                .commit(RegistryCommand::SetGroupId {
                    group_id: super::new_group_id(),
                })
                .await?;
        }
        let addr = self.link.addr().to_string();
        if inner.state.members.get(&me) != Some(&addr) {
            inner
                .commit(RegistryCommand::MemberJoined {
                    id: me,
                    addr: addr.clone(),
                })
                .await?;
        }
        self.quorum_follows(me, &addr).await;
        self.group_id.store(inner.state.group_id, Ordering::Release);
        lead.ready.store(term, Ordering::Release);
        self.publish_group(&inner);
        tracing::info!(
            member = me,
            term,
            topics = inner.state.topics.len(),
            "leading the metadata quorum; the registry serves here"
        );
        Ok(())
    }

    /// Gives the quorum the address a member of it now has in the registry
    /// (it was restarted on another port), or Raft would keep calling the
    /// old one.
    async fn follow_addresses(&self, lead: &Leadership) {
        let (voting, learners) = lead.meta.members();
        let moved: BTreeMap<u64, String> = {
            let inner = self.inner.lock().await;
            voting
                .iter()
                .chain(learners.iter())
                .filter_map(|(id, addr)| {
                    let now = inner.state.members.get(&u32::try_from(*id).ok()?)?;
                    (now != addr).then(|| (*id, now.clone()))
                })
                .collect()
        };
        if moved.is_empty() {
            return;
        }
        match lead.meta.set_addresses(moved.clone()).await {
            Ok(()) => tracing::info!(moved = ?moved, "metadata quorum members' addresses updated"),
            Err(e) => {
                tracing::warn!(error = %e, "could not update the metadata quorum's addresses")
            }
        }
    }

    /// A member of the metadata quorum that joined on another address
    /// (restarted on another port): the quorum calls it there from now on,
    /// before its join is answered. Left to the periodic
    /// [`Self::follow_addresses`], the next restart in a rolling restart
    /// could take the quorum's majority down to members it calls at dead
    /// addresses, and then no change, this one included, could commit.
    pub(super) async fn quorum_follows(&self, id: u32, addr: &str) {
        let Some(meta) = self.meta() else {
            return;
        };
        let (voting, learners) = meta.members();
        let known = voting.get(&u64::from(id)).or(learners.get(&u64::from(id)));
        if known.is_none_or(|a| a == addr) {
            return;
        }
        let moved = BTreeMap::from([(u64::from(id), addr.to_string())]);
        match meta.set_addresses(moved.clone()).await {
            Ok(()) => tracing::info!(moved = ?moved, "metadata quorum members' addresses updated"),
            Err(e) => {
                tracing::warn!(error = %e, member = id, "could not update the member's address in the metadata quorum; retrying later")
            }
        }
    }

    /// Takes voters that are leaving the group for good (`strom member
    /// remove`, dead)
    /// out of the voting set, each in one membership change with a live
    /// member that does not vote yet in its place (added as a learner
    /// first), so the set keeps its size. Without such a member it waits:
    /// a set of two would stop at the next death as one of three does.
    async fn replace_removed_voters(&self, lead: &Leadership) {
        let (voting, learners) = lead.meta.members();
        let (gone, spare): (Vec<u64>, Option<(u32, String)>) = {
            let inner = self.inner.lock().await;
            let gone = voting
                .keys()
                .copied()
                .filter(|id| {
                    u32::try_from(*id).is_ok_and(|m| {
                        inner.state.removed.contains(&m)
                            || inner.state.draining.get(&m) == Some(&true)
                    })
                })
                .collect();
            let spare = inner
                .state
                .members
                .iter()
                .find(|(id, _)| {
                    inner.alive(**id)
                        && !voting.contains_key(&u64::from(**id))
                        && !inner.state.removed.contains(id)
                        && !inner.state.draining.contains_key(id)
                })
                .map(|(id, addr)| (*id, addr.clone()));
            (gone, spare)
        };
        let (Some(&out), Some((id, addr))) = (gone.first(), spare) else {
            return;
        };
        if !learners.contains_key(&u64::from(id)) {
            let added = tokio::time::timeout(
                Duration::from_secs(10),
                lead.meta.add_learner(u64::from(id), addr.clone()),
            )
            .await;
            if !matches!(added, Ok(Ok(()))) {
                tracing::warn!(member = id, addr = %addr, "could not add a member to the metadata quorum as a learner; retrying later");
                return;
            }
        }
        let mut set: BTreeSet<u64> = voting.keys().copied().collect();
        set.remove(&out);
        set.insert(u64::from(id));
        match lead.meta.change_membership(set.clone()).await {
            Ok(()) => {
                tracing::warn!(removed = out, replacement = id, voters = ?set, "a voter that left the group was replaced in the metadata quorum")
            }
            Err(e) => {
                tracing::warn!(error = %e, removed = out, "could not replace a removed voter; retrying")
            }
        }
    }

    /// Adds live members as learners until `voters` members could vote,
    /// then makes them voters in one membership change. Never shrinks the
    /// voting set, and never changes it to an even size.
    async fn grow_voters(&self, lead: &Leadership, voters: u32) {
        let (voting, learners) = lead.meta.members();
        let want = voters as usize;
        if voting.len() >= want {
            return;
        }
        let candidates: Vec<(u32, String)> = {
            let inner = self.inner.lock().await;
            inner
                .state
                .members
                .iter()
                .filter(|(id, _)| inner.alive(**id) && !voting.contains_key(&u64::from(**id)))
                .map(|(id, addr)| (*id, addr.clone()))
                .take(want - voting.len())
                .collect()
        };
        if candidates.len() < want - voting.len() {
            return;
        }
        for (id, addr) in &candidates {
            if learners.contains_key(&u64::from(*id)) {
                continue;
            }
            let added = tokio::time::timeout(
                Duration::from_secs(10),
                lead.meta.add_learner(u64::from(*id), addr.clone()),
            )
            .await;
            if !matches!(added, Ok(Ok(()))) {
                tracing::warn!(member = id, addr = %addr, "could not add a member to the metadata quorum as a learner; retrying later");
                return;
            }
        }
        let mut set: BTreeSet<u64> = voting.keys().copied().collect();
        set.extend(candidates.iter().map(|(id, _)| u64::from(*id)));
        match lead.meta.change_membership(set.clone()).await {
            Ok(()) => tracing::info!(voters = ?set, "metadata quorum voters changed"),
            Err(e) => tracing::warn!(error = %e, "could not change the metadata quorum's voters"),
        }
    }
}
