//! What a server process runs for transforms: every second it reads the
//! definitions appended since its last look (one reader, kept) and the
//! source topics' leaders, and keeps one worker thread for each source
//! partition this member leads, of each defined transform, up to
//! `max_workers` threads (the server's `max_transform_workers`); the
//! rest wait, with a warning, until a worker stops. Transforms on a cycle
//! (which `create` refuses, but concurrent creates could record) are not
//! run. A partition whose leadership moved stops its worker here
//! and starts one on its new leader, which resumes at the committed
//! offset; a deleted transform stops everywhere. A worker whose run
//! fails starts again after a pause (its error is logged), so a
//! transform held up by a down output partition resumes by itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::defs::{self, TransformSpec};
use super::{Builtin, PartitionJob, Transformer};
use crate::driver::Driver;
use crate::error::Result;

const EVERY: Duration = Duration::from_secs(1);
const AGAIN_AFTER: Duration = Duration::from_secs(2);
/// How long stopping waits for the workers.
pub const STOP_WAIT: Duration = Duration::from_secs(5);
/// Worker threads a member runs at most, unless told otherwise.
pub const DEFAULT_MAX_WORKERS: usize = 64;

/// What a transform host is doing, for tests and status.
#[derive(Default)]
pub struct HostStats {
    /// Rounds (reads of definitions and leaders) done.
    pub rounds: AtomicU64,
    /// Worker threads running now.
    pub running: AtomicUsize,
    /// (transform, partition) pairs this member should run (some may wait
    /// for the cap).
    pub wanted: AtomicUsize,
    /// Definition records read so far (each is read once).
    pub defs_read: AtomicU64,
}

/// How the host proves itself to its server: a token the server made for
/// its own in-process clients (`Ok(None)` without `auth`; an error while
/// the server cannot make one yet, e.g. a member that has not read its
/// group's secret: the host waits rather than connect anonymously).
pub type TokenSource = Box<dyn Fn() -> std::result::Result<Option<String>, String> + Send>;

/// A client of the member's group, retried until it answers.
fn connect(
    group_file: Option<&Path>,
    addr: &str,
    token: &TokenSource,
    stop: &AtomicBool,
) -> Option<Driver> {
    while !stop.load(Ordering::Acquire) {
        let t = match token() {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "transforms: waiting for a token from this server");
                pause(EVERY, stop);
                continue;
            }
        };
        let d = match group_file {
            Some(f) => Driver::connect_as(f, Default::default(), t),
            None => Driver::connect_addr_as(addr, Default::default(), t),
        };
        match d {
            Ok(d) => return Some(d),
            Err(e) => tracing::debug!(error = %e, "transforms: connecting to this server"),
        }
        pause(EVERY, stop);
    }
    None
}

struct Worker {
    spec: TransformSpec,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The transforms a member runs. Dropping it stops them.
pub struct TransformHost {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<HostStats>,
}

impl TransformHost {
    /// Starts running the transforms whose source partitions this member
    /// leads, through a client of its group (`group_file`, else its own
    /// server at `addr`, which must then keep the registry). `member`
    /// says the member's id (`u32::MAX` until it joined; it is asked on
    /// every round). At most `max_workers` worker threads run at once
    /// (at least one).
    pub fn start(
        group_file: Option<PathBuf>,
        addr: String,
        member: impl Fn() -> u32 + Send + 'static,
        max_workers: usize,
        token: TokenSource,
    ) -> TransformHost {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(HostStats::default());
        let (s, st) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("strom-transforms".into())
            .spawn(move || {
                let Some(d) = connect(group_file.as_deref(), &addr, &token, &s) else {
                    return;
                };
                host_loop(&d, &member, &s, max_workers.max(1), &st);
            })
            .ok();
        TransformHost {
            stop,
            thread,
            stats,
        }
    }

    /// What the host is doing.
    pub fn stats(&self) -> &HostStats {
        &self.stats
    }

    /// Stops every worker after the batch in hand, waiting at most
    /// [`STOP_WAIT`] (a worker retrying an unreachable output is left to
    /// end with the process).
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Release);
        let Some(t) = self.thread.take() else { return };
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().spawn(move || {
            let _ = t.join();
            let _ = tx.send(());
        });
        if rx.recv_timeout(STOP_WAIT).is_err() {
            tracing::warn!("transform workers did not stop in time");
        }
    }
}

impl Drop for TransformHost {
    fn drop(&mut self) {
        self.stop_now();
    }
}

type Key = (String, u32);

