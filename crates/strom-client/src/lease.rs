//! Producer leases, client side. Every leased producer of a driver is held
//! here; one task on the driver's runtime sends a single `RenewLeases` for
//! all of them every third of the shortest lease, so renewals go on while
//! the caller's thread computes (or a Python process holds the GIL). A
//! producer the master reports lost is marked expired, and its later
//! `push`, `flush` and `close` fail with `PRODUCER_EXPIRED`. Registering
//! a producer with the master, which grants the lease, is here too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use strom_proto::{ErrorCode, Request, Response};
use tokio::sync::Notify;

use crate::driver::{Driver, DriverInner};
use crate::error::{unexpected, Error, Result};
use crate::topic::Topic;

/// One producer's lease, shared between the producer and the renewal task.
pub(crate) struct Lease {
    pub topic: String,
    pub producer: u64,
    /// The lease the master granted.
    pub duration: Duration,
    expired: AtomicBool,
}

impl Lease {
    pub fn is_expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }

    /// The error a producer whose lease ran out returns.
    pub fn error(&self) -> Error {
        Error::coded(
            ErrorCode::PRODUCER_EXPIRED,
            format!(
                "producer {} of topic '{}' lost its lease of {:?} (its renewals did not reach the registry master in time); its part of the stream was closed, so open a new producer",
                self.producer, self.topic, self.duration
            ),
        )
    }
}

/// The leases a driver renews.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<HashMap<(String, u64), Weak<Lease>>>,
    started: AtomicBool,
    /// Wakes the renewal task when a lease is added (it may be shorter
    /// than the ones the task is sleeping for).
    added: Arc<Notify>,
}

/// How often the renewal task looks again when no leased producer is alive.
const IDLE: Duration = Duration::from_secs(1);

impl Leases {
    /// Holds a new lease, starting the renewal task with the first one.
    pub fn hold(driver: &Driver, topic: &str, producer: u64, duration: Duration) -> Arc<Lease> {
        let lease = Arc::new(Lease {
            topic: topic.to_string(),
            producer,
            duration,
            expired: AtomicBool::new(false),
        });
        let leases = &driver.inner.leases;
        leases
            .held
            .lock()
            .insert((topic.to_string(), producer), Arc::downgrade(&lease));
        if !leases.started.swap(true, Ordering::AcqRel) {
            let weak = Arc::downgrade(&driver.inner);
            driver
                .inner
                .handle
                .spawn(renew_loop(weak, leases.added.clone()));
        } else {
            leases.added.notify_one();
        }
        lease
    }

    /// Stops renewing a lease (its producer closed).
    pub fn release(&self, lease: &Lease) {
        self.held
            .lock()
            .remove(&(lease.topic.clone(), lease.producer));
    }

    /// The live leases, dropping those whose producer is gone.
    fn live(&self) -> Vec<Arc<Lease>> {
        let mut held = self.held.lock();
        held.retain(|_, w| w.strong_count() > 0);
        held.values()
            .filter_map(Weak::upgrade)
            .filter(|l| !l.is_expired())
            .collect()
    }
}

/// Renews every live lease of the driver, every third of the shortest,
/// and at once when a lease is added.
async fn renew_loop(weak: Weak<DriverInner>, added: Arc<Notify>) {
    loop {
        let every = {
            let Some(inner) = weak.upgrade() else { return };
            let live = inner.leases.live();
            let every = live.iter().map(|l| l.duration / 3).min().unwrap_or(IDLE);
            if !live.is_empty() {
                renew(Driver { inner }, live).await;
            }
            every
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = added.notified() => {}
        }
    }
}

async fn renew(driver: Driver, live: Vec<Arc<Lease>>) {
    let producers = live.iter().map(|l| (l.topic.clone(), l.producer)).collect();
    match driver.master_call(Request::RenewLeases { producers }).await {
        Ok(Response::Leases { lost }) => {
            for l in live
                .iter()
                .filter(|l| lost.iter().any(|(t, p)| *t == l.topic && *p == l.producer))
            {
                tracing::warn!(topic = %l.topic, producer = l.producer, "producer lease lost; the producer is closed");
                l.expired.store(true, Ordering::Release);
                driver.inner.leases.release(l);
            }
        }
        Ok(other) => {
            tracing::warn!(answer = ?other.opcode(), "unexpected answer to RenewLeases")
        }
        // The master may be restarting: it grants a full lease of grace
        // when it comes back, so keep trying.
        Err(e) => tracing::warn!(error = %e, "could not renew producer leases; retrying"),
    }
}

/// Registers the producer with the registry master: with a lease (held by
/// the driver's renewal task) unless `lease` is `None`, or when the master
/// speaks protocol 1, which has no leases.
pub(crate) fn register(
    topic: &Topic,
    lease: Option<Duration>,
) -> Result<(u64, Option<Arc<Lease>>)> {
    let d = topic.driver.clone();
    let name = topic.name().to_string();
    // 0 asks for the server's default; anything else is at least 1 ms.
    let lease_ms = lease.map(|l| match l.as_millis() {
        0 if l.is_zero() => 0,
        ms => ms.clamp(1, u128::from(u32::MAX)) as u32,
    });
    let (id, granted) = topic.driver.block_on(async move {
        let version = d.master_version().await?;
        let req = match lease_ms {
            Some(lease_ms) if version >= 2 => Request::OpenProducer { topic: name, lease_ms },
            Some(_) => {
                tracing::warn!(topic = %name, version, "the registry master speaks no producer leases (protocol 1); the producer stays open until closed");
                Request::RegisterProducer { topic: name }
            }
            None => Request::RegisterProducer { topic: name },
        };
        match d.master_call(req).await? {
            Response::Producer { id } => Ok((id, None)),
            Response::ProducerLease { id, lease_ms } => Ok((id, Some(lease_ms))),
            other => Err(unexpected(other)),
        }
    })?;
    let lease = granted.map(|ms| {
        let duration = Duration::from_millis(u64::from(ms));
        Leases::hold(&topic.driver, topic.name(), id, duration)
    });
    Ok((id, lease))
}
