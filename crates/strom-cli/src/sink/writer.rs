//! The writer thread: owns the PostgreSQL connection and commits batches
//! one at a time, in order, while the consuming thread fills the next one
//! (JSON decoding and consuming overlap COPY and COMMIT). The hand-off is
//! a rendezvous channel, so at most one batch is being written and one
//! filled. After each commit the writer acks the batch's last event of
//! each partition to Strom; PostgreSQL keeps the positions regardless.

use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use strom_client::{AckFuture, Event};

use super::store::{Advance, Row, Store, WriteTimes};

/// How long the last acks may take at exit.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// The events of one transaction.
#[derive(Default)]
pub struct Batch {
    pub rows: Vec<Row>,
    /// Per partition: the offset after the last event taken.
    pub next: BTreeMap<u32, u64>,
    /// Per partition: the last event taken, acked after the commit.
    pub last: BTreeMap<u32, Event>,
}

/// What the writer did.
#[derive(Default)]
pub struct Written {
    pub rows: u64,
    pub transactions: u64,
    pub times: WriteTimes,
}

pub struct Writer {
    tx: Option<SyncSender<Batch>>,
    thread: Option<JoinHandle<(Written, anyhow::Result<()>)>>,
}

impl Writer {
    /// Starts the thread; `stored` are the positions the offsets table
    /// holds now, `ack` whether to ack committed events to Strom.
    pub fn spawn(store: Store, stored: BTreeMap<u32, u64>, ack: bool) -> anyhow::Result<Writer> {
        let (tx, rx) = sync_channel::<Batch>(0);
        let thread = std::thread::Builder::new()
            .name("sink-writer".into())
            .spawn(move || {
                let mut w = State {
                    store,
                    positions: stored,
                    acks: BTreeMap::new(),
                    ack,
                    done: Written::default(),
                };
                let r = rx.iter().try_for_each(|b| w.commit(b));
                w.settle_acks();
                (w.done, r)
            })?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hands a batch over; waits while the previous one is being written.
    /// `false` when the writer stopped (its error comes from [`finish`]).
    ///
    /// [`finish`]: Writer::finish
    pub fn send(&mut self, batch: Batch) -> bool {
        if batch.next.is_empty() {
            return true;
        }
        self.tx.as_ref().is_some_and(|tx| tx.send(batch).is_ok())
    }

    /// True once the thread ended, which before [`finish`] means it failed.
    ///
    /// [`finish`]: Writer::finish
    pub fn stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits until every batch handed over is committed (or the first
    /// failure) and the last acks settled.
    pub fn finish(mut self) -> (Written, anyhow::Result<()>) {
        drop(self.tx.take());
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => (
                Written::default(),
                Err(anyhow::anyhow!("the sink's writer thread panicked")),
            ),
        }
    }
}

struct State {
    store: Store,
    /// Per partition: the next offset the offsets table holds.
    positions: BTreeMap<u32, u64>,
    acks: BTreeMap<u32, AckFuture>,
    ack: bool,
    done: Written,
}

impl State {
    /// Writes the batch and its positions in one transaction, then acks.
    fn commit(&mut self, batch: Batch) -> anyhow::Result<()> {
        let advances: BTreeMap<u32, Advance> = batch
            .next
            .iter()
            .map(|(&p, &next)| {
                let expected = self.positions.get(&p).copied();
                (p, Advance { expected, next })
            })
            .collect();
        let times = self.store.write(&batch.rows, &advances)?;
        tracing::debug!(
            rows = batch.rows.len(),
            copy_ms = times.copy.as_millis() as u64,
            commit_ms = times.commit.as_millis() as u64,
            "batch committed"
        );
        self.positions.extend(batch.next);
        self.done.rows += batch.rows.len() as u64;
        self.done.transactions += 1;
        self.done.times.copy += times.copy;
        self.done.times.commit += times.commit;
        if self.ack {
            for (p, ev) in batch.last {
                self.acks.insert(p, ev.ack());
            }
        }
        Ok(())
    }

    /// Waits (bounded) for the last ack of each partition; a failure only
    /// warns, since PostgreSQL holds the positions.
    fn settle_acks(&mut self) {
        for (p, ack) in std::mem::take(&mut self.acks) {
            if let Err(e) = ack.wait_timeout(Some(ACK_WAIT)) {
                tracing::warn!(partition = p, error = %e, "ack to Strom failed");
            }
        }
    }
}
