//! The regulator's decision, as a pure function of the policy, one sample
//! of the group and the regulator's own state (consecutive samples over or
//! under the band, when it last acted): add a member, drain one, or hold,
//! always with the reason. No I/O here; `mod.rs` carries the decision out.

use serde_json::{json, Value};

use super::policy::Policy;

/// The group's load at one sample: totals over its active members.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    pub produce_bytes_per_s: f64,
    pub consume_bytes_per_s: f64,
    pub lag_events: f64,
    pub disk_bytes: f64,
}

impl Load {
    /// The value of the target named `name` (see `Targets::set`).
    fn get(&self, name: &str) -> f64 {
        match name {
            "produce_bytes_per_s" => self.produce_bytes_per_s,
            "consume_bytes_per_s" => self.consume_bytes_per_s,
            "lag_events" => self.lag_events,
            _ => self.disk_bytes,
        }
    }

    /// Each value divided by `n`.
    pub fn per(&self, n: u32) -> Load {
        let n = f64::from(n.max(1));
        Load {
            produce_bytes_per_s: self.produce_bytes_per_s / n,
            consume_bytes_per_s: self.consume_bytes_per_s / n,
            lag_events: self.lag_events / n,
            disk_bytes: self.disk_bytes / n,
        }
    }

    pub fn to_json(self) -> Value {
        json!({
            "produce_bytes_per_s": round(self.produce_bytes_per_s),
            "consume_bytes_per_s": round(self.consume_bytes_per_s),
            "lag_events": round(self.lag_events),
            "disk_bytes": round(self.disk_bytes),
        })
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// A member the regulator might drain.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    /// The regulator started it.
    pub started: bool,
    /// It keeps the registry (member 0 without a quorum, a quorum voter or
    /// leader): a drain would be refused.
    pub keeps_registry: bool,
    /// Partitions it holds a copy of that have fewer copies in sync than
    /// they have copies: draining it now could take an in-sync copy away.
    pub under_replicated: u32,
}

/// One sample of the group.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Seconds since the regulator started.
    pub now_s: f64,
    /// Members alive and not draining.
    pub active: u32,
    /// Members being drained.
    pub draining: u32,
    /// Members down, or that sent no snapshot.
    pub down: Vec<u32>,
    /// Some partition is moving (a rebalance or drain under way).
    pub moving: bool,
    /// Most copies any partition has or should have (its replication factor).
    pub max_copies: u32,
    /// The load; None until two samples give rates.
    pub load: Option<Load>,
    /// Members that might be drained, the preferred first.
    pub candidates: Vec<Candidate>,
}

/// What the regulator remembers between samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// Consecutive samples over the band.
    pub above: u32,
    /// Consecutive samples under the band.
    pub below: u32,
    /// When it last added or drained a member (`now_s`).
    pub last_action_s: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Hold,
    Add,
    Drain(u32),
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Hold => "hold",
            Action::Add => "add",
            Action::Drain(_) => "drain",
        }
    }
}

