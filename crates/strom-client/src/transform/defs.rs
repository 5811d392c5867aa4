//! Transform definitions. They are events of the topic [`DEFS_TOPIC`]
//! (one partition, replicated like the group allows): a definition is
//! `{"name": N, "spec": {...}}`, a deletion `{"name": N, "deleted": true}`,
//! and the last event of a name wins. Every member reads the same log, so
//! every member runs the same transforms, and the definitions survive
//! what the topic survives (docs/transforms.md).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use strom_proto::{BatchBuilder, Compression, ErrorCode, StartPos, TopicSpec};

use super::append::{append, OutBatch};
use super::ops::Pipeline;
use crate::consumer::ConsumerOptions;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::topic::Topic;

/// The topic that holds the definitions.
pub const DEFS_TOPIC: &str = "strom.transforms";
/// The consumer name definitions are read as (it never acks).
const READER: &str = "strom.transforms.reader";

/// What a transform is: where it reads, where it writes, and its steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformSpec {
    pub name: String,
    pub from: String,
    pub to: String,
    pub ops: Vec<super::Op>,
}

fn invalid(why: String) -> Error {
    Error::coded(ErrorCode::INVALID_ARGUMENT, why)
}

impl TransformSpec {
    /// Checks the name and steps (not the topics).
    pub fn check(&self) -> Result<Pipeline> {
        let ok = !self.name.is_empty()
            && self.name.len() <= 100
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return Err(invalid(format!(
                "invalid transform name '{}': use 1-100 characters from [A-Za-z0-9._-]",
                self.name
            )));
        }
        if self.from == self.to {
            return Err(invalid(format!(
                "transform '{}' would read and write topic '{}'",
                self.name, self.from
            )));
        }
        Pipeline::new(&self.ops).map_err(|e| invalid(e.to_string()))
    }
}

/// The definitions topic, created (replicated over up to 3 members) if
/// there is none.
fn defs_topic(d: &Driver) -> Result<Topic> {
    match d.open_topic(DEFS_TOPIC) {
        Ok(t) => return Ok(t),
        Err(e) if e.code() == ErrorCode::TOPIC_NOT_FOUND => {}
        Err(e) => return Err(e),
    }
    let live = d.members()?.iter().filter(|m| m.alive).count() as u32;
    let spec = TopicSpec {
        replication_factor: live.clamp(1, 3),
        ..TopicSpec::new(DEFS_TOPIC, 1)
    };
    match d.create_topic(spec) {
        Err(e) if e.code() == ErrorCode::TOPIC_EXISTS => d.open_topic(DEFS_TOPIC),
        r => r,
    }
}

/// Appends one record. Not through a registered producer: the topic's
/// stream must never end, as it would once its producers closed or their
/// leases ran out. A record appended twice by a retry is harmless (the
/// last record of a name wins).
fn record(d: &Driver, v: Value) -> Result<()> {
    let t = defs_topic(d)?;
    let (_, meta) = t.policy()?.prepare(v.into(), Some(0), 1)?;
    let mut b = BatchBuilder::new();
    b.push(&meta, &[], 0);
    let batch = OutBatch {
        count: 1,
        meta: b.finish(),
        data: Vec::new(),
    };
    d.block_on(async move { append(&t, 0, Compression::None, batch).await })?;
    Ok(())
}

/// Records a new transform after checking it and both its topics (the
/// output's compression must be what a compress or decompress step asks).
pub fn create(d: &Driver, spec: &TransformSpec) -> Result<()> {
    let pipeline = spec.check()?;
    if list(d)?.contains_key(&spec.name) {
        return Err(invalid(format!(
            "a transform named '{}' exists; delete it first",
            spec.name
        )));
    }
    d.describe(&spec.from)?;
    let out = d.describe(&spec.to)?;
    if let Some(c) = pipeline.compression() {
        let has = strom_proto::Compression::parse(&out.spec.compression).unwrap_or_default();
        if has != c {
            return Err(invalid(format!(
                "the steps store the output with compression {c}, but topic '{}' has {}; \
                 create it with --compression {c}",
                spec.to, out.spec.compression
            )));
        }
    }
    record(d, json!({ "name": spec.name, "spec": spec }))
}

