//! Transform definitions. They are events of the topic [`DEFS_TOPIC`]
//! (one partition, replicated like the group allows): a definition is
//! `{"name": N, "spec": {...}}`, a deletion `{"name": N, "deleted": true}`,
//! and the last event of a name wins. Every member reads the same log, so
//! every member runs the same transforms, and the definitions survive
//! what the topic survives (docs/transforms.md).
//!
//! Transforms never form a cycle (`x -> y` and `y -> x`, or longer): each
//! event would be transformed again forever. [`create`] refuses one, and
//! servers skip any cycle that reaches the log anyway ([`cyclic`]). A
//! server keeps one [`Defs`] reader, which reads only what was appended
//! since its last poll.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use strom_proto::{BatchBuilder, Compression, ErrorCode, StartPos, TopicSpec};

use super::append::{append, OutBatch};
use super::ops::Pipeline;
use crate::consumer::{Consumer, ConsumerOptions};
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
                "transform '{}' would read and write topic '{}': a cycle (every output \
                 event would be transformed again); write to another topic",
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
    let defs = list(d)?;
    if defs.contains_key(&spec.name) {
        return Err(invalid(format!(
            "a transform named '{}' exists; delete it first",
            spec.name
        )));
    }
    if let Some(cycle) = cycle_with(&defs, spec) {
        return Err(invalid(format!(
            "transform '{}' would close a cycle: {}; every event would be transformed \
             again forever, so a transform's output must never lead back to its source",
            spec.name,
            describe_cycle(&cycle)
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

/// Every defined transform, by name (none if the topic does not exist),
/// read from the beginning (a one-off; a server keeps a [`Defs`]).
pub fn list(d: &Driver) -> Result<BTreeMap<String, TransformSpec>> {
    let mut defs = Defs::default();
    defs.refresh(d)?;
    Ok(defs.defs)
}

/// The definitions as one reader keeps them: each [`Defs::refresh`] reads
/// the definitions topic on from where the last one stopped, with one
/// consumer kept between polls, so a poll costs what was appended since.
#[derive(Default)]
pub struct Defs {
    consumer: Option<Consumer>,
    /// The next offset to read.
    next: u64,
    defs: BTreeMap<String, TransformSpec>,
    /// Records read since this reader was made.
    read: u64,
}

impl Defs {
    /// Reads what was appended since the last call; returns every
    /// definition. On an error the reader starts again, later, where it
    /// stopped.
    pub fn refresh(&mut self, d: &Driver) -> Result<&BTreeMap<String, TransformSpec>> {
        let t = match d.open_topic(DEFS_TOPIC) {
            Ok(t) => t,
            Err(e) if e.code() == ErrorCode::TOPIC_NOT_FOUND => {
                self.reset();
                return Ok(&self.defs);
            }
            Err(e) => return Err(e),
        };
        let end = t
            .describe()?
            .partitions
            .first()
            .map_or(0, |p| p.next_offset);
        if end < self.next {
            // The topic was deleted and made again: read the new one.
            self.reset();
        }
        if end == self.next {
            return Ok(&self.defs);
        }
        let r = self.read_to(&t, end);
        if r.is_err() {
            self.consumer = None; // a new one resumes at `next`
        }
        r?;
        Ok(&self.defs)
    }

    fn reset(&mut self) {
        self.consumer = None;
        self.next = 0;
        self.defs.clear();
    }

    fn read_to(&mut self, t: &Topic, end: u64) -> Result<()> {
        if self.consumer.is_none() {
            let opts = ConsumerOptions {
                partitions: Some(vec![0]),
                start: StartPos::Offset(self.next),
                ..ConsumerOptions::default()
            };
            self.consumer = Some(t.consumer_with(READER, opts)?);
        }
        let Some(c) = &self.consumer else {
            return Ok(());
        };
        while self.next < end {
            let Some(events) = c.pull_many(1024, Duration::from_secs(10))? else {
                break;
            };
            if events.is_empty() {
                return Err(Error::coded(
                    ErrorCode::TIMEOUT,
                    format!(
                        "reading the transform definitions stopped at {} of {end}",
                        self.next
                    ),
                ));
            }
            for ev in events {
                if ev.offset < self.next {
                    continue; // already applied
                }
                self.next = ev.offset + 1;
                self.read += 1;
                apply(&mut self.defs, ev.json()?);
            }
        }
        Ok(())
    }

    /// Every definition as of the last refresh.
    pub fn get(&self) -> &BTreeMap<String, TransformSpec> {
        &self.defs
    }

    /// The offset the next refresh reads from.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// How many definition records this reader has read in all.
    pub fn records_read(&self) -> u64 {
        self.read
    }
}

/// The transforms, in order, of the cycle that adding `spec` to `defs`
/// would close (`spec` last), if any.
pub fn cycle_with<'a>(
    defs: &'a BTreeMap<String, TransformSpec>,
    spec: &'a TransformSpec,
) -> Option<Vec<&'a TransformSpec>> {
    if spec.from == spec.to {
        return Some(vec![spec]);
    }
    let others: Vec<&TransformSpec> = defs.values().filter(|d| d.name != spec.name).collect();
    let mut path = path_between(&others, &spec.to, &spec.from)?;
    path.push(spec);
    Some(path)
}

/// A shortest chain of `edges` leading from topic `from` to topic `to`.
fn path_between<'a>(
    edges: &[&'a TransformSpec],
    from: &str,
    to: &str,
) -> Option<Vec<&'a TransformSpec>> {
    // Breadth first over topics; `came` holds the transform that reached
    // each topic first.
    let mut came: BTreeMap<&str, &TransformSpec> = BTreeMap::new();
    let mut seen: BTreeSet<&str> = BTreeSet::from([from]);
    let mut frontier = vec![from];
    while !frontier.is_empty() && !seen.contains(to) {
        let mut next = Vec::new();
        for topic in frontier {
            for e in edges.iter().filter(|e| e.from == topic) {
                if seen.insert(e.to.as_str()) {
                    came.insert(e.to.as_str(), e);
                    next.push(e.to.as_str());
                }
            }
        }
        frontier = next;
    }
    let mut path = Vec::new();
    let mut at = to;
    while at != from {
        let e = *came.get(at)?;
        path.push(e);
        at = e.from.as_str();
    }
    path.reverse();
    Some(path)
}

/// `x -> y (a), y -> x (b)`.
fn describe_cycle(cycle: &[&TransformSpec]) -> String {
    cycle
        .iter()
        .map(|s| format!("{} -> {} ({})", s.from, s.to, s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names of the transforms that lie on a cycle of `defs` (which
/// [`create`] refuses, but concurrent creates or an old log may hold):
/// servers do not run them.
pub fn cyclic(defs: &BTreeMap<String, TransformSpec>) -> BTreeSet<String> {
    let all: Vec<&TransformSpec> = defs.values().collect();
    defs.values()
        .filter(|s| s.from == s.to || path_between(&all, &s.to, &s.from).is_some())
        .map(|s| s.name.clone())
        .collect()
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

    fn t(name: &str, from: &str, to: &str) -> TransformSpec {
        TransformSpec {
            name: name.into(),
            from: from.into(),
            to: to.into(),
            ops: vec![],
        }
    }

    #[test]
    fn cycles_are_found_with_every_transform_on_them() {
        let mut defs = BTreeMap::new();
        for s in [t("a", "x", "y"), t("b", "y", "z"), t("c", "z", "w")] {
            defs.insert(s.name.clone(), s);
        }
        assert!(cyclic(&defs).is_empty());
        assert!(cycle_with(&defs, &t("d", "w", "v")).is_none());
        let closing = t("d", "w", "x");
        let cycle = cycle_with(&defs, &closing).expect("w -> x closes x -> y -> z -> w");
        assert_eq!(
            describe_cycle(&cycle),
            "x -> y (a), y -> z (b), z -> w (c), w -> x (d)"
        );
        let two = t("e", "y", "x");
        assert_eq!(
            describe_cycle(&cycle_with(&defs, &two).unwrap()),
            "x -> y (a), y -> x (e)"
        );
        assert_eq!(cycle_with(&defs, &t("f", "q", "q")).unwrap().len(), 1);
        // Redefining a name replaces it: its old edge is not counted.
        assert!(cycle_with(&defs, &t("a", "z", "x")).is_none());
        assert!(cycle_with(&defs, &t("c", "w", "x")).is_none());
        defs.insert("d".into(), closing);
        defs.insert("g".into(), t("g", "x", "elsewhere"));
        let on: Vec<String> = cyclic(&defs).into_iter().collect();
        assert_eq!(on, ["a", "b", "c", "d"]);
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
