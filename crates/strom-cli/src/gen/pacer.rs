//! Rate control for `strom gen`, as pure logic over a clock the caller
//! passes in (seconds as `f64`), so it is tested without sleeping.
//!
//! [`Pacer`] is a deadline pacer: since the last rate change at `epoch`,
//! `floor((now - epoch) * rate)` events are owed; each call to
//! [`Pacer::due`] says how many of those are not sent yet. The caller
//! wakes every millisecond or so and sends that many, so the mean rate is
//! exact whatever the sleep granularity. Falling behind (backpressure, a
//! stall) builds a debt; past `max_debt` seconds' worth it is forgiven,
//! so a recovered system sees a short burst, not minutes of catch-up.
//!
//! [`Ramp`] is the `--ramp start:end:step:every_s` schedule.

/// Highest rate accepted anywhere (events per second, all workers).
pub const MAX_RATE: f64 = 100_000_000.0;

#[derive(Debug, Clone)]
pub struct Pacer {
    rate: f64,
    epoch: f64,
    issued: u64,
    max_debt: f64,
}

impl Pacer {
    /// A pacer at `rate` events/s from `now`; at most `max_debt` seconds
    /// of events are ever owed.
    pub fn new(rate: f64, now: f64, max_debt: f64) -> Pacer {
        Pacer {
            rate: sanitize(rate),
            epoch: now,
            issued: 0,
            max_debt,
        }
    }

    /// Changes the rate from `now` on (a no-op if it is unchanged).
    pub fn set_rate(&mut self, rate: f64, now: f64) {
        let rate = sanitize(rate);
        if rate != self.rate {
            self.rate = rate;
            self.restart(now);
        }
    }

    /// Forgets what was owed: pacing starts again at `now` (after a pause).
    pub fn restart(&mut self, now: f64) {
        self.epoch = now;
        self.issued = 0;
    }

    /// Events owed at `now` and not sent yet; the caller sends some or
    /// all of them and reports that with [`Pacer::sent`].
    pub fn due(&mut self, now: f64) -> u64 {
        let elapsed = (now - self.epoch).max(0.0);
        let owed_total = (elapsed * self.rate).floor() as u64;
        let owed = owed_total.saturating_sub(self.issued);
        let cap = (self.rate * self.max_debt).ceil().max(1.0) as u64;
        if owed > cap {
            // Too far behind: forgive the excess instead of bursting.
            self.issued += owed - cap;
            return cap;
        }
        owed
    }

    /// `n` events were sent.
    pub fn sent(&mut self, n: u64) {
        self.issued += n;
    }
}

/// A rate clamped to [0, MAX_RATE]; NaN is 0.
fn sanitize(rate: f64) -> f64 {
    if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, MAX_RATE)
    }
}

/// Checks a target rate given by a user (CLI or HTTP).
pub fn check_rate(rate: f64) -> Result<f64, String> {
    if !rate.is_finite() || rate < 0.0 {
        return Err(format!(
            "rate must be a finite number of events per second >= 0, not {rate}"
        ));
    }
    if rate > MAX_RATE {
        return Err(format!("rate {rate} is above the limit of {MAX_RATE}/s"));
    }
    Ok(rate)
}

/// `--ramp start:end:step:every_s`: the target starts at `start` and moves
/// by `step` toward `end` every `every` seconds, then stays at `end`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ramp {
    pub start: f64,
    pub end: f64,
    pub step: f64,
    pub every: f64,
}

impl Ramp {
    /// The target rate `t` seconds after the start.
    pub fn at(&self, t: f64) -> f64 {
        let steps = (t.max(0.0) / self.every).floor();
        if self.end >= self.start {
            (self.start + steps * self.step).min(self.end)
        } else {
            (self.start - steps * self.step).max(self.end)
        }
    }
}

