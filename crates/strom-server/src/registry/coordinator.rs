//! The coordinator of partitioned consumer groups on the master (design
//! §4): every tick it computes each group's target with the sticky
//! [`assign`](super::assign::assign)or and moves partitions by cooperative
//! handoff. A partition whose holder must change is first *revoked* (left
//! out of the holder's heartbeat answers), then `Released` once the holder
//! stops listing it, left, or a session passed; a free partition is fenced
//! at its owner (`FenceGroupPartition`, outside the registry lock) and only
//! then `Assigned` under a new epoch. Heartbeats are answered from a view
//! kept under the coordinator's own mutex, never the registry's async lock.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use strom_proto::{ConsumerGroupMode, ErrorCode, Request, Response};

use super::assign::assign;
use super::group_machine::{ConsumerGroupMeta, GroupCommand};
use super::machine::RegistryCommand;
use super::{Inner, Registry};
use crate::error::ServerError;

/// Longest pause between a member's heartbeats, in milliseconds.
const MAX_HEARTBEAT_MS: u32 = 500;

/// What heartbeat answers of one group are made of.
#[derive(Clone, Default)]
struct View {
    generation: u64,
    /// partition -> (consumer, epoch)
    assignment: BTreeMap<u32, (u64, u64)>,
    ended: bool,
    heartbeat_ms: u32,
}

/// Volatile state of the partitioned groups (in the `Coordinator`).
#[derive(Default)]
pub struct Partitioned {
    views: HashMap<String, View>,
    /// (group, partition) -> when its revocation started.
    revoking: HashMap<(String, u32), Instant>,
    /// (group, consumer) -> when it last reported, and what it owned.
    owned: HashMap<(String, u64), (Instant, Vec<u32>)>,
    /// (group, partition) -> end offset its holder read and committed.
    done: HashMap<(String, u32), u64>,
}

/// A free partition to fence and assign.
struct Plan {
    group: String,
    topic: String,
    partition: u32,
    consumer: u64,
    epoch: u64,
    member: u32,
    addr: String,
}

/// Whether a partitioned group read its whole stream: the topic ended and
/// every partition was read and committed to its end.
pub(super) fn group_ended(inner: &Inner, meta: &ConsumerGroupMeta) -> bool {
    let Some(t) = inner.state.topics.get(&meta.spec.topic) else {
        return false;
    };
    meta.spec.mode == ConsumerGroupMode::Partitioned
        && t.state().ended
        && (0..t.spec.partitions).all(|p| meta.done.contains_key(&p))
}

fn view_of(inner: &Inner, meta: &ConsumerGroupMeta) -> View {
    View {
        generation: meta.generation,
        assignment: meta.assignment.clone(),
        ended: group_ended(inner, meta),
        heartbeat_ms: (meta.spec.session_ms / 3).clamp(100, MAX_HEARTBEAT_MS),
    }
}

impl Partitioned {
    /// The master stalled for `by`: revocations in progress get that much
    /// longer before their session runs out, as sessions do.
    pub(super) fn extend_revocations(&mut self, by: Duration) {
        for since in self.revoking.values_mut() {
            *since += by;
        }
    }

    /// The answer to `consumer`: its partitions, less those being revoked.
    fn answer(&self, group: &str, consumer: u64, view: &View) -> Response {
        let assigned = view
            .assignment
            .iter()
            .filter(|(p, (c, _))| {
                *c == consumer && !self.revoking.contains_key(&(group.to_string(), **p))
            })
            .map(|(p, (_, e))| (*p, *e))
            .collect();
        Response::ConsumerAssignment {
            generation: view.generation,
            assigned,
            ended: view.ended,
            heartbeat_ms: view.heartbeat_ms,
        }
    }

