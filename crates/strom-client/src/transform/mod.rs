//! In-transit transforms: a stateless function from the events of one
//! topic to the events of another, run exactly once per source event
//! through restarts and failovers (docs/transforms.md).
//!
//! - [`ops`]: the built-in steps (filter, project, rename, compress,
//!   decompress, downsample) and their [`Pipeline`].
//! - [`defs`]: transform definitions, kept as events of the replicated
//!   topic [`DEFS_TOPIC`] so every member reads the same ones.
//! - [`worker`]: the exactly-once loop over one source partition, shared
//!   by the servers that run built-in transforms and by user-defined
//!   transforms run as clients ([`run_all`], Python's `strom.transform`).
//! - [`host`]: what a server runs: a worker for every source partition
//!   it leads, of every defined transform.

mod append;
pub mod defs;
pub mod host;
pub mod ops;
mod worker;

use bytes::Bytes;
use strom_policy::MetadataInput;

pub use append::RETRY_FOR;
pub use defs::{TransformSpec, DEFS_TOPIC};
pub use ops::{Op, OpError, Pipeline};
pub use worker::{run_all, FnTransformer, PartitionJob, Progress, MAX_UNCOMMITTED};

use crate::error::{Error, Result};
use crate::event::Event;

/// One event a transform writes.
#[derive(Clone, Debug)]
pub struct Out {
    /// Validated and encoded with the output topic's policy.
    pub metadata: MetadataInput,
    pub descriptor: Bytes,
    pub data: Bytes,
}

/// A transform: the events one source event becomes (none drops it). It
/// must be deterministic (the same event gives the same output on a rerun)
/// for exactly-once output; an error stops the partition's run.
pub trait Transformer: Send + Sync {
    fn apply(&self, event: Event) -> Result<Vec<Out>>;
}

/// The consumer name a transform reads its source as; its committed
/// offsets are the transform's progress (and its lag is in `strom status`).
pub fn consumer_name(transform: &str) -> String {
    format!("transform.{transform}")
}

/// The producer id stamped on the output of `transform`'s source
/// partition `partition`: fixed, so reruns carry the same stamps. The top
/// bit is set, out of the range the registry hands to producers.
pub fn producer_id(transform: &str, partition: u32) -> u64 {
    // FNV-1a: stable across builds and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in transform
        .as_bytes()
        .iter()
        .chain(&[0])
        .chain(&partition.to_le_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | (1 << 63)
}

/// A built-in transform: a [`Pipeline`] of steps.
pub struct Builtin {
    pipeline: Pipeline,
    /// Whether metadata can pass as stored (no step looks at it, and
    /// both topics store JSON).
    raw: bool,
}

impl Builtin {
    /// `raw_ok`: the source and output topics both use the JSON serializer.
    pub fn new(pipeline: Pipeline, raw_ok: bool) -> Self {
        let raw = raw_ok && !pipeline.touches_metadata();
        Builtin { pipeline, raw }
    }
}

impl Transformer for Builtin {
    fn apply(&self, ev: Event) -> Result<Vec<Out>> {
        let metadata = match self.raw {
            true => serde_json::Value::Null,
            false => ev.json()?,
        };
        let piece = ops::Piece {
            metadata,
            descriptor: ev.descriptor().clone(),
            data: Bytes::from(ev.data_vec()),
        };
        let out = self
            .pipeline
            .apply(piece)
            .map_err(|e| Error::coded(strom_proto::ErrorCode::INVALID_ARGUMENT, e.0))?;
        Ok(out
            .map(|p| Out {
                metadata: match self.raw {
                    true => worker::raw_metadata(&ev),
                    false => MetadataInput::Value(p.metadata),
                },
                descriptor: p.descriptor,
                data: p.data,
            })
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_ids_are_fixed_distinct_and_out_of_the_registrys_range() {
        let a = producer_id("clean", 0);
        assert_eq!(a, producer_id("clean", 0));
        assert_ne!(a, producer_id("clean", 1));
        assert_ne!(a, producer_id("clean2", 0));
        assert!(a >= 1 << 63);
        assert_eq!(consumer_name("clean"), "transform.clean");
    }
}