/// Where the load stands against the band around the targets.
#[derive(Clone, Debug, PartialEq)]
enum Pressure {
    /// Over target × (1 + h): the metrics that are.
    Up(Vec<&'static str>),
    /// Every metric under target × (1 − h), and one member fewer would
    /// still keep each under target × (1 + h).
    Down,
    Within,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub action: Action,
    pub reason: String,
    /// The load per active member, when known.
    pub per_member: Option<Load>,
}

/// Decides, and updates `state` (the counters, and the time of the last
/// action when the decision acts).
pub fn decide(p: &Policy, o: &Observed, state: &mut State) -> Decision {
    let per_member = o.load.map(|l| l.per(o.active));
    let pressure = match o.load {
        Some(l) if o.active > 0 => pressure(p, &l, o.active),
        _ => Pressure::Within,
    };
    match pressure {
        Pressure::Up(_) => (state.above, state.below) = (state.above + 1, 0),
        Pressure::Down => (state.above, state.below) = (0, state.below + 1),
        Pressure::Within => (state.above, state.below) = (0, 0),
    }
    let (action, reason) = choose(p, o, state, &pressure);
    if action != Action::Hold {
        state.last_action_s = Some(o.now_s);
        state.above = 0;
        state.below = 0;
    }
    Decision {
        action,
        reason,
        per_member,
    }
}

fn pressure(p: &Policy, total: &Load, active: u32) -> Pressure {
    let h = p.hysteresis;
    let now = total.per(active);
    let targets = p.targets.set();
    let over: Vec<&'static str> = targets
        .iter()
        .filter(|(n, t)| now.get(n) > t * (1.0 + h))
        .map(|(n, _)| *n)
        .collect();
    if !over.is_empty() {
        return Pressure::Up(over);
    }
    let under = targets.iter().all(|(n, t)| now.get(n) < t * (1.0 - h));
    // One member fewer must not put the rest over the band at once.
    let after = total.per(active.saturating_sub(1));
    let fits = targets.iter().all(|(n, t)| after.get(n) <= t * (1.0 + h));
    if under && fits && active > 1 {
        Pressure::Down
    } else {
        Pressure::Within
    }
}

fn choose(p: &Policy, o: &Observed, s: &State, pressure: &Pressure) -> (Action, String) {
    let hold = |r: String| (Action::Hold, r);
    if o.load.is_none() {
        return hold("no rates yet: the first sample".into());
    }
    if !o.down.is_empty() {
        return hold(format!(
            "members {:?} are down or sent no snapshot: the group is not changed while it is degraded",
            o.down
        ));
    }
    if o.draining > 0 || o.moving {
        return hold(format!(
            "moves under way ({} members draining, partitions moving: {})",
            o.draining, o.moving
        ));
    }
    if let Some(last) = s.last_action_s {
        let left = p.cooldown.as_secs_f64() - (o.now_s - last);
        if left > 0.0 {
            return hold(format!("cooling down: {left:.1} s left"));
        }
    }
    if o.active < p.min_members {
        return (
            Action::Add,
            format!("{} members, below the minimum {}", o.active, p.min_members),
        );
    }
    if o.active > p.max_members {
        let why = format!("{} members, above the maximum {}", o.active, p.max_members);
        return drain(p, o, why);
    }
    match pressure {
        Pressure::Up(over) if s.above >= p.up_samples => {
            if o.active >= p.max_members {
                return hold(format!(
                    "{} over target, but at the maximum of {} members",
                    over.join(", "),
                    p.max_members
                ));
            }
            let why = format!(
                "{} over target × {:.2} for {} samples",
                over.join(", "),
                1.0 + p.hysteresis,
                s.above
            );
            (Action::Add, why)
        }
        Pressure::Up(over) => hold(format!(
            "{} over target for {} of {} samples",
            over.join(", "),
            s.above,
            p.up_samples
        )),
        Pressure::Down if s.below >= p.down_samples => {
            if o.active <= p.min_members {
                return hold(format!(
                    "under target, but at the minimum of {} members",
                    p.min_members
                ));
            }
            let why = format!(
                "every target under target × {:.2} for {} samples",
                1.0 - p.hysteresis,
                s.below
            );
            drain(p, o, why)
        }
        Pressure::Down => hold(format!(
            "under target for {} of {} samples",
            s.below, p.down_samples
        )),
        Pressure::Within => hold("within the band".into()),
    }
}

/// Drains the first candidate that may go, or holds saying why none may.
fn drain(p: &Policy, o: &Observed, why: String) -> (Action, String) {
    if o.active.saturating_sub(1) < o.max_copies.max(1) {
        return (
            Action::Hold,
            format!(
                "{why}; but a partition has {} copies and only {} members would remain",
                o.max_copies,
                o.active.saturating_sub(1)
            ),
        );
    }
    let mut refused = Vec::new();
    for c in &o.candidates {
        let not = if c.keeps_registry {
            "keeps the registry"
        } else if !c.started && !p.may_drain_any {
            "was not started by the regulator (--may-drain-any)"
        } else if c.under_replicated > 0 {
            "holds under-replicated partitions"
        } else {
            return (
                Action::Drain(c.id),
                format!("{why}; member {} drains", c.id),
            );
        };
        refused.push(format!("{}: {not}", c.id));
    }
    (
        Action::Hold,
        format!(
            "{why}; but no member may be drained ({})",
            refused.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::policy::Targets;
    use super::*;

    fn policy() -> Policy {
        Policy {
            min_members: 1,
            max_members: 3,
            targets: Targets {
                produce_bytes_per_s: Some(1000.0),
                ..Targets::default()
            },
            hysteresis: 0.25,
            up_samples: 2,
            down_samples: 3,
            cooldown: Duration::from_secs(10),
            interval: Duration::from_secs(1),
            may_drain_any: false,
        }
    }

    fn cand(id: u32, started: bool) -> Candidate {
        Candidate {
            id,
            started,
            keeps_registry: id == 0,
            under_replicated: 0,
        }
    }

    /// A group of `active` members producing `rate` bytes/s in all.
    fn obs(now_s: f64, active: u32, rate: f64) -> Observed {
        Observed {
            now_s,
            active,
            max_copies: 1,
            load: Some(Load {
                produce_bytes_per_s: rate,
                ..Load::default()
            }),
            candidates: (0..active).rev().map(|id| cand(id, id > 0)).collect(),
            ..Observed::default()
        }
    }

    fn run(p: &Policy, s: &mut State, samples: &[Observed]) -> Vec<Action> {
        samples.iter().map(|o| decide(p, o, s).action).collect()
    }

    #[test]
    fn a_member_is_added_only_after_enough_samples_over_the_band() {
        let p = policy();
        let mut s = State::default();
        // 1 member at 1200 B/s: over target (1000) but inside the band (1250).
        let a = run(&p, &mut s, &[obs(0.0, 1, 1200.0), obs(1.0, 1, 1200.0)]);
        assert_eq!(a, [Action::Hold, Action::Hold]);
        // Over the band once, back inside, then over twice: the second adds.
        let a = run(
            &p,
            &mut s,
            &[
                obs(2.0, 1, 2000.0),
                obs(3.0, 1, 1100.0),
                obs(4.0, 1, 2000.0),
                obs(5.0, 1, 2000.0),
            ],
        );
        assert_eq!(a, [Action::Hold, Action::Hold, Action::Hold, Action::Add]);
        assert_eq!(s.last_action_s, Some(5.0));
    }

    #[test]
    fn the_cool_down_holds_every_action_after_one() {
        let p = policy();
        let mut s = State {
            last_action_s: Some(0.0),
            ..State::default()
        };
        let busy: Vec<Observed> = (1..10).map(|t| obs(f64::from(t), 2, 5000.0)).collect();
        assert!(run(&p, &mut s, &busy).iter().all(|a| *a == Action::Hold));
        // The samples counted meanwhile: the first one after it acts.
        let d = decide(&p, &obs(10.0, 2, 5000.0), &mut s);
        assert_eq!(d.action, Action::Add, "{}", d.reason);
        let d = decide(&p, &obs(11.0, 3, 5000.0), &mut s);
        assert!(d.reason.contains("cooling down"), "{}", d.reason);
    }

    #[test]
    fn a_member_is_drained_after_enough_samples_under_the_band() {
        let p = policy();
        let mut s = State::default();
        // 3 members, 600 B/s: 200 each, under 750; 300 each with 2 left.
        let a = run(
            &p,
            &mut s,
            &[obs(0.0, 3, 600.0), obs(1.0, 3, 600.0), obs(2.0, 3, 600.0)],
        );
        assert_eq!(a, [Action::Hold, Action::Hold, Action::Drain(2)]);
    }

    #[test]
    fn no_drain_that_would_push_the_rest_over_the_band() {
        let p = policy();
        let mut s = State::default();
        // 2 members at 1400 B/s: 700 each (under 750), but 1400 on one > 1250.
        let samples: Vec<Observed> = (0..6).map(|t| obs(f64::from(t), 2, 1400.0)).collect();
        assert!(run(&p, &mut s, &samples).iter().all(|a| *a == Action::Hold));
        assert_eq!(s.below, 0);
    }

    #[test]
    fn min_and_max_bound_the_group() {
        let p = policy();
        let mut s = State::default();
        // At the maximum, over target: hold, and say so.
        for t in 0..3 {
            let d = decide(&p, &obs(f64::from(t), 3, 1e6), &mut s);
            assert_eq!(d.action, Action::Hold);
        }
        let d = decide(&p, &obs(3.0, 3, 1e6), &mut s);
        assert!(d.reason.contains("maximum"), "{}", d.reason);
        // At the minimum with no load: hold.
        let mut s = State::default();
        for t in 0..5 {
            let d = decide(&p, &obs(f64::from(t), 1, 0.0), &mut s);
            assert_eq!(d.action, Action::Hold, "{}", d.reason);
        }
        // Below the minimum: add at once; above the maximum: drain at once.
        let p2 = Policy {
            min_members: 2,
            ..policy()
        };
        let d = decide(&p2, &obs(0.0, 1, 1000.0), &mut State::default());
        assert_eq!(d.action, Action::Add, "{}", d.reason);
        let d = decide(&p, &obs(0.0, 4, 4000.0), &mut State::default());
        assert_eq!(d.action, Action::Drain(3), "{}", d.reason);
    }

    #[test]
    fn the_replication_factor_guard_refuses_a_drain_that_leaves_too_few_members() {
        let p = policy();
        let mut s = State::default();
        let mut o = obs(0.0, 3, 0.0);
        o.max_copies = 3;
        for t in 0..5 {
            o.now_s = f64::from(t);
            let d = decide(&p, &o, &mut s);
            assert_eq!(d.action, Action::Hold, "{}", d.reason);
        }
        let d = decide(&p, &o, &mut s);
        assert!(d.reason.contains("has 3 copies"), "{}", d.reason);
        // With 2 copies, 2 members may remain.
        o.max_copies = 2;
        let d = decide(&p, &o, &mut s);
        assert_eq!(d.action, Action::Drain(2), "{}", d.reason);
    }

    #[test]
    fn only_members_that_may_go_are_drained() {
        let p = policy();
        let mut o = obs(0.0, 3, 0.0);
        // Member 2 holds an under-replicated partition; 1 was not started
        // by the regulator; 0 keeps the registry.
        o.candidates = vec![
            Candidate {
                under_replicated: 1,
                ..cand(2, true)
            },
            cand(1, false),
            cand(0, false),
        ];
        let mut s = State {
            below: 10,
            ..State::default()
        };
        let d = decide(&p, &o, &mut s);
        assert_eq!(d.action, Action::Hold);
        assert!(d.reason.contains("under-replicated"), "{}", d.reason);
        assert!(d.reason.contains("--may-drain-any"), "{}", d.reason);
        assert!(d.reason.contains("keeps the registry"), "{}", d.reason);
        let any = Policy {
            may_drain_any: true,
            ..policy()
        };
        let mut s = State {
            below: 10,
            ..State::default()
        };
        assert_eq!(decide(&any, &o, &mut s).action, Action::Drain(1));
    }

    #[test]
    fn nothing_changes_while_moves_run_or_a_member_is_down() {
        let p = policy();
        let mut s = State {
            above: 10,
            ..State::default()
        };
        let mut o = obs(0.0, 2, 1e6);
        o.moving = true;
        assert_eq!(decide(&p, &o, &mut s).action, Action::Hold);
        o.moving = false;
        o.draining = 1;
        assert_eq!(decide(&p, &o, &mut s).action, Action::Hold);
        o.draining = 0;
        o.down = vec![1];
        assert_eq!(decide(&p, &o, &mut s).action, Action::Hold);
        o.down.clear();
        o.load = None;
        assert_eq!(decide(&p, &o, &mut s).action, Action::Hold);
    }

    #[test]
    fn any_target_over_scales_up_but_all_must_be_under_to_scale_down() {
        let p = Policy {
            targets: Targets {
                produce_bytes_per_s: Some(1000.0),
                lag_events: Some(100.0),
                ..Targets::default()
            },
            up_samples: 1,
            down_samples: 1,
            ..policy()
        };
        let mut o = obs(0.0, 2, 0.0);
        o.load = Some(Load {
            lag_events: 1000.0,
            ..Load::default()
        });
        let d = decide(&p, &o, &mut State::default());
        assert_eq!(d.action, Action::Add);
        assert!(d.reason.contains("lag_events"), "{}", d.reason);
        // Produce idle, lag at target: no drain.
        o.load = Some(Load {
            lag_events: 200.0,
            ..Load::default()
        });
        assert_eq!(decide(&p, &o, &mut State::default()).action, Action::Hold);
        o.load = Some(Load::default());
        assert_eq!(
            decide(&p, &o, &mut State::default()).action,
            Action::Drain(1)
        );
    }
}