    /// Records a heartbeat's report; `None` if the group has no view yet.
    fn heartbeat(
        &mut self,
        group: &str,
        consumer: u64,
        owned: &[(u32, u64)],
        done: &[(u32, u64)],
    ) -> Option<Response> {
        let view = self.views.get(group)?.clone();
        let key = (group.to_string(), consumer);
        let parts = owned.iter().map(|(p, _)| *p).collect();
        self.owned.insert(key, (Instant::now(), parts));
        for (p, end) in done {
            // Only the holder's word counts.
            if view.assignment.get(p).is_some_and(|(c, _)| *c == consumer) {
                self.done.insert((group.to_string(), *p), *end);
            }
        }
        Some(self.answer(group, consumer, &view))
    }
}

impl Registry {
    /// A member of a consumer group is alive; a partitioned group's member
    /// learns the partitions it may hold. `UNKNOWN_CONSUMER` if its session
    /// expired or it left: it must join again.
    pub async fn consumer_heartbeat(
        &self,
        group: &str,
        consumer: u64,
        owned: Vec<(u32, u64)>,
        done: Vec<(u32, u64)>,
    ) -> Result<Response, ServerError> {
        {
            let mut coord = self.coord.lock();
            coord.touch(group, consumer)?;
            if let Some(r) = coord.parts.heartbeat(group, consumer, &owned, &done) {
                return Ok(r);
            }
        }
        // No view yet (a new group, or a restarted master): read the state.
        let inner = self.inner.lock().await;
        let meta = inner.state.consumer_groups.get(group).ok_or_else(|| {
            ServerError::coded(
                ErrorCode::CONSUMER_GROUP_NOT_FOUND,
                format!("no consumer group named '{group}'"),
            )
        })?;
        let mut coord = self.coord.lock();
        if meta.spec.mode == ConsumerGroupMode::Partitioned {
            coord
                .parts
                .views
                .insert(group.to_string(), view_of(&inner, meta));
            if let Some(r) = coord.parts.heartbeat(group, consumer, &owned, &done) {
                return Ok(r);
            }
        }
        Ok(Response::ConsumerAssignment {
            generation: meta.generation,
            assigned: Vec::new(),
            ended: false,
            heartbeat_ms: 0,
        })
    }

    /// One coordinator tick: records finished partitions, revokes and
    /// releases what must move, then fences and assigns free partitions.
    pub async fn rebalance_groups(&self) {
        let plans = {
            let mut inner = self.inner.lock().await;
            self.record_done(&mut inner).await;
            let names: Vec<String> = inner
                .state
                .consumer_groups
                .values()
                .filter(|m| m.spec.mode == ConsumerGroupMode::Partitioned)
                .map(|m| m.spec.name.clone())
                .collect();
            let mut plans = Vec::new();
            for g in names {
                self.plan_group(&mut inner, &g, &mut plans).await;
            }
            plans
        };
        let mut fenced = Vec::new();
        for plan in plans {
            let req = Request::FenceGroupPartition {
                topic: plan.topic.clone(),
                partition: plan.partition,
                group: plan.group.clone(),
                consumer: plan.consumer,
                epoch: plan.epoch,
            };
            match self.link.call(plan.member, &plan.addr, req).await {
                Ok(_) => fenced.push(plan),
                Err(e) => {
                    tracing::warn!(group = %plan.group, partition = plan.partition, member = plan.member, error = %e, "could not fence a partition; retrying next tick")
                }
            }
        }
        let mut inner = self.inner.lock().await;
        for plan in fenced {
            let cmd = RegistryCommand::ConsumerGroup(GroupCommand::Assigned {
                group: plan.group.clone(),
                partition: plan.partition,
                consumer: plan.consumer,
                epoch: plan.epoch,
            });
            // The plan may be stale (the consumer left meanwhile): then
            // the check refuses it and the next tick plans again.
            match inner.commit(cmd).await {
                Ok(()) => {
                    tracing::info!(group = %plan.group, partition = plan.partition, consumer = plan.consumer, epoch = plan.epoch, "partition assigned")
                }
                Err(e) => {
                    tracing::debug!(group = %plan.group, partition = plan.partition, error = %e, "stale assignment skipped")
                }
            }
        }
        self.refresh_views(&inner);
    }

