//! The Strom side of the sink: one consumer per partition, each started
//! exactly at the offset PostgreSQL holds for it (or at the beginning of
//! the partition when it holds none), read in turn (a fair share of each
//! batch from each partition) without blocking on a quiet partition while
//! another has events.
//!
//! The partitions are those the topic has when the sink starts; a
//! partition added later is read by the next run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use strom_client::{Consumer, ConsumerOptions, ErrorCode, Event, Selection, StartPos, Topic};
use strom_proto::PartitionStatus;

/// One partition's consumer.
struct Part {
    id: u32,
    consumer: Consumer,
    ended: bool,
}

/// What one call to [`Source::next`] found.
pub enum Pulled {
    Events(Vec<Event>),
    /// Nothing arrived within the wait.
    Idle,
    /// Every partition delivered its end of stream.
    End,
}

pub struct Source {
    parts: Vec<Part>,
    /// Where the next blocking wait starts, so no partition is favoured.
    turn: usize,
    /// Where the next sweep of the partitions starts.
    sweep: usize,
    /// Gaps the client reported (retention, damage): warned and counted.
    pub gaps: u64,
}

impl Source {
    /// Subscribes every partition at its stored offset (`None`: from the
    /// beginning). Refuses a stored offset past a partition's end: the
    /// topic is then not the one the table was filled from.
    pub fn open(
        topic: &Topic,
        name: &str,
        stored: &BTreeMap<u32, u64>,
        prefetch: u32,
    ) -> anyhow::Result<Source> {
        let info = topic.describe()?;
        let mut parts = Vec::new();
        for p in &info.partitions {
            let start = match stored.get(&p.id) {
                Some(&n) => {
                    anyhow::ensure!(
                        p.status != PartitionStatus::Ok || n <= p.next_offset,
                        "the offsets table says partition {} of topic '{}' continues at {n}, \
                         but it ends at {}: was the topic deleted and created again?",
                        p.id,
                        topic.name(),
                        p.next_offset
                    );
                    StartPos::Offset(n)
                }
                None => StartPos::Beginning,
            };
            tracing::info!(partition = p.id, start = ?start, "subscribing");
            let opts = ConsumerOptions {
                partitions: Some(vec![p.id]),
                start,
                prefetch,
                selector: Arc::new(Selection::None),
                ..Default::default()
            };
            let consumer = topic.consumer_with(name, opts)?;
            parts.push(Part {
                id: p.id,
                consumer,
                ended: false,
            });
        }
        Ok(Source {
            parts,
            turn: 0,
            sweep: 0,
            gaps: 0,
        })
    }

    /// The partitions read.
    pub fn partitions(&self) -> Vec<u32> {
        self.parts.iter().map(|p| p.id).collect()
    }

    /// Takes up to `max` events from the partitions that have some; when
    /// none has, waits up to `wait` on one of them.
    pub fn next(&mut self, max: usize, wait: Duration) -> anyhow::Result<Pulled> {
        let mut out = Vec::new();
        let n = self.parts.len().max(1);
        // First a fair share from each partition, starting one further each
        // call, so a backlog in one never starves the others; then whatever
        // room is left, in the same order.
        self.sweep = (self.sweep + 1) % n;
        let share = max.div_ceil(n);
        for limit in [share, max] {
            for k in 0..self.parts.len() {
                if out.len() >= max {
                    break;
                }
                let take = limit.min(max - out.len());
                self.pull((self.sweep + k) % n, take, Duration::ZERO, &mut out)?;
            }
        }
        if !out.is_empty() {
            return Ok(Pulled::Events(out));
        }
        let open: Vec<usize> = (0..self.parts.len())
            .filter(|&i| !self.parts[i].ended)
            .collect();
        if open.is_empty() {
            return Ok(Pulled::End);
        }
        self.turn = (self.turn + 1) % open.len();
        self.pull(open[self.turn], max, wait, &mut out)?;
        Ok(if out.is_empty() {
            Pulled::Idle
        } else {
            Pulled::Events(out)
        })
    }

    fn pull(
        &mut self,
        i: usize,
        max: usize,
        wait: Duration,
        out: &mut Vec<Event>,
    ) -> anyhow::Result<()> {
        let part = &mut self.parts[i];
        if part.ended {
            return Ok(());
        }
        match part.consumer.pull_many(max, wait) {
            Ok(Some(evs)) => out.extend(evs),
            Ok(None) => {
                tracing::info!(partition = part.id, "end of stream");
                part.ended = true;
            }
            Err(e) if e.code() == ErrorCode::TIMEOUT => {}
            Err(e) if skippable(&e) => {
                // A gap Strom reports itself (dropped by retention or the
                // overflow policy, damaged on disk): nothing to write.
                self.gaps += 1;
                tracing::warn!(partition = part.id, error = %e.message(), "gap in the stream");
            }
            Err(e) if crate::consume::partition_unavailable(e.code()) => {
                // The client keeps retrying this partition.
                tracing::warn!(partition = part.id, error = %e.message(), "partition unavailable");
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("consuming partition {} failed", part.id)))
            }
        }
        Ok(())
    }
}

fn skippable(e: &strom_client::Error) -> bool {
    matches!(
        e,
        strom_client::Error::DataExpired { .. } | strom_client::Error::DataCorrupt { .. }
    ) || e.code() == ErrorCode::OFFSET_OUT_OF_RANGE
}
