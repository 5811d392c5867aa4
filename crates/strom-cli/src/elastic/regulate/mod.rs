//! `strom regulate`: runs beside a group and grows and shrinks it from its
//! load (docs/elasticity.md, "Regulator"). Each interval it samples the
//! group (`sample`), decides (`decide`, pure, against the `policy`), prints
//! the decision as one JSON line on stdout, logs it, exports it as metrics
//! (`metrics`), and carries it out: a new member through the launcher
//! (`launch`) followed by a rebalance, or a drain of a member it started.
//! It stops on SIGINT or SIGTERM (or `--duration`); the members it started
//! keep running unless `--stop-started`.

mod decide;
mod launch;
mod metrics;
mod policy;
mod sample;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use strom_client::Driver;

use crate::interrupt;
use decide::{decide, Action, Decision, Observed, State};
use launch::{Launcher, Template, DEFAULT_TEMPLATE};
use policy::{Policy, PolicyFile, Targets};

/// How often waits look at signals.
const POLL: Duration = Duration::from_millis(100);

#[derive(Args)]
pub struct RegulateArgs {
    /// Policy file (TOML: min_members, max_members, hysteresis,
    /// up_samples, down_samples, cooldown_s, interval_s, may_drain_any and
    /// a [targets] table); the flags below override its keys.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Fewest members (default 1).
    #[arg(long)]
    min_members: Option<u32>,
    /// Most members (default 8).
    #[arg(long)]
    max_members: Option<u32>,
    /// Target bytes produced per second per member.
    #[arg(long, value_name = "BYTES_PER_S")]
    target_produce: Option<f64>,
    /// Target bytes consumed per second per member.
    #[arg(long, value_name = "BYTES_PER_S")]
    target_consume: Option<f64>,
    /// Target consumer lag (events, all consumer names) per member.
    #[arg(long, value_name = "EVENTS")]
    target_lag: Option<f64>,
    /// Target bytes stored (every copy) per member.
    #[arg(long, value_name = "BYTES")]
    target_disk: Option<f64>,
    /// Hysteresis h: add above target × (1+h), drain below target × (1−h)
    /// (default 0.2).
    #[arg(long)]
    hysteresis: Option<f64>,
    /// Consecutive samples over the band before adding (default 3).
    #[arg(long)]
    up_samples: Option<u32>,
    /// Consecutive samples under the band before draining (default 5).
    #[arg(long)]
    down_samples: Option<u32>,
    /// Seconds without any action after one (default 30).
    #[arg(long, value_name = "S")]
    cooldown: Option<f64>,
    /// Seconds between samples (default 5).
    #[arg(long, value_name = "S")]
    interval: Option<f64>,
    /// Members the regulator did not start may be drained too.
    #[arg(long)]
    may_drain_any: bool,
    /// The command that starts a member, split into words as a shell does
    /// (no expansion, no shell: use `sh -c '...'` for one), with
    /// {group_file}, {dir} (--dir), {data_dir} (a fresh {dir}/m{n}), {n}
    /// and {strom} (this binary) filled in.
    #[arg(long, value_name = "CMD", default_value = DEFAULT_TEMPLATE)]
    launch: String,
    /// Directory for the members it starts: their data directories
    /// (m1, m2, ...) and their output (m1.log, ...).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Seconds a launched member has to join the group.
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    join_timeout: f64,
    /// Decide, print and log; start and drain nothing.
    #[arg(long)]
    dry_run: bool,
    /// On SIGINT/SIGTERM (or --duration), drain the members it started
    /// (as far as the partitions' copies allow) and wait until they left;
    /// without it they keep running.
    #[arg(long)]
    stop_started: bool,
    /// Seconds --stop-started waits for each drain.
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    stop_timeout: f64,
    /// Serve the regulator's Prometheus metrics at http://ADDR/metrics
    /// (port 0 picks one; the address is printed on stderr).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<String>,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
}

