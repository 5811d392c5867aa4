//! The Kafka group coordinator (the classic protocol: JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup), in memory on the server the clients'
//! `FindCoordinator` names: this one.
//!
//! A rebalance starts when a member joins, leaves or misses its session;
//! the others learn it from `REBALANCE_IN_PROGRESS` heartbeats and join
//! again. It completes when every known member has joined (or, after the
//! longest rebalance timeout, without those that did not): the generation
//! goes up, the leader gets every member's subscription and computes the
//! assignment on the client side (range, round-robin, sticky: whatever the
//! clients agree on), and `SyncGroup` hands each member its part.
//!
//! The first rebalance of an empty group waits
//! `kafka_group_initial_rebalance_delay_ms` first (Kafka's
//! `InitialDelayedJoin`), so that consumers started together share the
//! partitions rather than the first taking them all and handing them over
//! a moment later; in a group that never had a generation, a new member
//! joining during the wait extends it by as much again, up to the first
//! member's rebalance timeout.
//!
//! A static member (`group.instance.id`, JoinGroup v5) that restarts takes
//! the place of its old incarnation, which is fenced
//! (`FENCED_INSTANCE_ID`): static members do not leave the group when they
//! close, so without that the group would wait for the old one's session
//! to run out before it rebalanced.
//! Committed offsets are not kept here: they are Strom consumer offsets
//! under the group's name (`group_api.rs`).
//!
//! Bounds: a group holds at most `kafka_group_max_size` members (one more
//! is refused `GROUP_MAX_SIZE_REACHED`), and a group left empty for
//! `kafka_group_retention_ms` is forgotten; [`Coordinator::take_expired`]
//! hands its name to the reporter, which removes it from the registry.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::kcode;

/// Kafka error codes of the group protocol.
pub mod gcode {
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const FENCED_INSTANCE_ID: i16 = 82;
}

/// Session timeouts accepted (Kafka's broker defaults: 6 s to 30 min).
const SESSION_RANGE: (Duration, Duration) =
    (Duration::from_millis(1_000), Duration::from_secs(1_800));

/// What a member learns when a rebalance completes.
#[derive(Debug, Clone)]
pub struct Joined {
    pub error: i16,
    pub generation: i32,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// Every member's subscription, for the leader only.
    pub members: Vec<(String, Bytes)>,
}

struct Member {
    client_id: String,
    /// A static member's `group.instance.id`: a restart of it takes this
    /// member's place instead of joining as another member.
    instance: Option<String>,
    session: Duration,
    rebalance: Duration,
    protocols: Vec<(String, Bytes)>,
    last_seen: Instant,
    join: Option<oneshot::Sender<Joined>>,
    sync: Option<oneshot::Sender<(i16, Bytes)>>,
    assignment: Bytes,
}

/// The wait before the first rebalance of an empty group completes.
#[derive(Debug, Clone, Copy)]
struct InitialDelay {
    /// When this round of the wait ends.
    until: Instant,
    /// The length of one round (`kafka_group_initial_rebalance_delay_ms`).
    step: Duration,
    /// How much longer it may still be extended: the rebalance timeout
    /// less the rounds so far.
    remaining: Duration,
    /// A new member joined during this round: wait one more.
    new_member: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    Preparing { deadline: Instant },
    Completing,
    Stable,
}

struct Group {
    /// Since when the group has had no members.
    empty_since: Option<Instant>,
    state: State,
    /// Set while the first rebalance out of `Empty` waits for more members.
    initial: Option<InitialDelay>,
    generation: i32,
    protocol_type: String,
    protocol: String,
    leader: String,
    members: BTreeMap<String, Member>,
}

impl Group {
    fn new(protocol_type: String) -> Self {
        Group {
            empty_since: Some(Instant::now()),
            state: State::Empty,
            initial: None,
            generation: 0,
            protocol_type,
            protocol: String::new(),
            leader: String::new(),
            members: BTreeMap::new(),
        }
    }

