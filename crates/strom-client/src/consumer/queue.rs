//! The consumer every backend builds: it takes events from the queue its
//! backend fills (`state.rs`) and returns credit to the server in chunks,
//! which bounds the prefetch. The native backend fills it with one
//! subscription task per partition (`subscription.rs`, or the assignment
//! `partitioned.rs` follows); another backend fills it through a [`Feed`]
//! (the Kafka backend's reader). The public `Consumer` calls it through
//! `ConsumerBackend`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use strom_net::ReadHere;
use strom_proto::{Request, StartPos};
use tokio::task::JoinHandle;

use super::state::{Item, PartSub, Queue, Shared};
use crate::backend::ConsumerBackend;
use crate::consumer_options::ConsumerOptions;
use crate::error::{Error, Result};
use crate::event::{Event, Next};
use crate::membership::Membership;
use crate::owner::refresh_loop;
use crate::subscription::run_partition;
use crate::topic::Topic;

const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

/// A reader that fills a consumer's queue from outside the native
/// partition subscriptions (the Kafka backend's poll loop).
pub(crate) trait Feed: Send + Sync {
    /// Moves the reader to `pos`; `reset` empties the consumer's queue
    /// and returns its new epoch.
    fn reposition(&self, pos: StartPos, reset: &dyn Fn() -> u64) -> Result<()>;
}

pub(crate) struct QueueConsumer {
    shared: Arc<Shared>,
    refresher: Mutex<Option<JoinHandle<()>>>,
    /// A backend's reader that fills the same queue instead of the
    /// native partition subscriptions (the Kafka backend's).
    feed: Option<Box<dyn Feed>>,
}

impl QueueConsumer {
    /// A consumer of Strom servers' partitions (the native backend's).
    pub(crate) fn native(
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        group: Option<Arc<Membership>>,
    ) -> Result<QueueConsumer> {
        let info = topic.refresh_blocking()?;
        let partitioned = group.as_ref().is_some_and(|g| !g.is_shared());
        let follow_new = opts.partitions.is_none() && !partitioned;
        let partitions = match &opts.partitions {
            // A partitioned group's member starts with nothing and follows
            // its assignment.
            _ if partitioned => Vec::new(),
            Some(p) => p.clone(),
            None => (0..info.partitions.len() as u32).collect(),
        };
        let mut parts = Vec::new();
        for &p in &partitions {
            let pi = info.partitions.get(p as usize).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "topic '{}' has {} partitions; {p} does not exist",
                    topic.name(),
                    info.partitions.len()
                ))
            })?;
            parts.push(PartSub::new(
                &topic,
                name,
                group.as_deref(),
                p,
                pi.member,
                pi.addr.clone(),
            ));
        }
        let shared = Shared::new(topic, name, group, opts, parts, partitioned)?;
        let c = QueueConsumer {
            shared,
            refresher: Mutex::new(None),
            feed: None,
        };
        c.start(c.shared.opts.start, 0)?;
        if follow_new {
            let refresh = refresh_loop(Arc::downgrade(&c.shared));
            *c.refresher.lock() = Some(c.handle().spawn(refresh));
        }
        if partitioned {
            let follow = crate::partitioned::follow(Arc::downgrade(&c.shared));
            *c.refresher.lock() = Some(c.handle().spawn(follow));
        }
        Ok(c)
    }

    /// A consumer whose queue `feed` fills (only the Kafka backend feeds
    /// one today).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn fed(shared: Arc<Shared>, feed: Box<dyn Feed>) -> QueueConsumer {
        QueueConsumer {
            shared,
            refresher: Mutex::new(None),
            feed: Some(feed),
        }
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        &self.shared.topic.driver.inner.handle
    }

    /// Subscribes every partition at `start` and waits until the servers
    /// confirmed where each subscription begins (or a partition's server
    /// turned out to be unreachable, which it keeps retrying).
    fn start(&self, start: StartPos, epoch: u64) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let n = self.shared.parts.read().len();
        let mut tasks = self.shared.tasks.lock();
        for i in 0..n {
            let task = run_partition(self.shared.clone(), i, start, epoch, Some(tx.clone()));
            tasks.push(self.handle().spawn(task));
        }
        drop((tasks, tx));
        for _ in 0..n {
            match rx.recv_timeout(SUBSCRIBE_TIMEOUT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::Timeout(SUBSCRIBE_TIMEOUT)),
            }
        }
        Ok(())
    }

    fn take(&self, q: &mut Queue) -> Option<Result<Next>> {
        loop {
            if !q.partitioned && q.ended.iter().all(|e| *e) {
                return Some(Ok(Next::EndOfStream));
            }
            match q.items.front_mut()? {
                Item::GroupEnd => return Some(Ok(Next::EndOfStream)),
                Item::Assigned(_) | Item::Revoked(_) => {
                    let listener = self.shared.group.as_ref().and_then(|g| g.listener.clone());
                    match (q.items.pop_front(), listener) {
                        (Some(Item::Assigned(ps)), Some(l)) => l.on_assigned(&ps),
                        (Some(Item::Revoked(ps)), Some(l)) => l.on_revoked(&ps),
                        _ => {}
                    }
                }
                Item::Events(slot, events) => {
                    let slot = *slot as usize;
                    let Some(ev) = events.pop_front() else {
                        q.items.pop_front();
                        continue;
                    };
                    if events.is_empty() {
                        q.items.pop_front();
                    }
                    q.taken[slot] += 1;
                    self.shared.budget.release(ev.fetched_len());
                    // A shared group's window is its unacked events: acks,
                    // not pulls, give the credit back (on the server).
                    let per_ack = self.shared.group.as_ref().is_some_and(|g| g.is_shared());
                    if !per_ack && q.taken[slot] >= (self.shared.opts.prefetch / 2).max(1) {
                        let events = std::mem::take(&mut q.taken[slot]);
                        let p = self.shared.part(slot);
                        let stream = p.stream.load(Ordering::Acquire);
                        let conn = p.conn.lock().clone();
                        if let Some(conn) = conn {
                            conn.send_oneway(&Request::Credit { stream, events });
                        }
                    }
                    return Some(Ok(Next::Event(ev)));
                }
                Item::End(slot) => {
                    let slot = *slot as usize;
                    q.ended[slot] = true;
                    q.items.pop_front();
                }
                Item::Failed(_) => {
                    if let Some(Item::Failed(e)) = q.items.pop_front() {
                        return Some(Err(e));
                    }
                }
            }
        }
    }

    /// Waits (the queue locked and found empty) until something may have
    /// been queued, or `deadline` passed (true). Reads the consumer's
    /// connection on this thread where it can (`read_on_pull`, and no data
    /// request on the wire), else waits for the runtime's tasks to queue
    /// and wake it.
    fn wait(&self, q: &mut MutexGuard<'_, Queue>, deadline: Option<Instant>) -> bool {
        // While a data request is on the wire the runtime reads its answer
        // and queues the events: a pull waits for them here.
        let fetching = self.shared.fetching.load(Ordering::Acquire) > 0;
        let bell = self
            .shared
            .bell
            .as_ref()
            .filter(|_| self.shared.opts.read_on_pull && !fetching);
        if let Some(bell) = bell {
            // Armed under the queue lock: whatever is queued after the
            // look that found nothing rings it.
            bell.arm();
            let read = MutexGuard::unlocked(q, || {
                let conn = self.shared.single_conn()?;
                // A bulk path's futures may need the runtime's context.
                let _rt = self.handle().enter();
                Some(conn.read_here(bell, deadline))
            });
            bell.quiet();
            match read {
                Some(ReadHere::TimedOut) => return true,
                Some(ReadHere::Read | ReadHere::Rang) => return false,
                Some(ReadHere::Unavailable) | None => {}
            }
            if !q.items.is_empty() {
                return false;
            }
        }
        match deadline {
            None => {
                self.shared.cond.wait(q);
                false
            }
            Some(d) => self.shared.cond.wait_until(q, d).timed_out(),
        }
    }

    fn stop_partitions(&self) {
        for t in self.shared.tasks.lock().drain(..) {
            t.abort();
        }
        for p in self.shared.parts.read().iter() {
            p.unsubscribe();
        }
    }
}

