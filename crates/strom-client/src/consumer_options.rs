//! A consumer's options and their defaults, the data-wait spin among them.

use std::sync::Arc;
use std::time::Duration;

use strom_proto::{Selection, StartPos};

use crate::data::{DataBroker, DataSelector, VecBroker};

#[derive(Clone)]
pub struct ConsumerOptions {
    /// Partitions to read; `None` means all, including ones added later.
    pub partitions: Option<Vec<u32>>,
    /// Events per partition the server may push ahead of demand.
    pub prefetch: u32,
    /// Bytes of fetched data (all partitions) held for events not pulled
    /// yet; past it, data fetches wait for `pull`. A single event larger
    /// than this is still fetched, alone.
    pub prefetch_bytes: u64,
    /// Where to start; `Committed` resumes after the name's last ack.
    pub start: StartPos,
    pub selector: Arc<dyn DataSelector>,
    pub broker: Arc<dyn DataBroker>,
    /// How long a blocked `pull` keeps checking for an event before it
    /// sleeps. Waking a sleeping thread costs tens of microseconds (more on
    /// a virtual machine, whose idle CPU halts), and a spin as long as the
    /// gap between events keeps the delivery path awake while traffic
    /// flows. It spins only while a pull waits, so a consumer with no
    /// traffic costs one spin per pull and then sleeps; zero never spins.
    /// A long spin takes a core from the threads that bring the data, so
    /// the default ([`default_spin`]) is long only where cores are spare.
    pub spin: Duration,
    /// Whether a blocking pull that finds nothing queued (after its spin)
    /// reads the connection itself, so the kernel wakes the pulling thread
    /// when the next event arrives instead of waking the client's runtime,
    /// which would then wake the pulling thread: one thread wake-up per
    /// delivery instead of two. It applies when every partition the
    /// consumer reads is on one connection over TCP or shm, and while none
    /// of its data requests is on the wire; otherwise, and when false, the
    /// runtime reads and hands events over.
    pub read_on_pull: bool,
}

/// The default [`ConsumerOptions::spin`] on a machine with few cores
/// (fewer than [`SPARE_CORES`]): none. A waiting pull reads its own
/// connection ([`ConsumerOptions::read_on_pull`]), so the kernel wakes it
/// directly; a spin there only takes a core from the threads that bring
/// the data. On a 2-core VM a 50 µs spin (the earlier default) gave a
/// one-task-in-flight Python queue a p50 of 132-158 µs against 113-135 µs
/// without, and 1.06-1.22× Redis Streams' against 0.68-0.73× with two
/// other busy processes (docs/transports.md).
pub const DEFAULT_SPIN: Duration = Duration::ZERO;

/// The default [`ConsumerOptions::spin`] where cores are spare: it covers
/// the gaps of a stream of 500 events/s or more, so the delivery path
/// stays awake while traffic flows.
pub const LATENCY_SPIN: Duration = Duration::from_millis(2);

/// Cores from which the default spin is [`LATENCY_SPIN`].
pub const SPARE_CORES: usize = 8;

/// Environment variable overriding the default spin, in microseconds.
pub const SPIN_ENV: &str = "STROM_SPIN_US";

/// The default [`ConsumerOptions::spin`]: `STROM_SPIN_US` if set, else
/// [`LATENCY_SPIN`] on a machine with [`SPARE_CORES`] or more, else
/// [`DEFAULT_SPIN`].
pub fn default_spin() -> Duration {
    if let Some(us) = std::env::var(SPIN_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return Duration::from_micros(us.min(1_000_000));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= SPARE_CORES {
        LATENCY_SPIN
    } else {
        DEFAULT_SPIN
    }
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            partitions: None,
            prefetch: 4096,
            prefetch_bytes: 256 << 20,
            start: StartPos::Committed,
            selector: Arc::new(Selection::All),
            broker: Arc::new(VecBroker),
            spin: default_spin(),
            read_on_pull: true,
        }
    }
}
