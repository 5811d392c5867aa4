//! The rate meter of one quota: a token bucket that says how long an
//! answer must wait so that the bytes it carries keep the metered traffic
//! at its rate. Pure arithmetic over instants the caller passes.
//!
//! The bucket holds at most `BURST` seconds of the rate, and may go into
//! debt: the bytes of an answer are taken at once, and the answer waits
//! until the debt would be paid back. Answers that follow each other wait
//! in turn, so a client whose next request waits for the previous answer
//! (every Strom and Kafka client, past its in-flight window) is held at
//! the rate, measured over any window much longer than `BURST`.

use std::time::{Duration, Instant};

/// How much traffic an idle meter lets through at once, in seconds of
/// its rate.
pub const BURST: f64 = 0.1;

/// The longest one answer is held, whatever the debt; the debt stays, so
/// the next answers wait too.
pub const MAX_DELAY: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct Meter {
    /// Bytes that may pass now; negative: owed.
    tokens: f64,
    last: Instant,
}

impl Meter {
    /// A full meter.
    pub fn new(rate: u64, now: Instant) -> Self {
        Meter {
            tokens: rate as f64 * BURST,
            last: now,
        }
    }

    /// Takes `bytes` at `now` at `rate` bytes per second; how long their
    /// answer must wait.
    pub fn take(&mut self, now: Instant, bytes: u64, rate: u64) -> Duration {
        let rate = rate.max(1) as f64;
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * rate).min(rate * BURST);
        self.tokens -= bytes as f64;
        match self.tokens < 0.0 {
            true => Duration::from_secs_f64(-self.tokens / rate).min(MAX_DELAY),
            false => Duration::ZERO,
        }
    }

    /// When the meter last took bytes.
    pub fn last(&self) -> Instant {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_stream_is_held_at_the_rate() {
        let t0 = Instant::now();
        let mut m = Meter::new(1000, t0);
        // A client that sends 500 bytes whenever its last answer came.
        let mut now = t0;
        let mut sent = 0u64;
        while now < t0 + Duration::from_secs(10) {
            let wait = m.take(now, 500, 1000);
            sent += 500;
            now += wait.max(Duration::from_millis(1));
        }
        let rate = sent as f64 / (now - t0).as_secs_f64();
        assert!((rate - 1000.0).abs() < 1000.0 * 0.05, "rate {rate}");
    }

    #[test]
    fn an_idle_meter_lets_a_burst_through_then_makes_it_wait() {
        let t0 = Instant::now();
        let mut m = Meter::new(1000, t0);
        assert_eq!(m.take(t0, 100, 1000), Duration::ZERO);
        let wait = m.take(t0, 1000, 1000);
        assert_eq!(wait, Duration::from_secs(1));
        // Idle for long: the debt is paid and at most BURST is saved.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(m.take(later, 100, 1000), Duration::ZERO);
        assert!(m.take(later, 1, 1000) > Duration::ZERO);
    }

    #[test]
    fn one_wait_is_bounded_but_the_debt_stays() {
        let t0 = Instant::now();
        let mut m = Meter::new(1, t0);
        assert_eq!(m.take(t0, 1_000_000, 1), MAX_DELAY);
        assert_eq!(m.take(t0 + MAX_DELAY, 0, 1), MAX_DELAY);
    }
}
