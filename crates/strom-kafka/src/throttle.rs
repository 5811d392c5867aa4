//! Quotas on the Kafka port (docs/quotas.md): a produce or fetch whose
//! bytes put its principal or topic over a rate quota is throttled, as a
//! Kafka broker does. The answer carries `throttle_time_ms`, and:
//!
//! - the connection is muted for that long: its next request waits (a
//!   produce's from the moment it arrives, so requests pipelined behind
//!   it wait too), so a client that ignores the field gains nothing;
//! - to a client that throttles itself (KIP-219: Produce v6+, Fetch v8+)
//!   the answer goes at once; to an older client it is held that long.

use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use parking_lot::Mutex;
use strom_auth::Principal;
use strom_server::quota::{Limit, Quotas};
use tokio::time::Instant;

/// Until when a connection's next request waits.
#[derive(Default)]
pub struct Mute(Mutex<Option<Instant>>);

impl Mute {
    fn extend(&self, until: Instant) {
        let mut m = self.0.lock();
        *m = Some(m.map_or(until, |t| t.max(until)));
    }

    /// Mutes the connection for `wait` from now: its next request waits
    /// that long (a produce's at once, as the request arrives, so that
    /// requests a client pipelines behind it wait too).
    pub fn hold(&self, wait: Duration) {
        if !wait.is_zero() {
            self.extend(Instant::now() + wait);
        }
    }

    /// Waits out the mute, if any.
    pub async fn wait(&self) {
        let until = self.0.lock().take();
        if let Some(t) = until {
            tokio::time::sleep_until(t).await;
        }
    }
}

/// Whether a client of this API version backs off by itself when told
/// (KIP-219).
fn client_throttles(api: ApiKey, v: i16) -> bool {
    match api {
        ApiKey::Produce => v >= 6,
        ApiKey::Fetch => v >= 8,
        _ => false,
    }
}

/// How long `kind`'s quotas hold a request of principal `who` moving
/// `bytes` of each topic: the longest wait of them.
pub fn delay(quotas: &Quotas, who: &Principal, kind: Limit, bytes: &[(String, u64)]) -> Duration {
    bytes
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(topic, n)| quotas.delay(kind, who, topic, *n))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// The `throttle_time_ms` of an answer of `api` at version `v` that a
/// quota throttles by `wait` (the caller muted the connection): an older
/// client, which does not back off by itself, gets the answer that much
/// later.
pub async fn answer(api: ApiKey, v: i16, wait: Duration) -> i32 {
    if wait.is_zero() {
        return 0;
    }
    if !client_throttles(api, v) {
        tokio::time::sleep(wait).await;
    }
    // Rounded up: a wait of a fraction of a millisecond is still one.
    i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}
