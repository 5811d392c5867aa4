//! Replicated partitions on one member (docs/replication.md).
//!
//! A partition of a topic with `replication_factor` R lives on R members.
//! The registry names one *leader* per *epoch* and the in-sync replicas
//! (ISR), and tells each member its role (`SetReplicaRoles`). The leader
//! alone takes appends. Each follower copies the leader's log, batch for
//! batch at the same offsets (`ReplicaFetch`, [`follow`]), makes it durable,
//! and asks again from its new end, which tells the leader how far it got.
//! The *high watermark* is the end every in-sync replica holds durably;
//! consumers read only below it, and an `acks=all` append is answered once
//! it passes the batch ([`lead`]). The leader keeps the ISR: a follower
//! that has not caught up within [`LAG`] is dropped, one that catches up is
//! added, each change recorded by the registry first (`ReportIsr`, refused
//! for a stale epoch, which is how a deposed leader learns it was deposed).
//!
//! Every replica keeps its leader-epoch history (`EpochHistory`, the
//! `leader-epochs` file of a file partition). A follower sends its latest
//! epoch with every fetch; the leader answers where that epoch ends in its
//! own history, and the follower cuts its log there if it holds more (a
//! deposed leader's unreplicated tail).

mod follow;
mod lead;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use strom_proto::{ErrorCode, ReplicaRole};
use strom_storage::vfs::{RealFs, Vfs};
use strom_storage::{Appended, EpochHistory};
use tokio::sync::watch;

use crate::error::ServerError;
use crate::health::ReplicaSnapshot;
use crate::partition::{Admitted, AppendReply, PartitionManager, Replication, EPOCHS_FILE};
use crate::peers::Peers;

/// A follower that has not caught up with the leader for this long leaves
/// the in-sync replicas.
pub const LAG: Duration = Duration::from_secs(3);

/// The most bytes of batches one fetch answer carries (at least one batch).
pub const FETCH_BYTES: u32 = 4 << 20;

/// What a member's replicas need from the server around them.
pub struct ReplicaCtx {
    pub me: u32,
    pub peers: Arc<Peers>,
    /// The registry master's address, as this member last reached it.
    pub master: Arc<RwLock<Option<String>>>,
}

/// One replicated partition on this member.
pub struct Replica {
    pub topic: String,
    pub partition: u32,
    me: u32,
    peers: Arc<Peers>,
    master: Arc<RwLock<Option<String>>>,
    epochs: EpochHistory,
    state: Mutex<State>,
    /// Everything below it is durable here.
    durable_end: watch::Sender<u64>,
    /// The partition, to publish the high watermark and write to.
    pm: std::sync::Weak<PartitionManager>,
    min_in_sync: u32,
}

enum State {
    /// No role yet, or a leader the registry deposed: takes no appends.
    Idle {
        epoch: u64,
    },
    Leading(lead::Leading),
    Following {
        epoch: u64,
        leader: u32,
        leader_addr: String,
        stop: Arc<AtomicBool>,
    },
}

impl State {
    fn epoch(&self) -> u64 {
        match self {
            State::Idle { epoch } | State::Following { epoch, .. } => *epoch,
            State::Leading(l) => l.epoch,
        }
    }
}

fn refusal(code: ErrorCode, msg: String) -> ServerError {
    ServerError::coded(code, msg)
}

impl Replica {
    /// The replica of `pm`, its epoch history in the partition's directory
    /// (kept in memory for a memory partition).
    pub fn open(
        pm: &Arc<PartitionManager>,
        ctx: &ReplicaCtx,
        min_in_sync: u32,
    ) -> Result<Arc<Replica>, ServerError> {
        let epochs = match pm.dir() {
            Some(dir) => EpochHistory::open(Arc::new(RealFs), &dir.join(EPOCHS_FILE))?,
            None => {
                let mem: Arc<dyn Vfs> = Arc::new(strom_storage::sim::SimFs::new());
                mem.create_dir(Path::new("/replica"))
                    .map_err(|e| ServerError::io("an in-memory epoch history", e))?;
                EpochHistory::open(mem, Path::new("/replica/leader-epochs"))?
            }
        };
        Ok(Arc::new(Replica {
            topic: pm.topic.clone(),
            partition: pm.id,
            me: ctx.me,
            peers: ctx.peers.clone(),
            master: ctx.master.clone(),
            epochs,
            state: Mutex::new(State::Idle { epoch: 0 }),
            durable_end: watch::Sender::new(pm.next_offset()),
            pm: Arc::downgrade(pm),
            min_in_sync: min_in_sync.max(1),
        }))
    }

