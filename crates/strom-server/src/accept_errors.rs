//! Rate-limited logging of failed `accept` calls, shared by every
//! listener (native, Kafka, HTTP). Out of descriptors (EMFILE), an accept
//! loop fails many times a second; it logs the first failure, then at most
//! one line per [`AcceptErrors::EVERY`] with how many failed since.

use std::time::{Duration, Instant};

/// The accept failures of one listener.
pub struct AcceptErrors {
    listener: &'static str,
    last: Option<Instant>,
    since: u64,
}

impl AcceptErrors {
    /// The shortest time between two log lines.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// For the listener named `listener` (e.g. "native", "kafka", "http").
    pub fn new(listener: &'static str) -> Self {
        AcceptErrors {
            listener,
            last: None,
            since: 0,
        }
    }

    /// Counts one failure; logs it if the last line is old enough.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        if let Some(count) = self.count_at(Instant::now()) {
            tracing::warn!(listener = self.listener, error = %error, failures = count, every_s = Self::EVERY.as_secs(), "accept failed (repeated failures are counted, one line per interval)");
        }
    }

    /// Counts a failure at `now`: the failures to report if a line is due.
    fn count_at(&mut self, now: Instant) -> Option<u64> {
        self.since += 1;
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Self::EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_are_one_line_per_interval_with_a_count() {
        let mut a = AcceptErrors::new("test");
        let t0 = Instant::now();
        assert_eq!(a.count_at(t0), Some(1), "the first is logged");
        for i in 1..200 {
            assert_eq!(a.count_at(t0 + Duration::from_millis(i * 50)), None);
        }
        let later = t0 + AcceptErrors::EVERY + Duration::from_millis(1);
        assert_eq!(a.count_at(later), Some(200), "the next line counts them");
        assert_eq!(a.count_at(later + Duration::from_secs(1)), None);
    }
}