/// Records that `name` is gone (its workers stop within a second; its
/// consumer name keeps its offsets).
pub fn delete(d: &Driver, name: &str) -> Result<()> {
    if !list(d)?.contains_key(name) {
        return Err(invalid(format!("no transform named '{name}'")));
    }
    record(d, json!({ "name": name, "deleted": true }))
}

/// Every defined transform, by name (none if the topic does not exist).
pub fn list(d: &Driver) -> Result<BTreeMap<String, TransformSpec>> {
    let t = match d.open_topic(DEFS_TOPIC) {
        Ok(t) => t,
        Err(e) if e.code() == ErrorCode::TOPIC_NOT_FOUND => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    read(&t)
}

fn read(t: &Topic) -> Result<BTreeMap<String, TransformSpec>> {
    let end = t
        .describe()?
        .partitions
        .first()
        .map_or(0, |p| p.next_offset);
    let mut defs = BTreeMap::new();
    if end == 0 {
        return Ok(defs);
    }
    let opts = ConsumerOptions {
        partitions: Some(vec![0]),
        start: StartPos::Beginning,
        ..ConsumerOptions::default()
    };
    let c = t.consumer_with(READER, opts)?;
    let mut next = 0;
    while next < end {
        let Some(events) = c.pull_many(1024, Duration::from_secs(10))? else {
            break;
        };
        if events.is_empty() {
            return Err(Error::coded(
                ErrorCode::TIMEOUT,
                format!("reading the transform definitions stopped at {next} of {end}"),
            ));
        }
        for ev in events {
            next = ev.offset + 1;
            apply(&mut defs, ev.json()?);
        }
    }
    Ok(defs)
}

fn apply(defs: &mut BTreeMap<String, TransformSpec>, v: Value) {
    let Some(name) = v.get("name").and_then(Value::as_str) else {
        return;
    };
    if v.get("deleted").and_then(Value::as_bool) == Some(true) {
        defs.remove(name);
    } else if let Some(spec) = v
        .get("spec")
        .and_then(|s| serde_json::from_value::<TransformSpec>(s.clone()).ok())
    {
        defs.insert(name.to_string(), spec);
    } else {
        tracing::warn!(
            name,
            "a transform definition that does not parse was skipped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_record_of_a_name_wins_and_bad_ones_are_skipped() {
        let spec = |to: &str| TransformSpec {
            name: "a".into(),
            from: "x".into(),
            to: to.into(),
            ops: vec![super::super::Op::Decompress],
        };
        let mut defs = BTreeMap::new();
        apply(&mut defs, json!({"name": "a", "spec": spec("y")}));
        apply(&mut defs, json!({"name": "b", "spec": {"junk": 1}}));
        apply(&mut defs, json!({"nothing": 1}));
        assert_eq!(defs.len(), 1);
        apply(&mut defs, json!({"name": "a", "spec": spec("z")}));
        assert_eq!(defs["a"].to, "z");
        apply(&mut defs, json!({"name": "a", "deleted": true}));
        assert!(defs.is_empty());
    }

    #[test]
    fn names_and_loops_are_checked() {
        let mut s = TransformSpec {
            name: "ok-1".into(),
            from: "x".into(),
            to: "y".into(),
            ops: vec![],
        };
        assert!(s.check().is_ok());
        s.name = "bad name".into();
        assert!(s
            .check()
            .unwrap_err()
            .to_string()
            .contains("invalid transform name"));
        s.name = "ok".into();
        s.to = "x".into();
        assert!(s
            .check()
            .unwrap_err()
            .to_string()
            .contains("read and write"));
    }
}