    /// The member id of static member `instance`, taken out of the group
    /// for its restart: its pending calls are answered
    /// `FENCED_INSTANCE_ID`, and its old id is no longer a member.
    fn take_static(&mut self, instance: &str, group: &str) -> Option<String> {
        let old = self
            .members
            .iter()
            .find(|(_, m)| m.instance.as_deref() == Some(instance))
            .map(|(id, _)| id.clone())?;
        let m = self.members.remove(&old)?;
        if let Some(tx) = m.join {
            let _ = tx.send(Joined::error(gcode::FENCED_INSTANCE_ID, &old));
        }
        if let Some(tx) = m.sync {
            let _ = tx.send((gcode::FENCED_INSTANCE_ID, Bytes::new()));
        }
        tracing::debug!(group, instance, old = %old, "Kafka group: static member fenced");
        Some(old)
    }

    /// No members left: nothing to rebalance, no initial wait.
    fn emptied(&mut self) {
        self.state = State::Empty;
        self.initial = None;
    }

    /// Starts a rebalance (if none is under way), then completes it if
    /// every member has joined already.
    fn rebalance(&mut self, now: Instant) {
        if !matches!(self.state, State::Preparing { .. }) {
            let wait = self
                .members
                .values()
                .map(|m| m.rebalance)
                .max()
                .unwrap_or_default();
            self.state = State::Preparing {
                deadline: now + wait,
            };
            for m in self.members.values_mut() {
                // A member waiting for its assignment must join again.
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send((gcode::REBALANCE_IN_PROGRESS, Bytes::new()));
                }
            }
        }
        self.try_complete(now);
    }

    /// Completes a rebalance once every member has joined, or at the
    /// deadline without those that did not; never during the initial wait.
    fn try_complete(&mut self, now: Instant) {
        let State::Preparing { deadline } = self.state else {
            return;
        };
        if let Some(d) = &mut self.initial {
            if now < d.until {
                return;
            }
            if d.new_member && !d.remaining.is_zero() {
                let step = d.step.min(d.remaining);
                d.until = now + step;
                d.remaining -= step;
                d.new_member = false;
                return;
            }
            self.initial = None;
        }
        // A member whose JoinGroup connection closed has not joined.
        let joined = |m: &Member| m.join.as_ref().is_some_and(|tx| !tx.is_closed());
        let all_joined = self.members.values().all(joined);
        if !(all_joined || now >= deadline) {
            return;
        }
        self.members.retain(|_, m| joined(m));
        if self.members.is_empty() {
            self.emptied();
            return;
        }
        self.generation += 1;
        if !self.members.contains_key(&self.leader) {
            self.leader = self.members.keys().next().cloned().unwrap_or_default();
        }
        // The first of the leader's protocols that every member supports.
        let chosen = self.members[&self.leader]
            .protocols
            .iter()
            .map(|(n, _)| n.clone())
            .find(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == n))
            });
        let Some(protocol) = chosen else {
            for (id, m) in std::mem::take(&mut self.members) {
                if let Some(tx) = m.join {
                    let _ = tx.send(Joined::error(gcode::INCONSISTENT_GROUP_PROTOCOL, &id));
                }
            }
            self.emptied();
            return;
        };
        self.protocol = protocol;
        let subscriptions: Vec<(String, Bytes)> = self
            .members
            .iter()
            .map(|(id, m)| {
                let meta = m
                    .protocols
                    .iter()
                    .find(|(n, _)| *n == self.protocol)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default();
                (id.clone(), meta)
            })
            .collect();
        for (id, m) in self.members.iter_mut() {
            m.assignment = Bytes::new();
            m.last_seen = now;
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined {
                    error: kcode::NONE,
                    generation: self.generation,
                    protocol: self.protocol.clone(),
                    leader: self.leader.clone(),
                    member_id: id.clone(),
                    members: if *id == self.leader {
                        subscriptions.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
        self.state = State::Completing;
        tracing::info!(generation = self.generation, leader = %self.leader, members = self.members.len(), protocol = %self.protocol, "Kafka group rebalanced");
    }
}

impl Group {
    fn described(&self, now: Instant) -> Described {
        let members = self
            .members
            .iter()
            .map(|(id, m)| DescribedMember {
                id: id.clone(),
                client_id: m.client_id.clone(),
                subscription: m
                    .protocols
                    .iter()
                    .find(|(n, _)| *n == self.protocol)
                    .or(m.protocols.first())
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default(),
                assignment: m.assignment.clone(),
                idle: now.saturating_duration_since(m.last_seen),
            })
            .collect();
        Described {
            state: self.state.name(),
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            members,
        }
    }
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::Preparing { .. } => "PreparingRebalance",
            State::Completing => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// One group as `DescribeGroups` shows it (and the registry learns it).
pub struct Described {
    pub state: &'static str,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<DescribedMember>,
}

/// One member of a [`Described`] group.
pub struct DescribedMember {
    pub id: String,
    pub client_id: String,
    /// Its metadata for the group's protocol (a consumer's subscription).
    pub subscription: Bytes,
    /// What the leader assigned it in the current generation.
    pub assignment: Bytes,
    /// How long since it was last heard from.
    pub idle: Duration,
}

impl Joined {
    fn error(code: i16, member_id: &str) -> Self {
        Joined {
            error: code,
            generation: -1,
            protocol: String::new(),
            leader: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
        }
    }
}

/// A JoinGroup request's content.
pub struct JoinRequest {
    pub group: String,
    pub member_id: String,
    /// `group.instance.id` (JoinGroup v5): a static member.
    pub instance: Option<String>,
    pub client_id: String,
    pub session: Duration,
    pub rebalance: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

/// Every Kafka group this server coordinates.
pub struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
    next_member: AtomicU64,
    /// How long an empty group is kept.
    retention: Duration,
    /// Most members of one group.
    max_size: usize,
    /// How long the first rebalance of an empty group waits for more
    /// members (zero: not at all).
    initial_delay: Duration,
    /// Groups forgotten since the last [`Coordinator::take_expired`].
    expired: Mutex<Vec<String>>,
}

impl Default for Coordinator {
    /// Kafka's defaults: a week of retention (`offsets.retention.minutes`);
    /// at most 10,000 members (`group.max.size`); a first rebalance that
    /// waits 3 s (`group.initial.rebalance.delay.ms`).
    fn default() -> Self {
        Self::new(
            Duration::from_secs(7 * 24 * 3600),
            10_000,
            Duration::from_secs(3),
        )
    }
}

impl Coordinator {
    /// Forgets groups empty for `retention`; refuses members past
    /// `max_size` in one group; the first rebalance of an empty group waits
    /// `initial_delay` for more members.
    pub fn new(retention: Duration, max_size: usize, initial_delay: Duration) -> Self {
        Coordinator {
            groups: Mutex::new(HashMap::new()),
            next_member: AtomicU64::new(0),
            retention,
            max_size: max_size.max(1),
            initial_delay,
            expired: Mutex::new(Vec::new()),
        }
    }

    /// Knows `group` as an empty group, if it does not know it yet: a
    /// group the registry kept from before a restart, which then expires
    /// like any other unless a member joins. True if it was new here.
    pub fn adopt(&self, group: &str) -> bool {
        let mut groups = self.groups.lock();
        if groups.contains_key(group) {
            return false;
        }
        groups.insert(group.to_string(), Group::new(String::new()));
        true
    }

    /// The groups forgotten since the last call.
    pub fn take_expired(&self) -> Vec<String> {
        std::mem::take(&mut *self.expired.lock())
    }

    /// Joins (or rejoins) a member; the answer comes when the rebalance
    /// completes.
    pub fn join(&self, r: JoinRequest) -> oneshot::Receiver<Joined> {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        if r.session < SESSION_RANGE.0 || r.session > SESSION_RANGE.1 {
            let _ = tx.send(Joined::error(gcode::INVALID_SESSION_TIMEOUT, &r.member_id));
            return rx;
        }
        let mut groups = self.groups.lock();
        let g = groups
            .entry(r.group.clone())
            .or_insert_with(|| Group::new(r.protocol_type.clone()));
        if g.members.is_empty() {
            g.protocol_type = r.protocol_type.clone();
        } else if g.protocol_type != r.protocol_type {
            let _ = tx.send(Joined::error(
                gcode::INCONSISTENT_GROUP_PROTOCOL,
                &r.member_id,
            ));
            return rx;
        }
        let restarted = match (&r.instance, r.member_id.is_empty()) {
            (Some(i), true) => g.take_static(i, &r.group),
            _ => None,
        };
        let id = if let Some(old) = restarted {
            let n = self.next_member.fetch_add(1, Ordering::Relaxed);
            tracing::info!(group = %r.group, instance = ?r.instance, old = %old, "Kafka group: a static member restarted; it takes its old place");
            format!("{}-{n}", r.client_id)
        } else if r.member_id.is_empty() {
            if g.members.len() >= self.max_size {
                tracing::info!(group = %r.group, max = self.max_size, "Kafka group full; refusing a new member (kafka_group_max_size)");
                let _ = tx.send(Joined::error(gcode::GROUP_MAX_SIZE_REACHED, ""));
                return rx;
            }
            let n = self.next_member.fetch_add(1, Ordering::Relaxed);
            format!("{}-{n}", r.client_id)
        } else if g.members.contains_key(&r.member_id) {
            r.member_id.clone()
        } else {
            let _ = tx.send(Joined::error(gcode::UNKNOWN_MEMBER_ID, &r.member_id));
            return rx;
        };
        let m = g.members.entry(id.clone()).or_insert_with(|| Member {
            client_id: r.client_id.clone(),
            instance: r.instance.clone(),
            session: r.session,
            rebalance: r.rebalance,
            protocols: Vec::new(),
            last_seen: now,
            join: None,
            sync: None,
            assignment: Bytes::new(),
        });
        m.session = r.session;
        m.rebalance = r.rebalance;
        m.protocols = r.protocols;
        m.last_seen = now;
        g.empty_since = None;
        if g.state == State::Empty && !self.initial_delay.is_zero() {
            tracing::debug!(group = %r.group, delay_ms = self.initial_delay.as_millis() as u64, "Kafka group: the first rebalance waits for more members (kafka_group_initial_rebalance_delay_ms)");
            g.initial = Some(InitialDelay {
                until: now + self.initial_delay,
                step: self.initial_delay,
                remaining: r.rebalance.saturating_sub(self.initial_delay),
                new_member: false,
            });
        } else if let Some(d) = g.initial.as_mut() {
            // As Kafka: only a group that never had a generation waits
            // longer for newcomers.
            d.new_member |= r.member_id.is_empty() && g.generation == 0;
        }
        if let Some(old) = m.join.replace(tx) {
            let _ = old.send(Joined::error(gcode::UNKNOWN_MEMBER_ID, &id));
        }
        tracing::debug!(group = %r.group, member = %id, "Kafka JoinGroup");
        g.rebalance(now);
        rx
    }

    /// A member's assignment for `generation`; the leader brings everyone's.
    pub fn sync(
        &self,
        group: &str,
        generation: i32,
        member: &str,
        assignments: Vec<(String, Bytes)>,
    ) -> oneshot::Receiver<(i16, Bytes)> {
        let (tx, rx) = oneshot::channel();
        let mut groups = self.groups.lock();
        let Some(g) = groups
            .get_mut(group)
            .filter(|g| g.members.contains_key(member))
        else {
            let _ = tx.send((gcode::UNKNOWN_MEMBER_ID, Bytes::new()));
            return rx;
        };
        if generation != g.generation {
            let _ = tx.send((gcode::ILLEGAL_GENERATION, Bytes::new()));
            return rx;
        }
        match g.state {
            State::Preparing { .. } | State::Empty => {
                let _ = tx.send((gcode::REBALANCE_IN_PROGRESS, Bytes::new()));
            }
            State::Stable => {
                let a = g.members[member].assignment.clone();
                let _ = tx.send((kcode::NONE, a));
            }
            State::Completing => {
                if let Some(m) = g.members.get_mut(member) {
                    m.sync = Some(tx);
                    m.last_seen = Instant::now();
                }
                if member == g.leader {
                    for (id, a) in assignments {
                        if let Some(m) = g.members.get_mut(&id) {
                            m.assignment = a;
                        }
                    }
                    g.state = State::Stable;
                    for m in g.members.values_mut() {
                        if let Some(tx) = m.sync.take() {
                            let _ = tx.send((kcode::NONE, m.assignment.clone()));
                        }
                    }
                }
            }
        }
        rx
    }

    /// A member is alive; `REBALANCE_IN_PROGRESS` tells it to join again.
    pub fn heartbeat(&self, group: &str, generation: i32, member: &str) -> i16 {
        let mut groups = self.groups.lock();
        let Some(g) = groups.get_mut(group) else {
            return gcode::UNKNOWN_MEMBER_ID;
        };
        let Some(m) = g.members.get_mut(member) else {
            return gcode::UNKNOWN_MEMBER_ID;
        };
        m.last_seen = Instant::now();
        match g.state {
            State::Preparing { .. } => gcode::REBALANCE_IN_PROGRESS,
            _ if generation != g.generation => gcode::ILLEGAL_GENERATION,
            _ => kcode::NONE,
        }
    }

    /// A member leaves; the others rebalance.
    pub fn leave(&self, group: &str, member: &str) -> i16 {
        let mut groups = self.groups.lock();
        let Some(g) = groups.get_mut(group) else {
            return gcode::UNKNOWN_MEMBER_ID;
        };
        if g.members.remove(member).is_none() {
            return gcode::UNKNOWN_MEMBER_ID;
        }
        tracing::info!(group = %group, member = %member, "Kafka group member left");
        if g.members.is_empty() {
            g.emptied();
            g.empty_since = Some(Instant::now());
        } else {
            g.rebalance(Instant::now());
        }
        kcode::NONE
    }

    /// Whether `member` may commit for `generation` (`-1`: a commit from
    /// outside the group protocol, always accepted).
    pub fn check_commit(&self, group: &str, generation: i32, member: &str) -> i16 {
        if generation < 0 {
            return kcode::NONE;
        }
        let groups = self.groups.lock();
        let Some(g) = groups.get(group) else {
            return gcode::UNKNOWN_MEMBER_ID;
        };
        if !g.members.contains_key(member) {
            return gcode::UNKNOWN_MEMBER_ID;
        }
        // As Kafka: a member of the current generation may still commit
        // while the next rebalance prepares (what it read before it
        // rejoins), not while the new assignment is being handed out.
        match g.state {
            _ if generation != g.generation => gcode::ILLEGAL_GENERATION,
            State::Completing => gcode::REBALANCE_IN_PROGRESS,
            _ => kcode::NONE,
        }
    }

    /// Groups this server coordinates, and their members in all.
    pub fn counts(&self) -> (u64, u64) {
        let groups = self.groups.lock();
        let members = groups.values().map(|g| g.members.len() as u64).sum();
        (groups.len() as u64, members)
    }

    /// Every group: (name, protocol type, state).
    pub fn list(&self) -> Vec<(String, String, &'static str)> {
        let groups = self.groups.lock();
        let mut out: Vec<_> = groups
            .iter()
            .map(|(n, g)| (n.clone(), g.protocol_type.clone(), g.state.name()))
            .collect();
        out.sort();
        out
    }

    /// One group, or `None` if this server does not know it.
    pub fn describe(&self, group: &str) -> Option<Described> {
        let groups = self.groups.lock();
        groups.get(group).map(|g| g.described(Instant::now()))
    }

    /// Every group this server coordinates, by name.
    pub fn describe_all(&self) -> Vec<(String, Described)> {
        let now = Instant::now();
        let groups = self.groups.lock();
        groups
            .iter()
            .map(|(n, g)| (n.clone(), g.described(now)))
            .collect()
    }

    /// Removes members whose session expired, completes rebalances past
    /// their deadline, and forgets groups empty for the retention. Run
    /// periodically.
    pub fn tick(&self) {
        self.tick_at(Instant::now());
    }

    fn tick_at(&self, now: Instant) {
        let mut groups = self.groups.lock();
        let retention = self.retention;
        let mut expired = Vec::new();
        groups.retain(|name, g| {
            let keep = g
                .empty_since
                .is_none_or(|t| now.duration_since(t) < retention);
            if !keep {
                tracing::info!(group = %name, "Kafka group empty past kafka_group_retention_ms; forgotten");
                expired.push(name.clone());
            }
            keep
        });
        self.expired.lock().extend(expired);
        for (name, g) in groups.iter_mut() {
            let before = g.members.len();
            g.members.retain(|id, m| {
                let waiting = m.join.as_ref().is_some_and(|tx| !tx.is_closed());
                let alive = waiting || now.duration_since(m.last_seen) <= m.session;
                if !alive {
                    tracing::info!(group = %name, member = %id, "Kafka group member's session expired");
                }
                alive
            });
            if g.members.len() != before {
                if g.members.is_empty() {
                    g.emptied();
                } else {
                    g.rebalance(now);
                }
            }
            g.try_complete(now);
            if g.members.is_empty() && g.empty_since.is_none() {
                g.empty_since = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests;