/// The policy from the file and the flags.
fn load_policy(a: &RegulateArgs) -> anyhow::Result<Policy> {
    let file = match &a.policy {
        Some(p) => PolicyFile::read(p)?,
        None => PolicyFile::default(),
    };
    let flags = PolicyFile {
        min_members: a.min_members,
        max_members: a.max_members,
        hysteresis: a.hysteresis,
        up_samples: a.up_samples,
        down_samples: a.down_samples,
        cooldown_s: a.cooldown,
        interval_s: a.interval,
        may_drain_any: a.may_drain_any.then_some(true),
        targets: Targets {
            produce_bytes_per_s: a.target_produce,
            consume_bytes_per_s: a.target_consume,
            lag_events: a.target_lag,
            disk_bytes: a.target_disk,
        },
    };
    file.merge(flags).validate()
}

/// `s` seconds, positive and at most a year.
fn secs(what: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s > 0.0 && s <= 3.2e7) {
        bail!("{what} takes a positive number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// The running regulator.
struct Regulator {
    d: Driver,
    policy: Policy,
    launcher: Option<Launcher>,
    metrics: metrics::Shared,
    join_timeout: Duration,
    start: Instant,
}

pub fn run(a: RegulateArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let policy = load_policy(&a)?;
    let template = Template::parse(&a.launch)?;
    let join_timeout = secs("--join-timeout", a.join_timeout)?;
    let stop_timeout = secs("--stop-timeout", a.stop_timeout)?;
    let duration = a.duration.map(|s| secs("--duration", s)).transpose()?;
    let launcher = match (&a.dir, a.dry_run) {
        (_, true) => None,
        (Some(dir), false) => Some(Launcher::new(template, dir.clone(), group_file.as_deref())?),
        (None, false) => bail!("give --dir DIR for the members it starts (or --dry-run)"),
    };
    let d = crate::connect(group_file)?;
    let metrics = Arc::new(Mutex::new(metrics::Metrics::new(&policy)));
    if let Some(addr) = &a.metrics_listen {
        metrics::spawn(addr, metrics.clone())?;
    }
    interrupt::install()?;
    tracing::info!(policy = ?policy, dry_run = a.dry_run, "regulator started");
    let mut r = Regulator {
        d,
        policy,
        launcher,
        metrics,
        join_timeout,
        start: Instant::now(),
    };
    let stopped_by = r.main_loop(duration)?;
    tracing::info!(stopped_by, "regulator stopping");
    if a.stop_started {
        r.stop_started(stop_timeout)?;
    }
    Ok(())
}

impl Regulator {
    fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn started(&self) -> Vec<u32> {
        self.launcher
            .as_ref()
            .map(Launcher::members)
            .unwrap_or_default()
    }

    /// Samples, decides and acts once per interval until a signal or the
    /// duration; returns what stopped it.
    fn main_loop(&mut self, duration: Option<Duration>) -> anyhow::Result<&'static str> {
        let mut state = State::default();
        let mut prev = BTreeMap::new();
        loop {
            let tick = Instant::now();
            if let Some(l) = self.launcher.as_mut() {
                l.reap();
            }
            match sample::take(&self.d, self.now_s(), &self.started(), &prev) {
                Ok(s) => {
                    prev = s.counters;
                    let decision = decide(&self.policy, &s.observed, &mut state);
                    self.report(&s.observed, &s.members, &decision)?;
                    self.act(decision.action, &s.members)?;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "sampling the group failed; holding");
                    emit(&json!({
                        "type": "decision", "t": round3(self.now_s()), "action": "hold",
                        "reason": format!("no sample: {e:#}"),
                    }))?;
                }
            }
            let until = tick + self.policy.interval;
            loop {
                if let Some(sig) = interrupt::received() {
                    return Ok(interrupt::name(sig));
                }
                if duration.is_some_and(|d| self.start.elapsed() >= d) {
                    return Ok("duration");
                }
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::sleep(POLL.min(until - now));
            }
        }
    }

    /// The decision on stdout (one JSON line), in the log and the metrics.
    fn report(&self, o: &Observed, group: &BTreeSet<u32>, dec: &Decision) -> anyhow::Result<()> {
        let member = match dec.action {
            Action::Drain(m) => Some(m),
            _ => None,
        };
        let per = dec.per_member.map(|l| l.to_json());
        let started = self
            .launcher
            .as_ref()
            .map_or(0, |l| l.in_group(group).len());
        let targets: serde_json::Map<String, Value> = self
            .policy
            .targets
            .set()
            .into_iter()
            .map(|(n, t)| (n.to_string(), json!(t)))
            .collect();
        tracing::info!(
            action = dec.action.name(),
            member,
            reason = %dec.reason,
            members = o.active,
            draining = o.draining,
            per_member = ?dec.per_member,
            targets = ?self.policy.targets,
            "regulator decision"
        );
        emit(&json!({
            "type": "decision",
            "t": round3(o.now_s),
            "action": dec.action.name(),
            "member": member,
            "reason": dec.reason,
            "dry_run": self.launcher.is_none(),
            "members": o.active,
            "draining": o.draining,
            "down": o.down,
            "moving": o.moving,
            "started": started,
            "group": o.load.map(|l| l.to_json()),
            "per_member": per,
            "targets": targets,
        }))?;
        let mut m = lock(&self.metrics);
        m.members = o.active;
        m.draining = o.draining;
        m.started = started as u32;
        m.load = o.load;
        m.decisions[match dec.action {
            Action::Hold => 0,
            Action::Add => 1,
            Action::Drain(_) => 2,
        }] += 1;
        Ok(())
    }

    /// Carries `action` out (nothing in a dry run); prints its outcome.
    fn act(&mut self, action: Action, group: &BTreeSet<u32>) -> anyhow::Result<()> {
        if self.launcher.is_none() || action == Action::Hold {
            return Ok(());
        }
        let began = Instant::now();
        let result = match action {
            Action::Add => self.add(group).map(Some),
            Action::Drain(m) => self
                .d
                .drain_member(m, false)
                .map(|()| None)
                .with_context(|| format!("draining member {m}")),
            Action::Hold => return Ok(()),
        };
        let seconds = round3(began.elapsed().as_secs_f64());
        let line = match result {
            Ok(Some((member, moves))) => {
                tracing::info!(member, moves, seconds, "member added; rebalance started");
                json!({"type": "outcome", "action": "add", "ok": true, "member": member,
                       "moves": moves, "seconds": seconds})
            }
            Ok(None) => {
                let member = match action {
                    Action::Drain(m) => Some(m),
                    _ => None,
                };
                tracing::info!(member, "drain started");
                json!({"type": "outcome", "action": "drain", "ok": true, "member": member,
                       "seconds": seconds})
            }
            Err(e) => {
                tracing::warn!(action = action.name(), error = %format!("{e:#}"), "action failed");
                lock(&self.metrics).failures += 1;
                json!({"type": "outcome", "action": action.name(), "ok": false,
                       "error": format!("{e:#}"), "seconds": seconds})
            }
        };
        emit(&line)
    }

    /// Launches a member, waits until it joined, starts a rebalance;
    /// returns its id and how many partitions move to spread the load.
    fn add(&mut self, before: &BTreeSet<u32>) -> anyhow::Result<(u32, usize)> {
        let Some(l) = self.launcher.as_mut() else {
            bail!("dry run");
        };
        let n = l.launch()?.n;
        let joined = wait_join(&self.d, l, n, before, self.join_timeout);
        let member = match joined {
            Ok(m) => m,
            Err(e) => {
                l.abandon(n);
                return Err(e);
            }
        };
        l.joined(n, member);
        let moves = crate::elastic::rebalance::start(&self.d)
            .with_context(|| format!("member {member} joined, but the rebalance failed"))?;
        Ok((member, moves))
    }

    /// Drains the members it started, the latest first, while the group
    /// keeps each partition's copies (the minimum no longer applies: the
    /// user asked for them to stop); waits for each.
    fn stop_started(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let Some(l) = self.launcher.as_ref() else {
            return Ok(());
        };
        let ours: Vec<u32> = l.members().into_iter().rev().collect();
        for m in ours {
            let s = sample::take(&self.d, self.now_s(), &[], &BTreeMap::new())?;
            let o = &s.observed;
            if !s.members.contains(&m) {
                continue;
            }
            if let Some(why) = stop_refusal(o, m) {
                tracing::warn!(member = m, members = o.active, reason = %why, "left running");
                let line = json!({"type": "outcome", "action": "stop", "ok": false,
                                  "member": m, "error": why});
                emit(&line)?;
                continue;
            }
            let began = Instant::now();
            let r = self
                .d
                .drain_member(m, false)
                .map_err(anyhow::Error::from)
                .and_then(|()| wait_gone(&self.d, m, timeout));
            let seconds = round3(began.elapsed().as_secs_f64());
            let line = match r {
                Ok(()) => {
                    json!({"type": "outcome", "action": "stop", "ok": true, "member": m, "seconds": seconds})
                }
                Err(e) => json!({"type": "outcome", "action": "stop", "ok": false, "member": m,
                                 "error": format!("{e:#}"), "seconds": seconds}),
            };
            emit(&line)?;
        }
        if let Some(l) = self.launcher.as_mut() {
            l.reap();
        }
        Ok(())
    }
}