/// What the host loop remembers between rounds.
struct Round {
    defs: defs::Defs,
    /// Cyclic transforms already warned about.
    warned: BTreeSet<String>,
    /// Pairs left waiting for the cap at the last warning.
    waiting: usize,
}

fn host_loop(
    d: &Driver,
    member: &dyn Fn() -> u32,
    stop: &AtomicBool,
    max_workers: usize,
    stats: &HostStats,
) {
    let mut workers: HashMap<Key, Worker> = HashMap::new();
    let mut round = Round {
        defs: defs::Defs::default(),
        warned: BTreeSet::new(),
        waiting: 0,
    };
    while !stop.load(Ordering::Acquire) {
        let me = member();
        if me == u32::MAX {
            // Not joined yet.
            pause(EVERY, stop);
            continue;
        }
        match wanted(d, me, &mut round) {
            Ok(want) => {
                for spec in &want.ends {
                    complete_output(d, spec);
                }
                stats.wanted.store(want.run.len(), Ordering::Relaxed);
                let waiting = reconcile(d, &mut workers, want, max_workers);
                if waiting != round.waiting && waiting > 0 {
                    tracing::warn!(
                        waiting,
                        max_transform_workers = max_workers,
                        "transform partitions wait for a worker: this member runs at most max_transform_workers"
                    );
                }
                round.waiting = waiting;
            }
            Err(e) => {
                tracing::debug!(error = %e, "transforms: reading definitions or leaders failed")
            }
        }
        workers.retain(|_, w| !w.thread.is_finished());
        stats.running.store(workers.len(), Ordering::Relaxed);
        stats
            .defs_read
            .store(round.defs.records_read(), Ordering::Relaxed);
        stats.rounds.fetch_add(1, Ordering::Release);
        pause(EVERY, stop);
    }
    for w in workers.values() {
        w.stop.store(true, Ordering::Release);
    }
    for (_, w) in workers {
        let _ = w.thread.join();
    }
}

/// What this member should run now.
struct Wanted {
    /// The (transform, partition) pairs it leads.
    run: BTreeMap<Key, TransformSpec>,
    /// Transforms whose source could not be described this round: their
    /// workers stay as they are.
    unknown: Vec<String>,
    /// Transforms whose source ended, and whose source partition 0 this
    /// member leads: it ends their output once they are carried over.
    ends: Vec<TransformSpec>,
}

fn wanted(d: &Driver, member: u32, round: &mut Round) -> Result<Wanted> {
    let mut want = Wanted {
        run: BTreeMap::new(),
        unknown: Vec::new(),
        ends: Vec::new(),
    };
    let all = round.defs.refresh(d)?;
    let cycles = defs::cyclic(all);
    for name in cycles.difference(&round.warned) {
        tracing::warn!(transform = %name, "transform lies on a cycle of transforms; it does not run (delete one of the cycle)");
    }
    round.warned = cycles.clone();
    for (name, spec) in all.iter().filter(|(n, _)| !cycles.contains(*n)) {
        let info = match d.describe(&spec.from) {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(transform = %name, error = %e, "transform source not available");
                want.unknown.push(name.clone());
                continue;
            }
        };
        for p in info.partitions.iter().filter(|p| p.member == member) {
            want.run.insert((name.clone(), p.id), spec.clone());
        }
        if info.state.ended && info.partitions.first().is_some_and(|p| p.member == member) {
            want.ends.push(spec.clone());
        }
    }
    Ok(want)
}

/// Which wanted pairs that do not run yet may start: in key order, while
/// fewer than `max` run.
fn to_start<W>(
    want: &BTreeMap<Key, TransformSpec>,
    running: &HashMap<Key, W>,
    max: usize,
) -> Vec<Key> {
    want.keys()
        .filter(|k| !running.contains_key(*k))
        .take(max.saturating_sub(running.len()))
        .cloned()
        .collect()
}

