//! How a producer batches, as one type: what sends a batch ([`Trigger`]),
//! how many bytes a batch of several events may hold, and the largest
//! single event. The effective batch size also respects the limits each
//! partition's server announced when the connection opened
//! (`max_batch_bytes`, `max_frame_bytes`).
//!
//! A single event larger than the batch size goes alone, as its own batch.
//! The largest single event is what the partition's server accepts, or
//! `max_event_bytes` if smaller; a larger event is refused by `push` with
//! `BATCH_TOO_LARGE`, naming the limit and the setting that raises it.

use crate::conn::ServerLimits;

/// What sends a partition's batch before it reaches the batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Send whatever is ready whenever an in-flight slot is free.
    Adaptive,
    /// Send once this many events are batched (or after `linger`).
    Count(u32),
    /// Send once the batch reaches its size in bytes (or after `linger`).
    Full,
}

/// Batching and the producer's size limits, in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    pub trigger: Trigger,
    /// Bytes (metadata + data) at which a batch is sent even if more
    /// events are ready, and the most a batch of several events holds.
    /// `None` picks 256 KiB of metadata (4 MiB on `always` file topics,
    /// where every batch waits for an fdatasync and bigger batches amortize
    /// it) and 4 MiB in all, so events with data parts travel several to a
    /// batch: each batch costs a round trip on both sides, and batches of
    /// one 64 KiB or 256 KiB event halved a stream's throughput.
    pub bytes: Option<u64>,
    /// The largest single event (metadata + descriptor + data + 16 bytes
    /// of table entry). `None`: as large as the partition's server accepts.
    pub max_event_bytes: Option<u64>,
}

/// The batch size on topics that do not sync every batch.
const AUTO_BYTES: u64 = 256 << 10;
/// The batch size on `always` file topics.
const AUTO_FSYNC_BYTES: u64 = 4 << 20;
/// The batch size, data parts included, when none is chosen.
const AUTO_TOTAL_BYTES: u64 = 4 << 20;

/// When a batch is sent even if its mode would keep filling it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchTarget {
    /// Bytes of metadata: event metadata, descriptors and table entries.
    pub meta: u64,
    /// Bytes in all, data parts included (at least `meta`).
    pub total: u64,
}

impl BatchTarget {
    /// Whether a batch holding `meta` and `total` bytes is full.
    pub fn reached(&self, meta: u64, total: u64) -> bool {
        meta >= self.meta || total >= self.total
    }

    /// Whether an event of `meta` and `total` bytes overflows a batch
    /// already holding `held_meta` and `held_total`.
    pub fn overflows(&self, held_meta: u64, held_total: u64, meta: u64, total: u64) -> bool {
        held_meta + meta > self.meta || held_total + total > self.total
    }
}

impl Batching {
    /// Sends whatever is ready whenever an in-flight slot frees up.
    pub fn adaptive() -> Self {
        Batching {
            trigger: Trigger::Adaptive,
            bytes: None,
            max_event_bytes: None,
        }
    }

    /// Sends batches of `events` events (or fewer after `linger`).
    pub fn count(events: u32) -> Self {
        Batching {
            trigger: Trigger::Count(events),
            ..Self::adaptive()
        }
    }

    /// Sends batches of `bytes` bytes (or less after `linger`).
    pub fn bytes(bytes: u64) -> Self {
        Batching {
            trigger: Trigger::Full,
            bytes: Some(bytes),
            max_event_bytes: None,
        }
    }

    /// The same, with batches of at most `bytes` bytes.
    pub fn with_bytes(self, bytes: u64) -> Self {
        Batching {
            bytes: Some(bytes),
            ..self
        }
    }

    /// The same, refusing events larger than `bytes`.
    pub fn with_max_event_bytes(self, bytes: u64) -> Self {
        Batching {
            max_event_bytes: Some(bytes),
            ..self
        }
    }

    /// The batch size for a topic (`fsync_bound`: every batch waits for an
    /// fdatasync) served by servers with these limits: the chosen size for
    /// both metadata and all bytes, or the automatic ones.
    pub(crate) fn target(
        &self,
        fsync_bound: bool,
        servers: impl Iterator<Item = ServerLimits>,
    ) -> BatchTarget {
        let auto = if fsync_bound {
            AUTO_FSYNC_BYTES
        } else {
            AUTO_BYTES
        };
        // A batch's events count toward it; its count word and producer
        // stamp (16 bytes) must fit beside them.
        let server = servers
            .map(|l| l.max_batch_bytes.min(l.max_frame_bytes).saturating_sub(16))
            .min()
            .unwrap_or(u64::MAX)
            .max(1);
        let (meta, total) = match self.bytes {
            Some(b) => (b, b),
            None => (auto, auto.max(AUTO_TOTAL_BYTES)),
        };
        BatchTarget {
            meta: meta.clamp(1, server),
            total: total.clamp(1, server),
        }
    }
}

impl Default for Batching {
    fn default() -> Self {
        Self::adaptive()
    }
}

/// The largest event a partition takes, and what sets that limit.
#[derive(Clone, Debug)]
pub(crate) struct EventLimit {
    pub bytes: u64,
    /// Which setting binds, and how to raise it.
    pub reason: String,
}

