//! The regulator's policy: bounds on the group's size, the load each member
//! should carry, hysteresis, cool-down and sampling interval. Read from an
//! optional TOML file (unknown keys refused by name), overridden by flags,
//! and validated before the regulator touches the group.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

/// Largest group the regulator will grow to.
pub const MAX_MEMBERS: u32 = 4096;
/// Most consecutive samples a decision may wait for.
pub const MAX_SAMPLES: u32 = 10_000;

/// Load each member should carry (the group's total over its active
/// members). A target left out is not regulated on.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    /// Bytes appended by producers per second, per member.
    pub produce_bytes_per_s: Option<f64>,
    /// Bytes delivered to consumers per second, per member.
    pub consume_bytes_per_s: Option<f64>,
    /// Events consumer names are behind (all names, all partitions), per member.
    pub lag_events: Option<f64>,
    /// Bytes stored (every copy), per member.
    pub disk_bytes: Option<f64>,
}

impl Targets {
    /// `(name, target)` of every target set, in a fixed order.
    pub fn set(&self) -> Vec<(&'static str, f64)> {
        [
            ("produce_bytes_per_s", self.produce_bytes_per_s),
            ("consume_bytes_per_s", self.consume_bytes_per_s),
            ("lag_events", self.lag_events),
            ("disk_bytes", self.disk_bytes),
        ]
        .into_iter()
        .filter_map(|(n, t)| t.map(|t| (n, t)))
        .collect()
    }
}

/// The policy as the decision function uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub min_members: u32,
    pub max_members: u32,
    pub targets: Targets,
    /// Scale up above target × (1 + h), down below target × (1 − h).
    pub hysteresis: f64,
    /// Consecutive samples over the band before a member is added.
    pub up_samples: u32,
    /// Consecutive samples under the band before a member is drained.
    pub down_samples: u32,
    /// No action for this long after one.
    pub cooldown: Duration,
    /// Time between two samples.
    pub interval: Duration,
    /// Members the regulator did not start may be drained too.
    pub may_drain_any: bool,
}

/// The policy file: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub min_members: Option<u32>,
    pub max_members: Option<u32>,
    pub hysteresis: Option<f64>,
    pub up_samples: Option<u32>,
    pub down_samples: Option<u32>,
    pub cooldown_s: Option<f64>,
    pub interval_s: Option<f64>,
    pub may_drain_any: Option<bool>,
    #[serde(default)]
    pub targets: Targets,
}

impl PolicyFile {
    /// Reads and parses `path` (TOML).
    pub fn read(path: &Path) -> anyhow::Result<PolicyFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the policy file {}", path.display()))?;
        toml::from_str(&text)
            .with_context(|| format!("the policy file {} is not valid", path.display()))
    }

    /// `over`'s values where it has them, this file's otherwise.
    pub fn merge(self, over: PolicyFile) -> PolicyFile {
        let t = |a: Option<f64>, b: Option<f64>| b.or(a);
        PolicyFile {
            min_members: over.min_members.or(self.min_members),
            max_members: over.max_members.or(self.max_members),
            hysteresis: over.hysteresis.or(self.hysteresis),
            up_samples: over.up_samples.or(self.up_samples),
            down_samples: over.down_samples.or(self.down_samples),
            cooldown_s: over.cooldown_s.or(self.cooldown_s),
            interval_s: over.interval_s.or(self.interval_s),
            may_drain_any: over.may_drain_any.or(self.may_drain_any),
            targets: Targets {
                produce_bytes_per_s: t(
                    self.targets.produce_bytes_per_s,
                    over.targets.produce_bytes_per_s,
                ),
                consume_bytes_per_s: t(
                    self.targets.consume_bytes_per_s,
                    over.targets.consume_bytes_per_s,
                ),
                lag_events: t(self.targets.lag_events, over.targets.lag_events),
                disk_bytes: t(self.targets.disk_bytes, over.targets.disk_bytes),
            },
        }
    }

    /// The policy, with defaults for what is not given; refused with a
    /// reason if it makes no sense.
    pub fn validate(self) -> anyhow::Result<Policy> {
        let p = Policy {
            min_members: self.min_members.unwrap_or(1),
            max_members: self.max_members.unwrap_or(8),
            targets: self.targets,
            hysteresis: self.hysteresis.unwrap_or(0.2),
            up_samples: self.up_samples.unwrap_or(3),
            down_samples: self.down_samples.unwrap_or(5),
            cooldown: seconds("cooldown", self.cooldown_s.unwrap_or(30.0), 0.0)?,
            interval: seconds("interval", self.interval_s.unwrap_or(5.0), 0.1)?,
            may_drain_any: self.may_drain_any.unwrap_or(false),
        };
        check(&p)?;
        Ok(p)
    }
}

