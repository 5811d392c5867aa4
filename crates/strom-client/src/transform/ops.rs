//! The built-in transform steps and what they do to one event: keep it or
//! drop it on a metadata predicate (`filter`), keep and rename metadata
//! fields (`project`, `rename`), and down-sample an array payload by a
//! stride per axis (`downsample`). `compress` and `decompress` change how
//! the output topic stores data parts, not the event; they are checked
//! against the output topic's compression when a transform starts.
//!
//! Pure computation on JSON values, descriptors and bytes, like
//! [`crate::select`], which it reuses for predicates and array layouts.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use strom_proto::Compression;

use crate::select::{field_pointer, ArrayLayout, AxisIndex, Predicate, Selector};

/// One step of a transform, as stored in its definition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Keep the events whose metadata matches `FIELD OP VALUE` (the `where`
    /// form of `strom consume --select`); drop the others.
    Filter { expr: String },
    /// Keep only these metadata fields; `a=b` keeps `a` under the name `b`.
    Project { fields: Vec<String> },
    /// Rename metadata fields (`a=b`), keeping every other field.
    Rename { fields: Vec<String> },
    /// Store the output's data parts compressed with this codec
    /// (`zstd:3`, `lz4`): the output topic must have that compression.
    Compress { codec: String },
    /// Store the output's data parts uncompressed: the output topic must
    /// have no compression (a compressed source is read uncompressed).
    Decompress,
    /// Keep every `stride`-th element along each axis of an array payload
    /// (numpy `a[::s0, ::s1, ...]`); events without an array descriptor
    /// pass unchanged.
    Downsample { strides: Vec<u64> },
}

/// A transform step that is not well formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad transform step: {0}")]
pub struct OpError(pub String);

/// A step ready to run.
#[derive(Clone, Debug)]
enum Step {
    Filter(Predicate),
    Project(Vec<(String, String)>),
    Rename(Vec<(String, String)>),
    Downsample(Vec<AxisIndex>),
}

/// An event on its way through the steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub metadata: Value,
    pub descriptor: Bytes,
    pub data: Bytes,
}

/// The compiled steps of one transform.
#[derive(Clone, Debug, Default)]
pub struct Pipeline {
    steps: Vec<Step>,
    /// What the output topic's compression must be, if a step says.
    compression: Option<Compression>,
}

fn pairs(fields: &[String]) -> Result<Vec<(String, String)>, OpError> {
    fields
        .iter()
        .map(|f| {
            let (from, to) = f.split_once('=').unwrap_or((f, f));
            let (from, to) = (from.trim(), to.trim());
            if from.is_empty() || to.is_empty() {
                return Err(OpError(format!(
                    "'{f}' names no field; use NAME or NAME=NEW"
                )));
            }
            Ok((from.to_string(), to.to_string()))
        })
        .collect()
}

fn predicate(expr: &str) -> Result<Predicate, OpError> {
    match expr.parse::<Selector>() {
        Ok(Selector::Where { predicate, then }) if *then == Selector::all() => Ok(predicate),
        Ok(_) => Err(OpError(format!(
            "filter '{expr}' is not a comparison FIELD OP VALUE"
        ))),
        Err(e) => Err(OpError(format!("filter: {e}"))),
    }
}