/// Frame bytes around a one-event batch: frame header after `frame_len`
/// (20), `Produce` body without the topic's text (12), batch count (4).
const FRAME_OVERHEAD: u64 = 36;

/// The largest event (as `push` counts it) that fits the producer's
/// option, the server's limits (if known) and this client's frame limit.
pub(crate) fn event_limit(
    opt: Option<u64>,
    server: Option<ServerLimits>,
    addr: &str,
    topic: &str,
) -> EventLimit {
    let frame_extra = FRAME_OVERHEAD + topic.len() as u64;
    let client_frame = u64::from(strom_proto::DEFAULT_MAX_FRAME);
    let mut limits = vec![(
        client_frame.saturating_sub(frame_extra),
        format!("this client's frame limit is {client_frame} bytes"),
    )];
    if let Some(n) = opt {
        limits.push((
            n,
            format!("the producer's max_event_bytes is {n}; raise it"),
        ));
    }
    if let Some(l) = server {
        limits.push((
            l.max_batch_bytes.saturating_sub(4),
            format!(
                "the server at {addr} has max_batch_bytes = {}; raise max_batch_bytes in its config file",
                l.max_batch_bytes
            ),
        ));
        limits.push((
            l.max_frame_bytes.saturating_sub(frame_extra),
            format!(
                "the server at {addr} has max_frame_bytes = {}; raise max_frame_bytes (and max_batch_bytes) in its config file",
                l.max_frame_bytes
            ),
        ));
    }
    let (bytes, reason) = limits
        .into_iter()
        .min_by_key(|l| l.0)
        .unwrap_or((u64::MAX, String::new()));
    EventLimit { bytes, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_size_is_the_chosen_or_automatic_one_within_the_servers_limits() {
        let roomy = ServerLimits {
            max_frame_bytes: 256 << 20,
            max_batch_bytes: 256 << 20,
        };
        let tight = ServerLimits {
            max_frame_bytes: 1 << 20,
            max_batch_bytes: 256 << 20,
        };
        let both = |b: u64| BatchTarget { meta: b, total: b };
        let a = Batching::adaptive();
        // Automatic: 256 KiB of metadata, 4 MiB with data parts.
        assert_eq!(
            a.target(false, [roomy].into_iter()),
            BatchTarget {
                meta: AUTO_BYTES,
                total: AUTO_TOTAL_BYTES
            }
        );
        assert_eq!(a.target(true, [roomy].into_iter()), both(AUTO_FSYNC_BYTES));
        // Room for the section's count word and producer stamp.
        assert_eq!(
            a.target(true, [roomy, tight].into_iter()),
            both((1 << 20) - 16)
        );
        assert_eq!(
            a.target(false, [roomy, tight].into_iter()),
            BatchTarget {
                meta: AUTO_BYTES,
                total: (1 << 20) - 16
            }
        );
        // A chosen size bounds metadata and data alike.
        assert_eq!(
            Batching::bytes(8192).target(true, [roomy].into_iter()),
            both(8192)
        );
        let c = Batching::count(10).with_bytes(100 << 20);
        assert_eq!(c.target(false, [tight].into_iter()), both((1 << 20) - 16));
        assert_eq!(c.target(false, std::iter::empty()), both(100 << 20));
    }

    #[test]
    fn a_batch_fills_by_metadata_or_by_all_its_bytes() {
        let t = BatchTarget {
            meta: 256 << 10,
            total: 4 << 20,
        };
        // Sixteen 256 KiB data parts with small metadata fit one batch ...
        assert!(!t.overflows(15 * 100, 15 * (256 << 10), 100, 256 << 10));
        assert!(t.overflows(16 * 100, 16 * (256 << 10), 100, 256 << 10));
        assert!(t.reached(16 * 100, 16 * (256 << 10)));
        // ... while metadata alone still closes it at 256 KiB.
        assert!(t.overflows(255 << 10, 255 << 10, 2048, 2048));
        assert!(t.reached(256 << 10, 256 << 10));
        assert!(!t.reached(100, 100));
    }

    #[test]
    fn the_smallest_limit_binds_and_is_named() {
        let server = ServerLimits {
            max_frame_bytes: 1 << 20,
            max_batch_bytes: 256 << 20,
        };
        let l = event_limit(None, Some(server), "h:1", "topic");
        assert_eq!(l.bytes, (1 << 20) - FRAME_OVERHEAD - 5);
        assert!(
            l.reason.contains("max_frame_bytes = 1048576"),
            "{}",
            l.reason
        );
        let l = event_limit(Some(1000), Some(server), "h:1", "topic");
        assert_eq!(l.bytes, 1000);
        assert!(l.reason.contains("max_event_bytes"), "{}", l.reason);
        let batch = ServerLimits {
            max_frame_bytes: 256 << 20,
            max_batch_bytes: 4096,
        };
        let l = event_limit(None, Some(batch), "h:1", "t");
        assert_eq!(l.bytes, 4092, "a one-event batch adds its 4-byte count");
        assert!(l.reason.contains("max_batch_bytes = 4096"), "{}", l.reason);
        let l = event_limit(None, None, "h:1", "t");
        assert_eq!(
            l.bytes,
            u64::from(strom_proto::DEFAULT_MAX_FRAME) - FRAME_OVERHEAD - 1
        );
    }
}