    /// The role the registry gives this replica. Blocking (syncs and the
    /// epoch history's file); stale epochs are ignored.
    pub fn set_role(self: &Arc<Self>, role: &ReplicaRole) -> Result<(), ServerError> {
        let Some(pm) = self.pm.upgrade() else {
            return Ok(());
        };
        let mut st = self.state.lock();
        // After a restart the state starts over; the epoch history does not.
        let known = self.epochs.latest().map_or(0, |e| e.epoch);
        if role.epoch < st.epoch().max(known) {
            return Ok(());
        }
        let same = role.epoch == st.epoch();
        if role.leader == self.me {
            if same {
                if let State::Leading(l) = &mut *st {
                    l.set_followers(&role.followers, self.me);
                    l.drop_out_of_sync(&role.isr, self.me);
                    drop(st);
                    self.recompute(&pm);
                    return Ok(());
                }
            }
            stop_following(&st);
            let end = pm.sync_end()?;
            // A leader restarted within its epoch keeps the epoch's start.
            if known < role.epoch {
                self.epochs.assign(role.epoch, end)?;
            }
            self.durable_end.send_replace(end);
            let leading = lead::Leading::new(role, self.me, end, pm.visible());
            *st = State::Leading(leading);
            tracing::info!(topic = %self.topic, partition = self.partition, epoch = role.epoch, end, "leading the partition");
            drop(st);
            self.recompute(&pm);
            self.clone().spawn_isr_keeper(role.epoch);
            return Ok(());
        }
        // The same leader may be back on another address (restarted).
        let unchanged =
            |leader: &u32, addr: &String| *leader == role.leader && *addr == role.leader_addr;
        if same
            && matches!(&*st, State::Following { leader, leader_addr, .. } if unchanged(leader, leader_addr))
        {
            return Ok(());
        }
        let deposed = std::mem::replace(&mut *st, State::Idle { epoch: role.epoch });
        stop_following(&deposed);
        let stop = Arc::new(AtomicBool::new(false));
        *st = State::Following {
            epoch: role.epoch,
            leader: role.leader,
            leader_addr: role.leader_addr.clone(),
            stop: stop.clone(),
        };
        drop(st);
        if let State::Leading(l) = deposed {
            l.fail_pending(&self.topic, self.partition);
        }
        tracing::info!(topic = %self.topic, partition = self.partition, epoch = role.epoch, leader = role.leader, "following the partition's leader");
        let me = self.clone();
        let addr = role.leader_addr.clone();
        let epoch = role.epoch;
        tokio::runtime::Handle::current().spawn(follow::run(me, epoch, addr, stop));
        Ok(())
    }

    /// Everything below `end` is durable here (the partition's syncer).
    fn durable_to(&self, pm: &PartitionManager, end: u64) {
        self.durable_end.send_if_modified(|d| {
            let grew = end > *d;
            *d = (*d).max(end);
            grew
        });
        self.recompute(pm);
    }

    /// See [`PartitionManager::admit`].
    fn admit_append(self: &Arc<Self>, acks_all: bool, reply: AppendReply) -> Admitted {
        let st = self.state.lock();
        let State::Leading(l) = &*st else {
            let why = match &*st {
                State::Following {
                    leader,
                    leader_addr,
                    ..
                } => format!("member {leader} at {leader_addr} leads it"),
                _ => "the registry has named no leader here".to_string(),
            };
            return Err((
                reply,
                refusal(
                    ErrorCode::NOT_PARTITION_LEADER,
                    format!(
                        "partition {}/{} takes no appends on member {}: {why}",
                        self.topic, self.partition, self.me
                    ),
                ),
            ));
        };
        if !acks_all {
            return Ok(reply);
        }
        let in_sync = l.isr.len() as u32;
        if in_sync < self.min_in_sync {
            return Err((
                reply,
                refusal(
                    ErrorCode::NOT_ENOUGH_REPLICAS,
                    format!(
                        "partition {}/{} has {in_sync} in-sync replicas ({:?}); an acks=all append needs min_in_sync = {}",
                        self.topic, self.partition, l.isr, self.min_in_sync
                    ),
                ),
            ));
        }
        drop(st);
        let me = self.clone();
        Ok(Box::new(move |r| match r {
            Ok(a) => me.await_hwm(a, reply),
            Err(e) => reply(Err(e)),
        }))
    }

