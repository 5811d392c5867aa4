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
    session: Duration,
    rebalance: Duration,
    protocols: Vec<(String, Bytes)>,
    last_seen: Instant,
    join: Option<oneshot::Sender<Joined>>,
    sync: Option<oneshot::Sender<(i16, Bytes)>>,
    assignment: Bytes,
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
            generation: 0,
            protocol_type,
            protocol: String::new(),
            leader: String::new(),
            members: BTreeMap::new(),
        }
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
    /// deadline without those that did not.
    fn try_complete(&mut self, now: Instant) {
        let State::Preparing { deadline } = self.state else {
            return;
        };
        // A member whose JoinGroup connection closed has not joined.
        let joined = |m: &Member| m.join.as_ref().is_some_and(|tx| !tx.is_closed());
        let all_joined = self.members.values().all(joined);
        if !(all_joined || now >= deadline) {
            return;
        }
        self.members.retain(|_, m| joined(m));
        if self.members.is_empty() {
            self.state = State::Empty;
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
            self.state = State::Empty;
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
    /// Groups forgotten since the last [`Coordinator::take_expired`].
    expired: Mutex<Vec<String>>,
}

impl Default for Coordinator {
    /// Kafka's defaults: a week of retention (`offsets.retention.minutes`);
    /// at most 10,000 members.
    fn default() -> Self {
        Self::new(Duration::from_secs(7 * 24 * 3600), 10_000)
    }
}

impl Coordinator {
    /// Forgets groups empty for `retention`; refuses members past
    /// `max_size` in one group.
    pub fn new(retention: Duration, max_size: usize) -> Self {
        Coordinator {
            groups: Mutex::new(HashMap::new()),
            next_member: AtomicU64::new(0),
            retention,
            max_size: max_size.max(1),
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
        let id = if r.member_id.is_empty() {
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
            g.state = State::Empty;
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
        let now = Instant::now();
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
                    g.state = State::Empty;
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
mod tests {
    use super::*;

    fn req(member: &str) -> JoinRequest {
        JoinRequest {
            group: "g".into(),
            member_id: member.into(),
            client_id: "c".into(),
            session: Duration::from_secs(10),
            rebalance: Duration::from_secs(10),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"sub"))],
        }
    }

    #[test]
    fn two_members_join_sync_and_rebalance_when_one_leaves() {
        let c = Coordinator::default();
        let a = c
            .join(req(""))
            .try_recv()
            .expect("alone: completes at once");
        assert_eq!((a.error, a.generation), (kcode::NONE, 1));
        assert_eq!(a.leader, a.member_id);
        // A second member: a rebalance; the first learns it by heartbeat.
        let mut b_rx = c.join(req(""));
        assert!(b_rx.try_recv().is_err(), "waits for the first to rejoin");
        assert_eq!(
            c.heartbeat("g", 1, &a.member_id),
            gcode::REBALANCE_IN_PROGRESS
        );
        // Before it rejoins, it may still commit what it read.
        assert_eq!(c.check_commit("g", 1, &a.member_id), kcode::NONE);
        let a2 = c.join(req(&a.member_id)).try_recv().expect("completes");
        let b = b_rx.try_recv().expect("completes");
        assert_eq!((a2.generation, b.generation), (2, 2));
        assert_eq!(a2.members.len(), 2, "the leader gets the subscriptions");
        assert!(b.members.is_empty());
        // No commits while the new assignment is handed out.
        assert_eq!(
            c.check_commit("g", 2, &a.member_id),
            gcode::REBALANCE_IN_PROGRESS
        );
        // The follower waits for the leader's assignment.
        let mut fb = c.sync("g", 2, &b.member_id, vec![]);
        assert!(fb.try_recv().is_err());
        let la = c.sync(
            "g",
            2,
            &a.member_id,
            vec![
                (a.member_id.clone(), Bytes::from_static(b"A")),
                (b.member_id.clone(), Bytes::from_static(b"B")),
            ],
        );
        assert_eq!(
            la.blocking_recv().expect("answer").1,
            Bytes::from_static(b"A")
        );
        assert_eq!(fb.try_recv().expect("answer").1, Bytes::from_static(b"B"));
        assert_eq!(c.heartbeat("g", 2, &b.member_id), kcode::NONE);
        assert_eq!(c.check_commit("g", 2, &b.member_id), kcode::NONE);
        // One leaves: the other is told to rejoin and is alone at gen 3.
        assert_eq!(c.leave("g", &a.member_id), kcode::NONE);
        assert_eq!(
            c.heartbeat("g", 2, &b.member_id),
            gcode::REBALANCE_IN_PROGRESS
        );
        let b3 = c.join(req(&b.member_id)).try_recv().expect("completes");
        assert_eq!((b3.generation, b3.leader.clone()), (3, b.member_id.clone()));
        assert_eq!(
            c.check_commit("g", 2, &b.member_id),
            gcode::ILLEGAL_GENERATION
        );
    }

    #[test]
    fn a_full_group_refuses_a_new_member() {
        let c = Coordinator::new(Duration::from_secs(60), 2);
        let a = c.join(req("")).try_recv().expect("alone: at once");
        let _b = c.join(req(""));
        let refused = c.join(req("")).try_recv().expect("refused at once");
        assert_eq!(refused.error, gcode::GROUP_MAX_SIZE_REACHED);
        // A known member rejoining is not a new one.
        let mut again = c.join(req(&a.member_id));
        assert!(!matches!(again.try_recv(), Ok(j) if j.error == gcode::GROUP_MAX_SIZE_REACHED));
    }

    #[test]
    fn an_empty_group_is_forgotten_after_the_retention() {
        let c = Coordinator::new(Duration::ZERO, 10);
        let a = c.join(req("")).try_recv().expect("alone: at once");
        c.tick();
        assert!(c.take_expired().is_empty(), "a group with a member stays");
        assert_eq!(c.leave("g", &a.member_id), kcode::NONE);
        c.tick();
        assert_eq!(c.take_expired(), vec!["g".to_string()]);
        assert!(c.list().is_empty());
        assert!(c.take_expired().is_empty(), "handed out once");
    }
}
