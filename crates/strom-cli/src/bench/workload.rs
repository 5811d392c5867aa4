//! The workload every target runs: how events look, how events and
//! partitions are split among producer and consumer workers, pacing, and
//! latency percentiles. Target-independent and allocation-free per event.

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::{ConsumeJob, Outcome};

/// Metadata layout: `{"t":"<20 digits>","p":"<pad>"}`. The send timestamp
/// (µs since the epoch, 0 outside e2e) sits at a fixed offset so a consumer
/// reads it without parsing JSON, and the length is exactly `metadata_size`.
const PREFIX: &[u8] = b"{\"t\":\"";
const STAMP_AT: usize = PREFIX.len();
const STAMP_LEN: usize = 20;
const MIDDLE: &[u8] = b"\",\"p\":\"";
const SUFFIX: &[u8] = b"\"}";
/// Smallest metadata the layout fits in.
pub const MIN_METADATA: usize = PREFIX.len() + STAMP_LEN + MIDDLE.len() + SUFFIX.len();

/// What a data part holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PayloadKind {
    /// One repeated byte (0xA5): every codec squeezes it to almost nothing.
    Constant,
    /// Little-endian f32 values of a smooth, quantized field (a
    /// temperature-like grid: 300 K plus a slow wave in 1/64 K steps),
    /// which compresses like typical simulation output.
    Array,
    /// xorshift bytes: nothing to compress.
    Random,
}

impl PayloadKind {
    fn fill(self, n: usize) -> Vec<u8> {
        match self {
            PayloadKind::Constant => vec![0xA5u8; n],
            PayloadKind::Array => {
                let mut v: Vec<u8> = (0..n.div_ceil(4))
                    .flat_map(|i| {
                        let wave = ((i as f32) * 0.002).sin() * 8.0 + ((i % 512) as f32) / 64.0;
                        (300.0 + (wave * 64.0).round() / 64.0).to_le_bytes()
                    })
                    .collect();
                v.truncate(n);
                v
            }
            PayloadKind::Random => {
                let mut x = 0x2545_F491_4F6C_DD1Du64;
                (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            }
        }
    }
}

/// One event's bytes: a metadata template and a shared data part.
pub struct Payload {
    pub meta: Bytes,
    pub data: Bytes,
}

impl Payload {
    pub fn new(
        metadata_size: usize,
        data_size: usize,
        kind: PayloadKind,
    ) -> anyhow::Result<Payload> {
        if metadata_size < MIN_METADATA {
            anyhow::bail!(
                "--metadata-size must be at least {MIN_METADATA} bytes (room for the send timestamp)"
            );
        }
        let mut m = Vec::with_capacity(metadata_size);
        m.extend_from_slice(PREFIX);
        m.extend_from_slice(&[b'0'; STAMP_LEN]);
        m.extend_from_slice(MIDDLE);
        m.resize(metadata_size - SUFFIX.len(), b'x');
        m.extend_from_slice(SUFFIX);
        Ok(Payload {
            meta: Bytes::from(m),
            data: Bytes::from(kind.fill(data_size)),
        })
    }

    /// Metadata followed by data in one buffer: the record value for
    /// targets that have no separate data path (Kafka, Redis).
    #[cfg_attr(not(feature = "peers"), allow(dead_code))]
    pub fn joined(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.meta.len() + self.data.len());
        v.extend_from_slice(&self.meta);
        v.extend_from_slice(&self.data);
        v
    }
}

/// Writes `us` into the timestamp field of a metadata (or joined) buffer.
pub fn stamp(buf: &mut [u8], us: u64) {
    let mut v = us;
    for b in buf[STAMP_AT..STAMP_AT + STAMP_LEN].iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Reads the timestamp field back; `None` if the buffer is not ours.
pub fn read_stamp(buf: &[u8]) -> Option<u64> {
    let digits = buf.get(STAMP_AT..STAMP_AT + STAMP_LEN)?;
    digits.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit()
            .then(|| acc.wrapping_mul(10).wrapping_add(u64::from(d - b'0')))
    })
}

pub use strom_storage::now_us;

