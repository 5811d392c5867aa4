//! What a server process runs for transforms: every second it reads the
//! definitions and the source topics' leaders, and keeps one worker
//! thread for each source partition this member leads, of each defined
//! transform. A partition whose leadership moved stops its worker here
//! and starts one on its new leader, which resumes at the committed
//! offset; a deleted transform stops everywhere. A worker whose run
//! fails starts again after a pause (its error is logged), so a
//! transform held up by a down output partition resumes by itself.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// A client of the member's group, retried until it answers.
fn connect(group_file: Option<&Path>, addr: &str, stop: &AtomicBool) -> Option<Driver> {
    while !stop.load(Ordering::Acquire) {
        let d = match group_file {
            Some(f) => Driver::connect(f),
            None => Driver::connect_addr(addr),
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
}

impl TransformHost {
    /// Starts running the transforms whose source partitions this member
    /// leads, through a client of its group (`group_file`, else its own
    /// server at `addr`, which must then keep the registry). `member`
    /// says the member's id (`u32::MAX` until it joined; it is asked on
    /// every round).
    pub fn start(
        group_file: Option<PathBuf>,
        addr: String,
        member: impl Fn() -> u32 + Send + 'static,
    ) -> TransformHost {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("strom-transforms".into())
            .spawn(move || {
                let Some(d) = connect(group_file.as_deref(), &addr, &s) else {
                    return;
                };
                host_loop(&d, &member, &s);
            })
            .ok();
        TransformHost { stop, thread }
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

fn host_loop(d: &Driver, member: &dyn Fn() -> u32, stop: &AtomicBool) {
    let mut workers: HashMap<Key, Worker> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let me = member();
        if me == u32::MAX {
            // Not joined yet.
            pause(EVERY, stop);
            continue;
        }
        match wanted(d, me) {
            Ok(want) => {
                for spec in &want.ends {
                    complete_output(d, spec);
                }
                reconcile(d, &mut workers, want);
            }
            Err(e) => {
                tracing::debug!(error = %e, "transforms: reading definitions or leaders failed")
            }
        }
        workers.retain(|_, w| !w.thread.is_finished());
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

fn wanted(d: &Driver, member: u32) -> Result<Wanted> {
    let mut want = Wanted {
        run: BTreeMap::new(),
        unknown: Vec::new(),
        ends: Vec::new(),
    };
    for (name, spec) in defs::list(d)? {
        let info = match d.describe(&spec.from) {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(transform = %name, error = %e, "transform source not available");
                want.unknown.push(name);
                continue;
            }
        };
        for p in info.partitions.iter().filter(|p| p.member == member) {
            want.run.insert((name.clone(), p.id), spec.clone());
        }
        if info.state.ended && info.partitions.first().is_some_and(|p| p.member == member) {
            want.ends.push(spec);
        }
    }
    Ok(want)
}

fn reconcile(d: &Driver, workers: &mut HashMap<Key, Worker>, want: Wanted) {
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
    for (key, spec) in want {
        if workers.contains_key(&key) {
            continue;
        }
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
