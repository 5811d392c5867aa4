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
    /// `None` picks 256 KiB, or 4 MiB on `always` file topics, where every
    /// batch waits for an fdatasync and bigger batches amortize it.
    pub bytes: Option<u64>,
    /// The largest single event (metadata + descriptor + data + 16 bytes
    /// of table entry). `None`: as large as the partition's server accepts.
    pub max_event_bytes: Option<u64>,
}

/// The batch size on topics that do not sync every batch.
const AUTO_BYTES: u64 = 256 << 10;
/// The batch size on `always` file topics.
const AUTO_FSYNC_BYTES: u64 = 4 << 20;

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

    /// The batch size in bytes for a topic (`fsync_bound`: every batch
    /// waits for an fdatasync) served by servers with these limits.
    pub(crate) fn target(
        &self,
        fsync_bound: bool,
        servers: impl Iterator<Item = ServerLimits>,
    ) -> u64 {
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
            .unwrap_or(u64::MAX);
        self.bytes.unwrap_or(auto).clamp(1, server.max(1))
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
        let a = Batching::adaptive();
        assert_eq!(a.target(false, [roomy].into_iter()), AUTO_BYTES);
        assert_eq!(a.target(true, [roomy].into_iter()), AUTO_FSYNC_BYTES);
        // Room for the section's count word and producer stamp.
        assert_eq!(a.target(true, [roomy, tight].into_iter()), (1 << 20) - 16);
        assert_eq!(
            Batching::bytes(8192).target(true, [roomy].into_iter()),
            8192
        );
        let c = Batching::count(10).with_bytes(100 << 20);
        assert_eq!(c.target(false, [tight].into_iter()), (1 << 20) - 16);
        assert_eq!(c.target(false, std::iter::empty()), 100 << 20);
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
