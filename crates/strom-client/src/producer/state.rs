//! The native producer's queues: one `PartQueue` per partition with its
//! open batch and its sealed batches (`Sealed`), and the producer's shared
//! `Inner`. `native.rs` fills and sends them; `refresh.rs` and `retry.rs`
//! work on them beside it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use strom_policy::TopicPolicy;
use strom_proto::{BatchBuilder, Compression, Section};
use tokio::sync::mpsc;

use crate::batching::EventLimit;
use crate::conn::ClientConn;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::slot::Slot;
use crate::topic::Topic;

use crate::push::{BatchAck, ProducerOptions};

pub(super) struct Sealed {
    pub(super) meta: Section,
    pub(super) count: u32,
    pub(super) data: Vec<Bytes>,
    pub(super) slot: Arc<Slot<BatchAck>>,
    /// An idempotent producer's sequence number for the batch.
    pub(super) seq: Option<u32>,
    /// When its first attempt failed (resent batches).
    pub(super) failed_at: Option<std::time::Instant>,
    /// Its data parts are framed already (compressed topics).
    pub(super) packed: bool,
}

pub(super) struct QueueState {
    /// The largest event this partition takes.
    pub(super) limit: EventLimit,
    pub(super) builder: BatchBuilder,
    pub(super) data: Vec<Bytes>,
    /// Bytes of the open batch, data parts included ...
    pub(super) bytes: u64,
    /// ... and without them.
    pub(super) meta_bytes: u64,
    pub(super) slot: Arc<Slot<BatchAck>>,
    pub(super) sealed: VecDeque<Sealed>,
    /// Batches sent and not answered, those waiting in `resend` included.
    pub(super) in_flight: usize,
    /// When the partition's owner last answered a batch, or when a batch
    /// went out while none was waiting for an answer.
    pub(super) answered_at: Instant,
    pub(super) error: Option<Error>,
    /// Idempotence: the producer id the batches are stamped with.
    pub(super) stamp: Option<u64>,
    pub(super) next_seq: u32,
    /// Batches whose attempt failed, by sequence number, to resend in order.
    pub(super) resend: std::collections::BTreeMap<u32, Sealed>,
    /// A resend is being prepared: nothing new is sent before it.
    pub(super) resending: bool,
    /// A batch was given up: later ones cannot follow it in order.
    pub(super) gave_up: bool,
    /// A batch waiting for a resend was answered that the server holds no
    /// copy of the partition (it moved away): the resend goes ahead only
    /// if the registry still names the partition, else it fails with this.
    pub(super) not_hosted: Option<Error>,
}

pub(super) struct PartQueue {
    pub(super) partition: u32,
    /// The member owning the partition and its address (refreshed).
    pub(super) owner: Mutex<(u32, String)>,
    /// The owner's connection once the sender task opened it.
    pub(super) conn: Mutex<Option<Arc<ClientConn>>>,
    /// Connections to former owners that may still carry its batches (the
    /// request timeout gives them up too).
    pub(super) former: Mutex<Vec<Arc<ClientConn>>>,
    /// Batches handed to the sender task and not yet written: while any
    /// are, later batches queue behind them to keep their order.
    pub(super) queued: AtomicUsize,
    pub(super) state: Mutex<QueueState>,
    pub(super) cond: Condvar,
    /// Batches to send, in seal order, to this partition's sender task.
    pub(super) outbox: mpsc::UnboundedSender<Sealed>,
}

pub(super) struct Inner {
    pub(super) topic: Topic,
    pub(super) id: u64,
    pub(super) policy: TopicPolicy,
    pub(super) opts: ProducerOptions,
    /// Grows when partitions are added to the topic.
    pub(super) parts: RwLock<Vec<Arc<PartQueue>>>,
    pub(super) closed: AtomicBool,
    /// When a batch is sent even if the mode would keep filling it.
    pub(super) batch_target: crate::batching::BatchTarget,
    /// The producer's lease, renewed by the driver while this is alive.
    pub(super) lease: Option<Arc<Lease>>,
    /// Batches are stamped and resent (see [`ProducerOptions::idempotent`]).
    pub(super) idempotent: bool,
    /// The topic's data-part compression: batches are then framed on the
    /// partition's sender task, never on the pushing thread.
    pub(super) compression: Compression,
    /// [`ProducerOptions::request_timeout`], or `None` where the partitions
    /// hold appends on purpose (`block` memory partitions).
    pub(super) request_timeout: Option<Duration>,
}

impl QueueState {
    /// Batches on their way or waiting for an answer (not those set aside
    /// for a resend).
    pub(super) fn unanswered(&self) -> usize {
        self.in_flight - self.resend.len()
    }

    /// A batch goes out: if none was waiting for an answer, the owner's
    /// time to answer starts now.
    pub(super) fn sending(&mut self) {
        if self.unanswered() == 0 {
            self.answered_at = Instant::now();
        }
    }
}

impl Inner {
    /// `PRODUCER_EXPIRED` once the master reported the lease lost.
    pub(super) fn check_lease(&self) -> Result<()> {
        match &self.lease {
            Some(l) if l.is_expired() => Err(l.error()),
            _ => Ok(()),
        }
    }
}
