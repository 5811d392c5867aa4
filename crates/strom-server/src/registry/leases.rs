//! Producer leases. A producer opened with a lease is recorded with its
//! duration (`RegisterProducer { lease_ms }`); its client renews it with one
//! `RenewLeases` per process. The deadlines are volatile (`Inner.
//! lease_deadline`); [`Registry::expire_due`], run by the server's lease
//! loop, commits `ExpireProducer` for each producer past its deadline
//! through the same path as a close, so the stream still ends and its
//! partitions are sealed.

use std::time::{Duration, Instant};

use strom_proto::ErrorCode;

use super::machine::RegistryCommand;
use super::{Registry, LEASE_RANGE_MS};
use crate::error::ServerError;

impl Registry {
    /// The lease granted for a request of `lease_ms` (0: the default).
    pub fn grant(&self, lease_ms: u32) -> u32 {
        match lease_ms {
            0 => self.default_lease_ms,
            ms => ms.clamp(LEASE_RANGE_MS.0, LEASE_RANGE_MS.1),
        }
    }

    /// Registers a producer holding a lease; returns its id and the lease
    /// granted, in milliseconds.
    pub async fn open_producer(
        &self,
        name: &str,
        lease_ms: u32,
    ) -> Result<(u64, u32), ServerError> {
        let lease_ms = self.grant(lease_ms);
        let mut inner = self.inner.lock().await;
        let producer = self.next_producer(&inner, name)?;
        inner
            .commit(RegistryCommand::RegisterProducer {
                topic: name.to_string(),
                producer,
                lease_ms: Some(lease_ms),
            })
            .await?;
        inner.lease_deadline.insert(
            (name.to_string(), producer),
            Instant::now() + Duration::from_millis(u64::from(lease_ms)),
        );
        Ok((producer, lease_ms))
    }

    /// Producers holding a lease now, over every topic.
    pub async fn open_leases(&self) -> u64 {
        let inner = self.inner.lock().await;
        inner
            .state
            .topics
            .values()
            .map(|t| t.leases.len() as u64)
            .sum()
    }

    /// Moves the deadline of every listed producer that still holds its
    /// lease; returns those that do not (expired, closed or unknown).
    pub async fn renew(&self, producers: Vec<(String, u64)>) -> Vec<(String, u64)> {
        let mut inner = self.inner.lock().await;
        let now = Instant::now();
        let mut lost = Vec::new();
        for (topic, producer) in producers {
            let lease = inner
                .state
                .topics
                .get(&topic)
                .and_then(|t| t.leases.get(&producer).copied());
            match lease {
                Some(ms) => {
                    let deadline = now + Duration::from_millis(u64::from(ms));
                    inner.lease_deadline.insert((topic, producer), deadline);
                }
                None => lost.push((topic, producer)),
            }
        }
        lost
    }

    /// Expires every producer whose lease ran out, sealing the partitions
    /// of each topic whose stream ends by it. Returns how many expired.
    pub async fn expire_due(&self) -> usize {
        let mut inner = self.inner.lock().await;
        let now = Instant::now();
        let due: Vec<(String, u64)> = inner
            .lease_deadline
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut expired = 0;
        for key in due {
            inner.lease_deadline.remove(&key);
            let (topic, producer) = key;
            let leased = inner
                .state
                .topics
                .get(&topic)
                .is_some_and(|t| t.leases.contains_key(&producer));
            if !leased {
                continue;
            }
            let cmd = RegistryCommand::ExpireProducer {
                topic: topic.clone(),
                producer,
            };
            match self.commit_and_seal(&mut inner, &topic, cmd).await {
                Ok(()) => {
                    expired += 1;
                    tracing::info!(topic = %topic, producer, "producer lease expired; its part of the stream is closed");
                }
                Err(e) => {
                    tracing::warn!(topic = %topic, producer, error = %e, "could not expire a producer; retrying");
                    inner.lease_deadline.insert((topic, producer), now);
                }
            }
        }
        expired
    }

    /// Pushes every lease deadline back by `by`: after the master itself
    /// stalled (the lease loop ran late), renewals could not be heard, so
    /// the stall does not count against producers.
    pub async fn extend_leases(&self, by: Duration) {
        let mut inner = self.inner.lock().await;
        for d in inner.lease_deadline.values_mut() {
            *d += by;
        }
    }

    /// `PRODUCER_EXPIRED` if the producer's lease ran out.
    pub(super) fn check_not_expired(
        meta: &super::machine::TopicMeta,
        producer: u64,
    ) -> Result<(), ServerError> {
        if meta.expired.contains(&producer) {
            return Err(ServerError::coded(
                ErrorCode::PRODUCER_EXPIRED,
                format!(
                    "producer {producer} of topic '{}' was not renewed in time; its lease expired and its part of the stream is closed",
                    meta.spec.name
                ),
            ));
        }
        Ok(())
    }
}