impl Pipeline {
    /// Checks and compiles `ops`.
    pub fn new(ops: &[Op]) -> Result<Pipeline, OpError> {
        let mut p = Pipeline::default();
        for op in ops {
            let step = match op {
                Op::Filter { expr } => Step::Filter(predicate(expr)?),
                Op::Project { fields } if fields.is_empty() => {
                    return Err(OpError("project names no field".into()))
                }
                Op::Project { fields } => Step::Project(pairs(fields)?),
                Op::Rename { fields } => Step::Rename(pairs(fields)?),
                Op::Downsample { strides } => {
                    if strides.is_empty() || strides.iter().any(|&s| s == 0 || s > i64::MAX as u64)
                    {
                        return Err(OpError(format!(
                            "downsample strides {strides:?}: give one positive stride per axis"
                        )));
                    }
                    let index = strides
                        .iter()
                        .map(|&s| AxisIndex::Slice {
                            start: None,
                            stop: None,
                            step: s as i64,
                        })
                        .collect();
                    Step::Downsample(index)
                }
                Op::Compress { codec } => {
                    let c = Compression::parse(codec).map_err(OpError)?;
                    if c.is_none() {
                        return Err(OpError(
                            "compress needs a codec: zstd[:L] or lz4[:L]".into(),
                        ));
                    }
                    p.set_compression(c)?;
                    continue;
                }
                Op::Decompress => {
                    p.set_compression(Compression::None)?;
                    continue;
                }
            };
            p.steps.push(step);
        }
        Ok(p)
    }

    fn set_compression(&mut self, c: Compression) -> Result<(), OpError> {
        match self.compression.replace(c) {
            Some(prev) if prev != c => Err(OpError(format!(
                "the steps ask for two compressions of the output ({prev} and {c})"
            ))),
            _ => Ok(()),
        }
    }

    /// The compression the output topic must have, if a step names one.
    pub fn compression(&self) -> Option<Compression> {
        self.compression
    }

    /// Whether a step reads or changes metadata (else it passes as stored).
    pub fn touches_metadata(&self) -> bool {
        self.steps.iter().any(|s| !matches!(s, Step::Downsample(_)))
    }

    /// Runs the steps on one event: `None` when a filter drops it.
    pub fn apply(&self, mut piece: Piece) -> Result<Option<Piece>, OpError> {
        for step in &self.steps {
            match step {
                Step::Filter(p) => {
                    if !p.matches(&piece.metadata) {
                        return Ok(None);
                    }
                }
                Step::Project(fields) => piece.metadata = project(&piece.metadata, fields),
                Step::Rename(fields) => rename(&mut piece.metadata, fields),
                Step::Downsample(index) => downsample(&mut piece, index)?,
            }
        }
        Ok(Some(piece))
    }
}

/// The fields named (top-level keys or JSON pointers), under their new
/// names; missing ones are left out.
fn project(meta: &Value, fields: &[(String, String)]) -> Value {
    let mut out = Map::new();
    for (from, to) in fields {
        if let Some(v) = meta.pointer(&field_pointer(from)) {
            out.insert(to.trim_start_matches('/').to_string(), v.clone());
        }
    }
    Value::Object(out)
}

fn rename(meta: &mut Value, fields: &[(String, String)]) {
    let Some(obj) = meta.as_object_mut() else {
        return;
    };
    for (from, to) in fields {
        if let Some(v) = obj.remove(from) {
            obj.insert(to.clone(), v);
        }
    }
}