/// Stops the workers no longer wanted and starts wanted ones up to
/// `max` running; returns how many wanted pairs wait for the cap.
fn reconcile(d: &Driver, workers: &mut HashMap<Key, Worker>, want: Wanted, max: usize) -> usize {
    let Wanted {
        run: want, unknown, ..
    } = want;
    workers.retain(|key, w| {
        let keep = want.get(key) == Some(&w.spec) || unknown.contains(&key.0);
        if !keep {
            tracing::info!(transform = %key.0, partition = key.1, "transform worker stops here");
            w.stop.store(true, Ordering::Release);
        }
        keep
    });
    for key in to_start(&want, workers, max) {
        let spec = want[&key].clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (d2, s2, k2) = (d.clone(), stop.clone(), key.clone());
        let sp = spec.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("strom-transform-{}-{}", key.0, key.1))
            .spawn(move || worker_loop(&d2, &sp, k2.1, &s2));
        match spawned {
            Ok(thread) => {
                tracing::info!(transform = %key.0, partition = key.1, "transform worker starts here");
                workers.insert(key, Worker { spec, stop, thread });
            }
            Err(e) => tracing::warn!(error = %e, "could not start a transform worker thread"),
        }
    }
    want.keys().filter(|k| !workers.contains_key(*k)).count()
}

fn worker_loop(d: &Driver, spec: &TransformSpec, partition: u32, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match run_once(d, spec, partition, stop) {
            Ok(true) => {
                // The source partition ended: nothing more comes (the
                // host ends the output's stream once all are carried over).
                while !stop.load(Ordering::Acquire) {
                    pause(EVERY, stop);
                }
                return;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(transform = %spec.name, partition, error = %e, "transform run failed; it starts again");
            }
        }
        pause(AGAIN_AFTER, stop);
    }
}

/// Sleeps `d`, or less once `stop` is set (checked every 50 ms), so a
/// server's shutdown does not wait for a round.
fn pause(d: Duration, stop: &AtomicBool) {
    let step = Duration::from_millis(50);
    let mut slept = Duration::ZERO;
    while slept < d && !stop.load(Ordering::Acquire) {
        std::thread::sleep(step);
        slept += step;
    }
}

/// One run of a built-in transform on one partition; `true` when the
/// source partition's stream ended (nothing more will come).
fn run_once(d: &Driver, spec: &TransformSpec, partition: u32, stop: &AtomicBool) -> Result<bool> {
    let pipeline = spec.check()?;
    let src = d.open_topic(&spec.from)?;
    let dst = d.open_topic(&spec.to)?;
    let raw_ok = src.policy()?.serializer_is_json() && dst.policy()?.serializer_is_json();
    let t: Box<dyn Transformer> = Box::new(Builtin::new(pipeline, raw_ok));
    let job = PartitionJob {
        name: &spec.name,
        src: &src,
        dst: &dst,
        partition,
        transformer: t.as_ref(),
        stop,
    };
    Ok(job.run()?.ended)
}

/// Ends the output topic's stream if the source's stream ended and the
/// transform committed every source partition to its end (so consumers of
/// the output see the end of stream, as they would behind producers).
fn complete_output(d: &Driver, spec: &TransformSpec) {
    if d.describe(&spec.to).is_ok_and(|o| o.state.ended) {
        return;
    }
    let name = super::consumer_name(&spec.name);
    let done = d.describe(&spec.from).is_ok_and(|info| {
        info.state.ended
            && info.partitions.iter().all(|p| {
                p.next_offset == p.first_offset
                    || d.consumer_offsets_at(&p.addr, &spec.from, p.id)
                        .is_ok_and(|o| o.iter().any(|(n, at)| *n == name && *at >= p.next_offset))
            })
    });
    if !done {
        return;
    }
    match d.open_topic(&spec.to).and_then(|t| t.complete()) {
        Ok(()) => {
            tracing::info!(transform = %spec.name, topic = %spec.to, "source ended and carried over: output stream ended")
        }
        Err(e) => tracing::debug!(error = %e, "ending the transform's output"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_workers_start_than_the_cap_allows() {
        let spec = |n: &str| TransformSpec {
            name: n.into(),
            from: "x".into(),
            to: "y".into(),
            ops: vec![],
        };
        let want: BTreeMap<Key, TransformSpec> = (0..5)
            .flat_map(|p| {
                [
                    (("a".to_string(), p), spec("a")),
                    (("b".to_string(), p), spec("b")),
                ]
            })
            .collect();
        let mut running: HashMap<Key, ()> = HashMap::new();
        let first = to_start(&want, &running, 3);
        assert_eq!(first.len(), 3);
        running.extend(first.into_iter().map(|k| (k, ())));
        assert!(
            to_start(&want, &running, 3).is_empty(),
            "the cap is reached"
        );
        running.remove(&("a".to_string(), 0));
        let next = to_start(&want, &running, 3);
        assert_eq!(next.len(), 1, "one slot came free");
        assert!(!running.contains_key(&next[0]));
        assert_eq!(to_start(&want, &HashMap::<Key, ()>::new(), 100).len(), 10);
    }
}
