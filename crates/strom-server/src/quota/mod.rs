//! Quotas (docs/quotas.md): produce and consume bytes per second and
//! stored bytes, per principal and per topic or topic prefix. The table
//! lives in the registry (`registry/quota_machine.rs`); each server keeps
//! a copy (`sync.rs`) and enforces it on the partitions it hosts.
//!
//! - Rate quotas never refuse: [`Quotas::delay`] meters the bytes of a
//!   request and says how long its answer must wait (Kafka's throttle
//!   time); the front end holds the answer that long (native) or reports
//!   it (`throttle_time_ms`, Kafka).
//! - Storage quotas refuse appends once a topic's (or prefix's) stored
//!   bytes on this member reach the quota: `QUOTA_EXCEEDED`
//!   ([`crate::service::DataService::produce`]).
//!
//! Quotas are per member, as Kafka's are per broker: a member hosting
//! leaders of several partitions meters their traffic together.

mod fair;
mod meter;
pub mod sync;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use strom_auth::Principal;

pub use fair::{Fair, OwnedSlot, SLOTS};
pub use meter::{Meter, BURST, MAX_DELAY};
pub use table::{
    Applies, Limit, QuotaChange, QuotaKey, QuotaLimits, QuotaTable, MAX_PRIORITY, MAX_QUOTAS,
};

/// Meters kept before idle ones are dropped.
const MAX_METERS: usize = 4096;
/// A meter idle this long is full again, so dropping it changes nothing.
const IDLE: Duration = Duration::from_secs(10);

/// How long answers were held for one quota, for the metrics tap.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Throttled {
    /// `produce` or `consume`.
    pub kind: String,
    /// The quota's key as `strom quota list` shows it.
    pub key: String,
    /// Answers held.
    pub answers: u64,
    /// Their total wait, in microseconds.
    pub micros: u64,
}

/// The quotas in a server's snapshot (the metrics tap).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct QuotaSnapshot {
    /// The version of the table this server enforces.
    pub version: u64,
    /// The quotas that held answers, and for how long in all.
    pub throttled: Vec<Throttled>,
}

/// This server's copy of the quota table, and the meters of its traffic.
#[derive(Default)]
pub struct Quotas {
    table: RwLock<Arc<QuotaTable>>,
    meters: Mutex<HashMap<(Limit, String), Meter>>,
    throttled: Mutex<BTreeMap<(Limit, String), (u64, u64)>>,
    /// Whether any key has a priority: only then do appends and data
    /// reads queue in `fair`.
    prioritized: std::sync::atomic::AtomicBool,
    fair: Arc<Fair>,
}

impl Quotas {
    pub fn table(&self) -> Arc<QuotaTable> {
        self.table.read().clone()
    }

    pub fn version(&self) -> u64 {
        self.table.read().version
    }

    /// Installs a table read from the registry.
    pub fn set_table(&self, t: QuotaTable) {
        tracing::info!(
            version = t.version,
            quotas = t.quotas.len(),
            "installed the group's quota table"
        );
        let prioritized = t.quotas.values().any(|l| l.priority.is_some());
        self.prioritized
            .store(prioritized, std::sync::atomic::Ordering::Release);
        *self.table.write() = Arc::new(t);
    }

    /// Waits for this server's turn for an append or data read of `who`
    /// to `topic` moving `bytes`, when priorities are in force (`None`
    /// otherwise): the principal's priority if it has one, else the
    /// topic's, else 1, as the weight of its class.
    pub async fn scheduled(&self, who: &Principal, topic: &str, bytes: u64) -> Option<OwnedSlot> {
        if !self.prioritized.load(std::sync::atomic::Ordering::Acquire) || who.is_member() {
            return None;
        }
        let (class, weight) = {
            let table = self.table();
            match table
                .for_user(who, Limit::Priority)
                .or_else(|| table.for_topic(topic, Limit::Priority))
            {
                Some(a) => (a.meter, a.limit),
                None => (who.to_string(), 1),
            }
        };
        Some(self.fair.admit(&class, weight, bytes).await)
    }

    /// How long the answer to a request of `who` moving `bytes` of
    /// `topic` must wait (`kind`: produce or consume): the longest wait of
    /// the principal's quota and the topic's. Members are not metered.
    pub fn delay(&self, kind: Limit, who: &Principal, topic: &str, bytes: u64) -> Duration {
        let table = self.table();
        if table.quotas.is_empty() || who.is_member() || is_internal(who) {
            return Duration::ZERO;
        }
        let applies = [table.for_user(who, kind), table.for_topic(topic, kind)];
        let now = Instant::now();
        let mut wait = Duration::ZERO;
        let mut meters = self.meters.lock();
        for a in applies.into_iter().flatten() {
            let m = meters
                .entry((kind, a.meter.clone()))
                .or_insert_with(|| Meter::new(a.limit, now));
            let w = m.take(now, bytes, a.limit);
            if w > Duration::ZERO {
                self.count(kind, &a, w);
            }
            wait = wait.max(w);
        }
        if meters.len() > MAX_METERS {
            meters.retain(|_, m| now.saturating_duration_since(m.last()) < IDLE);
        }
        wait
    }

    fn count(&self, kind: Limit, a: &Applies, wait: Duration) {
        let mut t = self.throttled.lock();
        let e = t.entry((kind, a.key.to_string())).or_default();
        e.0 += 1;
        e.1 += wait.as_micros() as u64;
    }

    /// How long answers were held, per quota and kind.
    pub fn throttled(&self) -> Vec<Throttled> {
        self.throttled
            .lock()
            .iter()
            .map(|((kind, key), (answers, micros))| Throttled {
                kind: kind.name().into(),
                key: key.clone(),
                answers: *answers,
                micros: *micros,
            })
            .collect()
    }

    pub fn snapshot(&self) -> QuotaSnapshot {
        QuotaSnapshot {
            version: self.version(),
            throttled: self.throttled(),
        }
    }

    /// The stored-bytes quota of `topic`, if one applies.
    pub fn stored_limit(&self, topic: &str) -> Option<Applies> {
        let table = self.table();
        match table.quotas.is_empty() {
            true => None,
            false => table.for_topic(topic, Limit::Stored),
        }
    }
}

/// The server's own in-process clients (the transform host).
fn is_internal(who: &Principal) -> bool {
    who.name == crate::service::INTERNAL_SUBJECT
}