fn downsample(piece: &mut Piece, index: &[AxisIndex]) -> Result<(), OpError> {
    let Some(layout) = ArrayLayout::parse(&piece.descriptor) else {
        return Ok(());
    };
    if layout.shape.len() != index.len() {
        return Err(OpError(format!(
            "downsample has {} strides but the array has {} axes (shape {:?})",
            index.len(),
            layout.shape.len(),
            layout.shape
        )));
    }
    if layout.nbytes() != Some(piece.data.len() as u64) {
        return Err(OpError(format!(
            "the array descriptor describes {:?} bytes but the data has {}",
            layout.nbytes(),
            piece.data.len()
        )));
    }
    let sub = layout
        .select(index)
        .map_err(|e| OpError(format!("downsample: {e}")))?;
    let total: u64 = sub.ranges.iter().map(|r| r.1).sum();
    let mut out = BytesMut::with_capacity(total as usize);
    for &(at, len) in &sub.ranges {
        // In bounds: the layout's size equals the data's, checked above.
        out.extend_from_slice(&piece.data[at as usize..(at + len) as usize]);
    }
    piece.data = out.freeze();
    piece.descriptor = Bytes::from(sub.layout.to_descriptor());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn piece(meta: Value) -> Piece {
        Piece {
            metadata: meta,
            descriptor: Bytes::new(),
            data: Bytes::from_static(b"xyz"),
        }
    }

    fn ops(v: Value) -> Vec<Op> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_filter_drops_what_does_not_match_and_projects_rename() {
        let p = Pipeline::new(&ops(json!([
            {"op": "filter", "expr": "t >= 10"},
            {"op": "project", "fields": ["t=time", "/pos/x=x", "missing"]},
            {"op": "rename", "fields": ["x=xpos"]},
        ])))
        .unwrap();
        assert!(p.touches_metadata());
        assert_eq!(p.apply(piece(json!({"t": 3}))).unwrap(), None);
        assert_eq!(p.apply(piece(json!({"u": 30}))).unwrap(), None);
        let out = p
            .apply(piece(json!({"t": 12, "pos": {"x": 1.5}, "junk": 1})))
            .unwrap()
            .unwrap();
        assert_eq!(out.metadata, json!({"time": 12, "xpos": 1.5}));
        assert_eq!(out.data, Bytes::from_static(b"xyz"));
    }

    #[test]
    fn downsample_keeps_every_strided_element_and_describes_the_result() {
        // 4x6 uint16 in C order, element (i, j) = 10 * i + j.
        let mut data = Vec::new();
        for i in 0..4u16 {
            for j in 0..6u16 {
                data.extend_from_slice(&(10 * i + j).to_le_bytes());
            }
        }
        let desc = br#"{"dtype":"<u2","shape":[4,6],"order":"C"}"#;
        let p = Pipeline::new(&ops(json!([{"op": "downsample", "strides": [2, 3]}]))).unwrap();
        assert!(!p.touches_metadata());
        let out = p
            .apply(Piece {
                metadata: json!({}),
                descriptor: Bytes::from_static(desc),
                data: Bytes::from(data),
            })
            .unwrap()
            .unwrap();
        let got: Vec<u16> = out
            .data
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, vec![0, 3, 20, 23]);
        let layout = ArrayLayout::parse(&out.descriptor).unwrap();
        assert_eq!(layout.shape, vec![2, 2]);
        // Data that is not an array passes; a wrong axis count is refused.
        assert!(p.apply(piece(json!({}))).unwrap().is_some());
        let p3 = Pipeline::new(&ops(json!([{"op": "downsample", "strides": [2, 2, 2]}]))).unwrap();
        let bad = Piece {
            metadata: json!({}),
            descriptor: Bytes::from_static(desc),
            data: Bytes::from(vec![0u8; 48]),
        };
        assert!(p3.apply(bad).unwrap_err().0.contains("3 strides"));
    }

    #[test]
    fn bad_steps_are_refused_with_a_reason() {
        let bad = |v: Value| Pipeline::new(&ops(v)).unwrap_err().0;
        assert!(bad(json!([{"op": "filter", "expr": "[0:2]"}])).contains("not a comparison"));
        assert!(bad(json!([{"op": "filter", "expr": "== 3"}])).contains("no field"));
        assert!(bad(json!([{"op": "project", "fields": []}])).contains("no field"));
        assert!(bad(json!([{"op": "project", "fields": ["=x"]}])).contains("no field"));
        assert!(bad(json!([{"op": "downsample", "strides": [0]}])).contains("positive"));
        assert!(bad(json!([{"op": "compress", "codec": "gzip"}])).contains("unknown"));
        assert!(bad(json!([{"op": "compress", "codec": "none"}])).contains("codec"));
        assert!(
            bad(json!([{"op": "compress", "codec": "lz4"}, {"op": "decompress"}]))
                .contains("two compressions")
        );
        let ok = Pipeline::new(&ops(json!([{"op": "compress", "codec": "zstd:5"}]))).unwrap();
        assert_eq!(ok.compression(), Some(Compression::Zstd(5)));
    }
}
