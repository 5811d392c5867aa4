//! Following the registry's master (docs/replication.md). Without a
//! metadata quorum, the master is member 0 and never moves. With one, it is
//! the Raft leader, and it moves when the leader dies or loses its quorum:
//! a registry request that finds no master, or a server answering
//! `NOT_MASTER`, makes the driver ask the members it knows (their `Hello`
//! names the leader each of them knows, or none during an election) and
//! retry at the leader they name, until [`FOLLOW_FOR`] has passed. The
//! user sees a pause, not an error. A request that gets no answer at all
//! (a master paused, or one whose host is gone without a reset) fails with
//! `TIMEOUT` after the driver's request timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_proto::{ErrorCode, Request, Response};

use crate::conn::ClientConn;
use crate::driver::Driver;
use crate::error::{Error, Result};

/// How long a registry request keeps looking for a master that moved.
pub const FOLLOW_FOR: Duration = Duration::from_secs(15);

/// How long it looks when no member reports an election or another
/// master (a group without a quorum whose master is down).
const NO_SIGN_FOR: Duration = Duration::from_secs(2);

const RETRY_EVERY: Duration = Duration::from_millis(200);

/// How long one member may take to answer a `Hello`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a registry request that waits for its answer checks whether
/// another member leads now: a master that is paused or cut off answers
/// nothing, and never says that it was deposed.
const CHECK_MOVED_EVERY: Duration = Duration::from_millis(500);

/// What the members said about the master.
enum Probe {
    /// A member names this master.
    Master(String),
    /// A member knows of no master (an election is in progress), or the
    /// group has a metadata quorum (one will be held if the master is gone).
    Electing,
    /// None answered, or all named the master already tried.
    Nothing,
}

impl Driver {
    /// Remembers members' primary addresses, to look for a master among.
    pub(crate) fn know_members(&self, addrs: impl IntoIterator<Item = String>) {
        let mut known = self.inner.members.lock();
        for a in addrs {
            if !a.is_empty() && !known.contains(&a) {
                known.push(a);
            }
        }
    }

    /// Sends a registry request to the master, following it if it moved.
    pub(crate) async fn leader_call(&self, req: &Request) -> Result<Response> {
        self.leader_call_resent(req).await.0
    }

    /// [`leader_call`](Self::leader_call), and whether the request was
    /// sent again after a connection lost before its answer (the first
    /// attempt may have been applied).
    pub(crate) async fn leader_call_resent(&self, req: &Request) -> (Result<Response>, bool) {
        let mut resent = false;
        let r = self
            .with_master(
                |c| async move { c.call(req, Vec::new()).await },
                &mut resent,
            )
            .await;
        (r, resent)
    }

    /// Opens the connection to the master, following it if it moved.
    pub(crate) async fn reach_master(&self) -> Result<()> {
        self.with_master(|_| async { Ok(()) }, &mut false).await
    }