    /// Commits the `Done` reports heartbeats brought.
    async fn record_done(&self, inner: &mut Inner) {
        let reports: Vec<((String, u32), u64)> = self.coord.lock().parts.done.drain().collect();
        for ((group, partition), end) in reports {
            let known = inner
                .state
                .consumer_groups
                .get(&group)
                .map(|m| m.done.get(&partition) == Some(&end));
            if known != Some(false) {
                continue;
            }
            let cmd = RegistryCommand::ConsumerGroup(GroupCommand::Done {
                group: group.clone(),
                partition,
                end,
            });
            if let Err(e) = inner.commit(cmd).await {
                tracing::warn!(group = %group, partition, error = %e, "could not record a finished partition");
            }
        }
    }

    /// Revokes and releases what must move in group `g`, and plans the
    /// fences of its free partitions.
    async fn plan_group(&self, inner: &mut Inner, g: &str, plans: &mut Vec<Plan>) {
        let Some(meta) = inner.state.consumer_groups.get(g).cloned() else {
            return;
        };
        let Some(t) = inner.state.topics.get(&meta.spec.topic) else {
            return;
        };
        let (n, placement) = (t.spec.partitions, t.placement.clone());
        let live: Vec<u64> = meta.consumers.keys().copied().collect();
        let held = meta.assignment.iter().map(|(p, (c, _))| (*p, *c)).collect();
        let target = assign(n, &live, &held);
        let session = Duration::from_millis(u64::from(meta.spec.session_ms));
        let now = Instant::now();
        let mut releases = Vec::new();
        {
            let mut coord = self.coord.lock();
            let parts = &mut coord.parts;
            parts
                .owned
                .retain(|(gg, c), _| gg != g || meta.consumers.contains_key(c));
            parts.revoking.retain(|(gg, p), _| {
                gg != g
                    || meta
                        .assignment
                        .get(p)
                        .is_some_and(|(c, _)| target.get(p) != Some(c))
            });
            for (p, (c, _)) in &meta.assignment {
                if target.get(p) == Some(c) {
                    continue;
                }
                let since = *parts.revoking.entry((g.to_string(), *p)).or_insert(now);
                let gone = !meta.consumers.contains_key(c);
                let let_go = parts
                    .owned
                    .get(&(g.to_string(), *c))
                    .is_some_and(|(at, owned)| *at > since && !owned.contains(p));
                if gone || let_go || now.duration_since(since) > session {
                    releases.push(*p);
                }
            }
        }
        for p in releases {
            let cmd = RegistryCommand::ConsumerGroup(GroupCommand::Released {
                group: g.to_string(),
                partition: p,
            });
            match inner.commit(cmd).await {
                Ok(()) => {
                    self.coord.lock().parts.revoking.remove(&(g.to_string(), p));
                    tracing::info!(group = %g, partition = p, "partition released");
                }
                Err(e) => {
                    tracing::warn!(group = %g, partition = p, error = %e, "could not release a partition")
                }
            }
        }
        let meta = &inner.state.consumer_groups[g];
        let mut epoch = meta.max_epoch;
        for p in 0..n {
            if meta.assignment.contains_key(&p) {
                continue;
            }
            let (Some(c), Some(member)) = (target.get(&p), placement.get(p as usize)) else {
                continue;
            };
            epoch += 1;
            plans.push(Plan {
                group: g.to_string(),
                topic: meta.spec.topic.clone(),
                partition: p,
                consumer: *c,
                epoch,
                member: *member,
                addr: inner.addr_of(*member),
            });
        }
    }

    /// Rebuilds every partitioned group's heartbeat view from the state.
    fn refresh_views(&self, inner: &Inner) {
        let views: HashMap<String, View> = inner
            .state
            .consumer_groups
            .iter()
            .filter(|(_, m)| m.spec.mode == ConsumerGroupMode::Partitioned)
            .map(|(g, m)| (g.clone(), view_of(inner, m)))
            .collect();
        let mut coord = self.coord.lock();
        coord
            .parts
            .revoking
            .retain(|(g, _), _| views.contains_key(g));
        coord.parts.views = views;
    }
}