/// Parses `start:end:step:every_s`: rates >= 0, step > 0 (its direction
/// comes from start and end), every_s > 0.
pub fn parse_ramp(s: &str) -> Result<Ramp, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [start, end, step, every] = parts[..] else {
        return Err(format!("'{s}' is not start:end:step:every_s"));
    };
    let num = |t: &str, what: &str| -> Result<f64, String> {
        t.trim()
            .parse::<f64>()
            .map_err(|_| format!("{what} '{t}' in --ramp '{s}' is not a number"))
    };
    let ramp = Ramp {
        start: check_rate(num(start, "start")?)?,
        end: check_rate(num(end, "end")?)?,
        step: num(step, "step")?,
        every: num(every, "every_s")?,
    };
    if !(ramp.step.is_finite() && ramp.step > 0.0) {
        return Err(format!("--ramp '{s}': step must be > 0"));
    }
    if !(ramp.every.is_finite() && ramp.every >= 0.001) {
        return Err(format!("--ramp '{s}': every_s must be at least 0.001"));
    }
    Ok(ramp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a pacer with ticks of `tick` seconds for `secs` seconds.
    fn run(p: &mut Pacer, from: f64, secs: f64, tick: f64) -> u64 {
        let mut sent = 0;
        let mut now = from;
        while now < from + secs {
            now += tick;
            let n = p.due(now);
            p.sent(n);
            sent += n;
        }
        sent
    }

    #[test]
    fn pacer_sends_exactly_the_rate_whatever_the_tick() {
        for tick in [0.0001, 0.001, 0.0013, 0.01] {
            let mut p = Pacer::new(20_000.0, 0.0, 0.1);
            let sent = run(&mut p, 0.0, 10.0, tick);
            let want = 200_000.0;
            assert!(
                (sent as f64 - want).abs() <= 20_000.0 * tick + 1.0,
                "tick {tick}: sent {sent}, want {want}"
            );
        }
    }

    #[test]
    fn pacer_handles_fractional_rates() {
        let mut p = Pacer::new(0.5, 0.0, 10.0);
        assert_eq!(run(&mut p, 0.0, 10.0, 0.001), 5);
    }

    #[test]
    fn pacer_forgives_debt_beyond_the_cap_after_a_stall() {
        let mut p = Pacer::new(1000.0, 0.0, 0.1);
        // Nothing sent for 5 s: at most 0.1 s' worth is owed.
        assert_eq!(p.due(5.0), 100);
        p.sent(100);
        assert_eq!(p.due(5.0), 0);
        assert_eq!(p.due(5.01), 10);
    }

    #[test]
    fn pacer_rate_change_and_zero_rate() {
        let mut p = Pacer::new(1000.0, 0.0, 1.0);
        assert_eq!(run(&mut p, 0.0, 1.0, 0.001), 1000);
        p.set_rate(0.0, 1.0);
        assert_eq!(run(&mut p, 1.0, 1.0, 0.001), 0);
        p.set_rate(5000.0, 2.0);
        let sent = run(&mut p, 2.0, 1.0, 0.001);
        assert!((4990..=5010).contains(&sent), "{sent}");
        p.set_rate(f64::NAN, 3.0);
        assert_eq!(run(&mut p, 3.0, 1.0, 0.001), 0);
    }

    #[test]
    fn pacer_unsent_events_stay_due() {
        let mut p = Pacer::new(1000.0, 0.0, 1.0);
        assert_eq!(p.due(0.05), 50);
        p.sent(20);
        assert_eq!(p.due(0.05), 30);
    }

    #[test]
    fn ramp_parses_and_steps_up_to_the_end() {
        let r = parse_ramp("1000:5000:1000:2").unwrap();
        assert_eq!(r.at(0.0), 1000.0);
        assert_eq!(r.at(1.99), 1000.0);
        assert_eq!(r.at(2.0), 2000.0);
        assert_eq!(r.at(7.0), 4000.0);
        assert_eq!(r.at(100.0), 5000.0);
    }

    #[test]
    fn ramp_steps_down_when_end_is_below_start() {
        let r = parse_ramp("5000:1000:1500:1").unwrap();
        assert_eq!(r.at(0.5), 5000.0);
        assert_eq!(r.at(1.0), 3500.0);
        assert_eq!(r.at(2.0), 2000.0);
        assert_eq!(r.at(3.0), 1000.0);
        assert_eq!(r.at(30.0), 1000.0);
    }

    #[test]
    fn ramp_rejects_malformed_input() {
        for bad in [
            "",
            "1:2:3",
            "1:2:3:4:5",
            "a:2:3:4",
            "1:2:0:1",
            "1:2:-1:1",
            "1:2:1:0",
            "-1:2:1:1",
            "1:inf:1:1",
            "1:2:nan:1",
            "1:2:1:nan",
            "1:1e12:1:1",
        ] {
            assert!(parse_ramp(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn check_rate_rejects_negative_nan_and_huge() {
        assert!(check_rate(-1.0).is_err());
        assert!(check_rate(f64::NAN).is_err());
        assert!(check_rate(f64::INFINITY).is_err());
        assert!(check_rate(1e12).is_err());
        assert_eq!(check_rate(0.0), Ok(0.0));
    }
}