    /// Runs `op` on the connection to the master; if there is no master
    /// there (unreachable, `NOT_MASTER`, the connection was lost before the
    /// answer, or another member leads while `op` still waits), looks for
    /// it and runs `op` again there. Sets `resent` if `op` ran again after
    /// an answer that was lost or given up on.
    async fn with_master<T, F, Fut>(&self, op: F, resent: &mut bool) -> Result<T>
    where
        F: Fn(Arc<ClientConn>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let limit = self.request_timeout();
        let deadline = tokio::time::Instant::from_std(started + limit);
        let mut signs = false;
        let mut lost = false;
        loop {
            *resent |= lost;
            let master = self.master();
            let attempt = async {
                let c = self.conn(&master).await.map_err(|e| (e, false))?;
                let v = op(c.clone()).await.map_err(|e| (e, true))?;
                Ok::<_, (Error, bool)>((v, c.greeting()))
            };
            let outcome = tokio::select! {
                r = attempt => r,
                _ = tokio::time::sleep_until(deadline) => {
                    // The request may still be applied if the server wakes.
                    Err((Error::coded(ErrorCode::TIMEOUT, format!("the registry master {master} did not answer within the request timeout ({limit:?})")), true))
                }
                to = self.moved_from(&master) => {
                    // The request may still be applied where it waits.
                    tracing::info!(from = %master, to = %to, "the registry master moved while a request waited for it; following it");
                    *self.inner.master.lock() = to;
                    lost = true;
                    signs = true;
                    if started.elapsed() < FOLLOW_FOR {
                        continue;
                    }
                    Err((Error::coded(ErrorCode::NOT_MASTER, format!("{master} did not answer, and another member leads")), true))
                }
            };
            let err = match outcome {
                Ok((v, greeting)) => {
                    *self.inner.master_id.lock() = Some(greeting.member);
                    self.inner
                        .meta_voters
                        .store(greeting.meta_voters, std::sync::atomic::Ordering::Relaxed);
                    return Ok(v);
                }
                Err((e, true)) if e.code() == ErrorCode::NOT_MASTER => e,
                Err((e, true)) if e.code() == ErrorCode::CONNECTION_CLOSED => {
                    lost = true;
                    e
                }
                Err((e, true)) => return Err(e),
                // Refused credentials are no sign of a missing master.
                Err((e, false)) if e.code() == ErrorCode::UNAUTHENTICATED => return Err(e),
                Err((e, false)) => e,
            };
            // A group with a metadata quorum elects another master: wait for it.
            signs |= self
                .inner
                .meta_voters
                .load(std::sync::atomic::Ordering::Relaxed)
                > 1;
            let limit = |signs: bool| if signs { FOLLOW_FOR } else { NO_SIGN_FOR };
            match self.find_master(&master).await {
                Probe::Master(addr) if addr != master => {
                    tracing::info!(from = %master, to = %addr, "the registry master moved; following it");
                    *self.inner.master.lock() = addr;
                    signs = true;
                    if started.elapsed() < FOLLOW_FOR {
                        continue;
                    }
                }
                Probe::Master(_) | Probe::Electing => signs = true,
                Probe::Nothing => signs |= err.code() == ErrorCode::NOT_MASTER,
            }
            if started.elapsed() >= limit(signs) {
                return Err(gave_up(err, started.elapsed()));
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }

    /// Returns, once a member names a master other than `master` (checked
    /// every [`CHECK_MOVED_EVERY`]), its address; never while `master`
    /// leads.
    async fn moved_from(&self, master: &str) -> String {
        loop {
            tokio::time::sleep(CHECK_MOVED_EVERY).await;
            if let Probe::Master(addr) = self.find_master(master).await {
                if addr != master {
                    return addr;
                }
            }
        }
    }

    /// Learns the members the group file names now (a group whose
    /// members all restarted on other addresses is found again there);
    /// returns each member's address in it.
    fn reread_group_file(&self) -> Vec<(u32, String)> {
        let Some(path) = self.inner.group_file.lock().clone() else {
            return Vec::new();
        };
        let Ok(text) = std::fs::read(&path) else {
            return Vec::new();
        };
        let Ok(group) = serde_json::from_slice::<strom_proto::GroupFile>(&text) else {
            return Vec::new();
        };
        self.know_members(group.members.iter().map(|m| m.addr.clone()));
        group.members.into_iter().map(|m| (m.id, m.addr)).collect()
    }

    /// Asks every known member which master it knows of.
    async fn find_master(&self, tried: &str) -> Probe {
        let in_file = self.reread_group_file();
        let mut candidates = self.inner.members.lock().clone();
        if !candidates.iter().any(|a| a == tried) {
            candidates.push(tried.to_string());
        }
        let mut electing = false;
        // The master last reached, under another address, is not a move
        // (a client cut off from it keeps being cut off)...
        let last = *self.inner.master_id.lock();
        for addr in candidates {
            let connect =
                ClientConn::connect(&self.inner.transports, &addr, self.inner.token.as_deref());
            let Ok(Ok(c)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await else {
                continue;
            };
            let g = c.greeting();
            self.know_members(g.members.iter().map(|m| m.addr.clone()));
            // A member of a metadata quorum: a master that is gone is
            // replaced by an election, which takes a while to notice.
            electing |= g.meta_voters > 1;
            if g.master == u32::MAX {
                electing = true;
                continue;
            }
            let named = g.members.iter().find(|m| m.id == g.master);
            // Unless the group's own file names it there: then it was
            // restarted on that address.
            let restarted = named.is_some_and(|m| in_file.contains(&(m.id, m.addr.clone())));
            if last == Some(g.master) && addr != tried && !restarted {
                continue;
            }
            match named {
                Some(m) if m.addr != tried => return Probe::Master(m.addr.clone()),
                Some(m) if addr == tried => return Probe::Master(m.addr.clone()),
                _ => {}
            }
        }
        if electing {
            Probe::Electing
        } else {
            Probe::Nothing
        }
    }
}

fn gave_up(e: Error, after: Duration) -> Error {
    Error::coded(
        e.code(),
        format!(
            "the registry master is unreachable ({}; looked for it for {:.1} s); topic administration waits for it, partitions already known keep working",
            e.message(),
            after.as_secs_f64()
        ),
    )
}