    /// Answers an `acks=all` append once the high watermark passes it.
    fn await_hwm(&self, a: Appended, reply: AppendReply) {
        let end = a.base_offset + u64::from(a.count);
        let mut st = self.state.lock();
        match &mut *st {
            State::Leading(l) if l.hwm >= end => {
                let done = l.completion(self.min_in_sync, &self.topic, self.partition);
                drop(st);
                reply(done.map(|()| a));
            }
            State::Leading(l) => l.pending.push((end, a, reply)),
            _ => {
                drop(st);
                reply(Err(lead::lost_leadership(&self.topic, self.partition)));
            }
        }
    }

    /// Moves the high watermark to what the in-sync replicas hold, answers
    /// the `acks=all` appends it passed (failing them while fewer than
    /// `min_in_sync` replicas are in sync) and publishes it to consumers.
    fn recompute(&self, pm: &PartitionManager) {
        let durable = *self.durable_end.borrow();
        let (hwm, ready, done) = {
            let mut st = self.state.lock();
            let State::Leading(l) = &mut *st else { return };
            let (hwm, ready) = l.advance(durable);
            let done = match ready.is_empty() {
                true => Ok(()),
                false => l.completion(self.min_in_sync, &self.topic, self.partition),
            };
            (hwm, ready, done)
        };
        pm.publish_hwm(hwm);
        if let Err(e) = &done {
            tracing::warn!(topic = %self.topic, partition = self.partition, batches = ready.len(), error = %e, "acks=all appends failed: too few in-sync replicas after the append");
        }
        for (_, a, reply) in ready {
            reply(match &done {
                Ok(()) => Ok(a),
                Err(e) => Err(refusal(e.code(), e.to_string())),
            });
        }
    }

    /// Stops this replica for good (its partition moved away): it stops
    /// following, and a leader answers its waiting appends with the loss
    /// of leadership.
    pub fn stop(&self) {
        let epoch = self.state.lock().epoch();
        let old = std::mem::replace(&mut *self.state.lock(), State::Idle { epoch: u64::MAX });
        stop_following(&old);
        if let State::Leading(l) = old {
            l.fail_pending(&self.topic, self.partition);
        }
        tracing::debug!(topic = %self.topic, partition = self.partition, epoch, "replica stopped");
    }

    /// Whether this replica leads its partition now.
    pub fn is_leader(&self) -> bool {
        matches!(&*self.state.lock(), State::Leading(_))
    }

    /// The current epoch and the in-sync replicas, when leading.
    pub fn leading(&self) -> Option<(u64, BTreeSet<u32>)> {
        match &*self.state.lock() {
            State::Leading(l) => Some((l.epoch, l.isr.clone())),
            _ => None,
        }
    }

    /// `(epoch, start offset)` of every leader epoch this replica knows.
    fn epoch_list(&self) -> Vec<(u64, u64)> {
        self.epochs
            .entries()
            .into_iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect()
    }
}

fn stop_following(st: &State) {
    if let State::Following { stop, .. } = st {
        stop.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// How the partition sees its replica.
impl Replication for Replica {
    fn is_leader(&self) -> bool {
        Replica::is_leader(self)
    }

    fn admit(self: Arc<Self>, acks_all: bool, reply: AppendReply) -> Admitted {
        self.admit_append(acks_all, reply)
    }

    fn durable(&self, pm: &PartitionManager, end: u64) {
        self.durable_to(pm, end)
    }

    fn stop(&self) {
        Replica::stop(self)
    }

    fn status(&self) -> Option<ReplicaSnapshot> {
        let durable = *self.durable_end.borrow();
        let st = self.state.lock();
        Some(match &*st {
            State::Idle { epoch } => ReplicaSnapshot {
                role: "idle".into(),
                epoch: *epoch,
                ..ReplicaSnapshot::default()
            },
            State::Following { epoch, leader, .. } => ReplicaSnapshot {
                role: "follower".into(),
                epoch: *epoch,
                leader: Some(*leader),
                ..ReplicaSnapshot::default()
            },
            State::Leading(l) => {
                let followers = l.follower_snapshots(durable);
                ReplicaSnapshot {
                    role: "leader".into(),
                    epoch: l.epoch,
                    leader: Some(self.me),
                    high_watermark: l.hwm,
                    replicas: u32::try_from(followers.len() + 1).unwrap_or(u32::MAX),
                    isr: l.isr.iter().copied().collect(),
                    followers,
                }
            }
        })
    }
}