/// Why member `m` may not be drained as the regulator stops, if it may not:
/// the copies of a partition would not fit on the members left, or it
/// holds a copy of an under-replicated partition.
fn stop_refusal(o: &Observed, m: u32) -> Option<String> {
    let left = o.active.saturating_sub(1);
    if left < o.max_copies.max(1) {
        return Some(format!(
            "a partition has {} copies and only {left} members would remain",
            o.max_copies
        ));
    }
    let under = o.candidates.iter().find(|c| c.id == m)?.under_replicated;
    (under > 0).then(|| format!("it holds {under} under-replicated partitions"))
}

/// Waits until a member not in `before` is alive in the group (the one
/// launch `n` started); fails if its process fails first, on the
/// timeout, or on a signal.
fn wait_join(
    d: &Driver,
    l: &mut Launcher,
    n: u32,
    before: &BTreeSet<u32>,
    timeout: Duration,
) -> anyhow::Result<u32> {
    let deadline = Instant::now() + timeout;
    let log = |l: &Launcher| {
        l.launched
            .iter()
            .find(|x| x.n == n)
            .map(|x| x.log.display().to_string())
            .unwrap_or_default()
    };
    loop {
        if let Some(x) = l.launched.iter_mut().find(|x| x.n == n) {
            // A launcher that submits a job (sbatch, qsub, flux submit)
            // returns 0 at once: the member joins later.
            if let Ok(Some(status)) = x.child.try_wait().map(|s| s.filter(|s| !s.success())) {
                bail!(
                    "the launcher exited ({status}) before a member joined; see {}",
                    x.log.display()
                );
            }
        }
        match d.members() {
            Ok(ms) => {
                if let Some(m) = ms.iter().find(|m| m.alive && !before.contains(&m.id)) {
                    return Ok(m.id);
                }
            }
            Err(e) => tracing::debug!(error = %e, "listing members failed; retrying"),
        }
        if let Some(sig) = interrupt::received() {
            bail!("{} before the new member joined", interrupt::name(sig));
        }
        if Instant::now() >= deadline {
            bail!(
                "no member joined within {} s; see {}",
                timeout.as_secs_f64(),
                log(l)
            );
        }
        std::thread::sleep(POLL);
    }
}

/// Waits until member `m` left the group.
fn wait_gone(d: &Driver, m: u32, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match d.members() {
            Ok(ms) if !ms.iter().any(|x| x.id == m) => return Ok(()),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "listing members failed; retrying"),
        }
        if Instant::now() >= deadline {
            bail!(
                "member {m} still in the group after {} s (its drain goes on)",
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// One JSON line on stdout, flushed.
fn emit(v: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()?;
    Ok(())
}

fn lock(m: &metrics::Shared) -> std::sync::MutexGuard<'_, metrics::Metrics> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