/// `s` seconds, at least `min`, at most a day.
fn seconds(what: &str, s: f64, min: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && (min..=86_400.0).contains(&s)) {
        bail!("{what} must be {min} to 86400 seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

fn check(p: &Policy) -> anyhow::Result<()> {
    if p.min_members < 1 {
        bail!("min_members must be at least 1");
    }
    if p.max_members < p.min_members || p.max_members > MAX_MEMBERS {
        bail!(
            "max_members must be from min_members ({}) to {MAX_MEMBERS}, not {}",
            p.min_members,
            p.max_members
        );
    }
    if !(p.hysteresis.is_finite() && (0.0..1.0).contains(&p.hysteresis)) {
        bail!(
            "hysteresis must be at least 0 and below 1, not {}",
            p.hysteresis
        );
    }
    for (what, n) in [
        ("up_samples", p.up_samples),
        ("down_samples", p.down_samples),
    ] {
        if !(1..=MAX_SAMPLES).contains(&n) {
            bail!("{what} must be 1 to {MAX_SAMPLES}, not {n}");
        }
    }
    let set = p.targets.set();
    if set.is_empty() {
        bail!(
            "no target: give at least one of --target-produce, --target-consume, \
             --target-lag, --target-disk (or [targets] in the policy file)"
        );
    }
    for (name, t) in set {
        if !(t.is_finite() && t > 0.0) {
            bail!("target {name} must be a positive number, not {t}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> anyhow::Result<PolicyFile> {
        Ok(toml::from_str(text)?)
    }

    #[test]
    fn a_policy_file_is_read_and_flags_win_over_it() {
        let f = file(
            "min_members = 2\nmax_members = 5\ncooldown_s = 3\n\
             [targets]\nproduce_bytes_per_s = 1e6\nlag_events = 100\n",
        )
        .unwrap();
        let flags = PolicyFile {
            max_members: Some(4),
            targets: Targets {
                lag_events: Some(50.0),
                ..Targets::default()
            },
            ..PolicyFile::default()
        };
        let p = f.merge(flags).validate().unwrap();
        assert_eq!((p.min_members, p.max_members), (2, 4));
        assert_eq!(p.cooldown, Duration::from_secs(3));
        assert_eq!(p.targets.produce_bytes_per_s, Some(1e6));
        assert_eq!(p.targets.lag_events, Some(50.0));
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let e = file("min_members = 1\nmax_memebrs = 3\n").unwrap_err();
        assert!(e.to_string().contains("max_memebrs"), "{e}");
        let e = file("[targets]\nproduce = 1\n").unwrap_err();
        assert!(e.to_string().contains("produce"), "{e}");
    }

    #[test]
    fn nonsense_is_refused() {
        let base = || PolicyFile {
            targets: Targets {
                produce_bytes_per_s: Some(1.0),
                ..Targets::default()
            },
            ..PolicyFile::default()
        };
        assert!(base().validate().is_ok());
        let bad = [
            PolicyFile {
                min_members: Some(0),
                ..base()
            },
            PolicyFile {
                min_members: Some(3),
                max_members: Some(2),
                ..base()
            },
            PolicyFile {
                max_members: Some(MAX_MEMBERS + 1),
                ..base()
            },
            PolicyFile {
                hysteresis: Some(1.0),
                ..base()
            },
            PolicyFile {
                hysteresis: Some(f64::NAN),
                ..base()
            },
            PolicyFile {
                up_samples: Some(0),
                ..base()
            },
            PolicyFile {
                interval_s: Some(0.0),
                ..base()
            },
            PolicyFile {
                cooldown_s: Some(-1.0),
                ..base()
            },
            PolicyFile {
                cooldown_s: Some(f64::INFINITY),
                ..base()
            },
            PolicyFile {
                targets: Targets::default(),
                ..base()
            },
            PolicyFile {
                targets: Targets {
                    disk_bytes: Some(-5.0),
                    ..Targets::default()
                },
                ..base()
            },
        ];
        for (i, f) in bad.into_iter().enumerate() {
            assert!(f.validate().is_err(), "case {i} was accepted");
        }
    }
}