/// The `k`-th of `workers` equal shares of `n`.
pub fn share(n: u64, k: u64, workers: u64) -> u64 {
    n / workers + u64::from(k < n % workers)
}

/// Partitions worker `k` of `workers` owns: `p % workers == k`, or the one
/// partition `k % partitions` when there are more workers than partitions.
pub fn parts_of(k: u32, workers: u32, partitions: u32) -> Vec<u32> {
    if workers > partitions {
        vec![k % partitions]
    } else {
        (0..partitions).filter(|p| p % workers == k).collect()
    }
}

/// Events each partition receives when `events` are split over `producers`
/// workers, each writing round-robin over its own partitions.
pub fn per_partition(events: u64, producers: u32, partitions: u32) -> Vec<u64> {
    let mut out = vec![0u64; partitions as usize];
    for k in 0..producers {
        let n = share(events, k as u64, producers as u64);
        let parts = parts_of(k, producers, partitions);
        for (j, &p) in parts.iter().enumerate() {
            out[p as usize] += share(n, j as u64, parts.len() as u64);
        }
    }
    out
}

/// Sleeps until the `i`-th event is due at a fixed interval (no-op when unpaced).
pub struct Pacer {
    start: Instant,
    interval: Option<Duration>,
}

impl Pacer {
    pub fn new(interval: Option<Duration>) -> Pacer {
        Pacer {
            start: Instant::now(),
            interval,
        }
    }

    #[cfg_attr(not(feature = "peers"), allow(dead_code))]
    pub fn is_paced(&self) -> bool {
        self.interval.is_some()
    }

    pub fn wait(&self, i: u64) {
        if let Some(iv) = self.interval {
            let due = self.start + iv.mul_f64(i as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
    }
}

pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A consumer worker's bookkeeping, the same for every target: how many
/// events each of its partitions still owes, and what arrived.
pub struct Tally {
    left: Vec<u64>,
    remaining: u64,
    latency: bool,
    out: Outcome,
}

impl Tally {
    pub fn new(job: &ConsumeJob) -> Tally {
        Tally {
            remaining: job.expect.iter().sum(),
            left: job.expect.clone(),
            latency: job.latency,
            out: Outcome::default(),
        }
    }

    /// Events still expected.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Counts one event of partition slot `slot`, whose metadata starts at
    /// `stamped`. Events past a partition's quota are ignored; in a latency
    /// run an event without a send stamp uses up its quota but is not counted.
    pub fn record(&mut self, slot: usize, stamped: &[u8], bytes: u64, progress: &AtomicU64) {
        if self.left[slot] == 0 {
            return;
        }
        self.left[slot] -= 1;
        self.remaining -= 1;
        if self.latency {
            match read_stamp(stamped) {
                Some(t) if t > 0 => self.out.lats_us.push(now_us().saturating_sub(t)),
                _ => return,
            }
        }
        self.out.events += 1;
        self.out.bytes += bytes;
        progress.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finish(self) -> Outcome {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_has_the_requested_size_and_round_trips_the_stamp() {
        let p = Payload::new(256, 0, PayloadKind::Constant).unwrap();
        assert_eq!(p.meta.len(), 256);
        let mut m = p.meta.to_vec();
        stamp(&mut m, 1_700_000_000_123_456);
        assert_eq!(read_stamp(&m), Some(1_700_000_000_123_456));
        assert!(serde_json::from_slice::<serde_json::Value>(&m).is_ok());
        assert!(Payload::new(MIN_METADATA - 1, 0, PayloadKind::Constant).is_err());
        for kind in [
            PayloadKind::Constant,
            PayloadKind::Array,
            PayloadKind::Random,
        ] {
            assert_eq!(Payload::new(64, 1001, kind).unwrap().data.len(), 1001);
        }
    }

    #[test]
    fn split_covers_every_event_once() {
        for (events, producers, partitions) in [(10, 1, 1), (11, 3, 2), (7, 2, 4), (100, 4, 4)] {
            let per = per_partition(events, producers, partitions);
            assert_eq!(per.iter().sum::<u64>(), events);
        }
        assert_eq!(parts_of(1, 2, 4), vec![1, 3]);
        assert_eq!(parts_of(3, 4, 2), vec![1]);
    }
}