impl ConsumerBackend for QueueConsumer {
    fn name(&self) -> &str {
        &self.shared.name
    }

    /// The consumer group this consumer is a member of, if any.
    fn group(&self) -> Option<&str> {
        self.shared.group.as_ref().map(|g| g.spec.name.as_str())
    }

    /// The partitions this consumer reads: in a partitioned group, those
    /// assigned to it now; otherwise every partition it subscribed.
    fn assignment(&self) -> Vec<u32> {
        if self.shared.queue.lock().partitioned {
            return self.shared.assigned.lock().clone();
        }
        self.shared
            .parts
            .read()
            .iter()
            .map(|p| p.partition)
            .collect()
    }

    /// The member id this consumer holds in its consumer group.
    fn member_id(&self) -> Option<u64> {
        self.shared.group.as_ref().map(|g| g.consumer())
    }

    fn topic(&self) -> &Topic {
        &self.shared.topic
    }

    /// Takes every event that has arrived, up to `max`, in one call: waits
    /// up to `timeout` for the first one, never for more. `Ok(None)` at the
    /// end of the stream (after every event was returned); an empty batch
    /// when `timeout` passed with nothing to take. An error is returned on
    /// its own, after the events queued before it.
    fn pull_many(&self, max: usize, timeout: Duration) -> Result<Option<Vec<Event>>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut q = self.shared.queue.lock();
        loop {
            while out.len() < max.max(1) {
                if !out.is_empty() && matches!(q.items.front(), Some(Item::Failed(_))) {
                    return Ok(Some(out));
                }
                match self.take(&mut q) {
                    Some(Ok(Next::Event(e))) => out.push(e),
                    Some(Ok(Next::EndOfStream)) if out.is_empty() => return Ok(None),
                    Some(Ok(Next::EndOfStream)) | None => break,
                    Some(Err(e)) => return Err(e),
                }
            }
            if !out.is_empty() || self.wait(&mut q, Some(deadline)) {
                // One last look after the deadline, then whatever there is.
                if out.is_empty() {
                    match self.take(&mut q) {
                        Some(Ok(Next::Event(e))) => out.push(e),
                        Some(Ok(Next::EndOfStream)) => return Ok(None),
                        Some(Err(e)) => return Err(e),
                        None => {}
                    }
                    if !out.is_empty() {
                        continue;
                    }
                }
                return Ok(Some(out));
            }
        }
    }

    fn next_blocking(&self, deadline: Option<Instant>) -> Option<Result<Next>> {
        let spin = self.shared.opts.spin;
        if !spin.is_zero() {
            let left = deadline.map_or(spin, |d| d.saturating_duration_since(Instant::now()));
            let until = Instant::now() + spin.min(left);
            loop {
                if let Some(r) = self.take(&mut self.shared.queue.lock()) {
                    return Some(r);
                }
                if Instant::now() >= until {
                    break;
                }
                // No sched_yield: it would hand the CPU to any background
                // process for a whole time slice. A thread woken to
                // deliver the event preempts a spinner anyway.
                std::hint::spin_loop();
            }
        }
        let mut q = self.shared.queue.lock();
        loop {
            if let Some(r) = self.take(&mut q) {
                return Some(r);
            }
            if self.wait(&mut q, deadline) {
                return self.take(&mut q);
            }
        }
    }

    /// Moves every partition to `pos` (offset, timestamp, beginning, end,
    /// or back to the committed offsets). Queued events are dropped.
    fn seek(&self, pos: StartPos) -> Result<()> {
        if self.shared.group.as_ref().is_some_and(|g| g.is_shared()) {
            return Err(Error::InvalidArgument(
                "a shared consumer group has no position to seek: the group hands out what is not acked yet".into(),
            ));
        }
        if self.shared.queue.lock().partitioned {
            return Err(Error::InvalidArgument(
                "seek is not available to members of a partitioned consumer group yet".into(),
            ));
        }
        if let Some(f) = &self.feed {
            return f.reposition(pos, &|| self.shared.reset_queue());
        }
        self.stop_partitions();
        let epoch = self.shared.reset_queue();
        self.start(pos, epoch)
    }

    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Result<Next>> {
        let mut q = self.shared.queue.lock();
        match self.take(&mut q) {
            Some(r) => Poll::Ready(r),
            None => {
                q.wakers.push(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for QueueConsumer {
    fn drop(&mut self) {
        if let Some(r) = self.refresher.lock().take() {
            r.abort();
        }
        self.stop_partitions();
        if let Some(g) = &self.shared.group {
            g.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use strom_proto::{StartPos, TopicSpec};

    use crate::consumer_options::ConsumerOptions;
    use crate::{Driver, ErrorCode, Next};

    /// With `read_on_pull`, a waiting pull reads its connection itself:
    /// an event reaches it while both threads of the client's runtime are
    /// busy elsewhere. Without it, only the runtime can hand it over.
    #[test]
    fn a_waiting_pull_reads_its_connection_itself() {
        let dir = tempfile::tempdir().unwrap();
        // The server runs on its own driver's runtime; the consumer's
        // client has another.
        let server = Driver::embedded(dir.path()).unwrap();
        let client = Driver::connect_addr(&server.master_addr()).unwrap();
        for read_on_pull in [true, false] {
            let name = format!("t-{read_on_pull}");
            let p = server
                .create_topic(TopicSpec::new(&name, 1))
                .unwrap()
                .producer()
                .unwrap();
            let topic = client.open_topic(&name).unwrap();
            let opts = ConsumerOptions {
                read_on_pull,
                spin: Duration::ZERO,
                start: StartPos::Beginning,
                ..Default::default()
            };
            let c = topic.consumer_with("c", opts).unwrap();
            // Occupy both workers of the client's runtime.
            let (started_tx, started) = mpsc::channel();
            let (release, released) = mpsc::channel::<()>();
            let released = std::sync::Arc::new(std::sync::Mutex::new(released));
            for _ in 0..2 {
                let (started_tx, released) = (started_tx.clone(), released.clone());
                client.inner.handle.spawn(async move {
                    started_tx.send(()).unwrap();
                    let _ = released.lock().unwrap().recv();
                });
            }
            for _ in 0..2 {
                started.recv_timeout(Duration::from_secs(10)).unwrap();
            }
            p.push("{\"i\": 0}", Vec::<u8>::new())
                .unwrap()
                .wait()
                .unwrap();
            let got = c.pull_timeout(Duration::from_millis(if read_on_pull {
                10_000
            } else {
                300
            }));
            match (read_on_pull, got) {
                (true, Ok(Next::Event(e))) => assert_eq!(e.meta().offset, 0),
                (false, Err(e)) if e.code() == ErrorCode::TIMEOUT => {}
                (r, other) => panic!("read_on_pull {r}: got {:?}", other.map(|_| ())),
            }
            release.send(()).unwrap();
            release.send(()).unwrap();
            drop(c);
        }
    }
}
