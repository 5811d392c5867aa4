//! `--format hdf5`: each partition's array events in `pN/events.h5`
//! (docs/hdf5.md), next to the usual `events.jsonl` index.
//!
//! - `per-event` (default): `/events/<offset>` per array event, its
//!   metadata as attributes (`strom_*` plus one per top-level key).
//! - `append`: every event is one row of `/data`, of shape
//!   `(N, *shape)`; every event must have the first event's dtype and shape.
//! - `concat`: events are concatenated along their own axis 0 into `/data`
//!   of shape `(rows, *trailing)`; every event must have the first event's
//!   dtype and trailing shape.
//!
//! With `append` and `concat`, `/index` is a table with a row per event
//! in `/data` (offset, timestamp, its rows, metadata as JSON text). An
//! event that does not fit is an error naming it, unless `--hdf5-fallback`:
//! then its array goes to `/events/<offset>` as in `per-event`. Data that
//! is not an array HDF5 can hold goes to `data.bin` as in `npy`, with a
//! note; events without data have none.

use serde_json::Value;

/// How array events are laid out in `events.h5` (`--hdf5-layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// One dataset per event, metadata as its attributes.
    #[default]
    PerEvent,
    /// One row of `/data` per event (every event the same dtype and shape).
    Append,
    /// Events concatenated along their axis 0 into `/data`.
    Concat,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::PerEvent => "per-event",
            Layout::Append => "append",
            Layout::Concat => "concat",
        }
    }
}

/// The HDF5 options of a stage-out. (Without the `hdf5` feature they are
/// checked, then refused before any writer reads them.)
#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub topic: String,
    pub layout: Layout,
    /// gzip level (0-9), or none.
    pub gzip: Option<u8>,
    /// Events that do not fit `/data` get their own dataset.
    pub fallback: bool,
}

/// Parses `--compress`: `none`, `gzip` (level 4, h5py's default) or `gzip:N`.
pub fn parse_compress(s: &str) -> anyhow::Result<Option<u8>> {
    match s {
        "none" => Ok(None),
        "gzip" => Ok(Some(4)),
        _ => match s.strip_prefix("gzip:").map(str::parse::<u8>) {
            Some(Ok(n)) if n <= 9 => Ok(Some(n)),
            _ => anyhow::bail!("--compress takes none, gzip or gzip:0..9, not '{s}'"),
        },
    }
}

/// The file's name in each partition directory.
pub const FILE: &str = "events.h5";

/// Where an event's data went. (Only the HDF5 writer, which needs the
/// `hdf5` feature, makes one.)
#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
pub enum Placed {
    /// In `events.h5`: the index line's `data`.
    Hdf5(Value),
    /// Not an array HDF5 holds: raw bytes in `data.bin`, with this note.
    Raw(String),
    /// No data.
    None,
}

/// The elements of an array stored in Fortran order, in C order. `data`
/// holds exactly the array (checked by the caller against the shape).
/// Pure, so its unit test runs in every build; only the HDF5 writer calls it.
#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
pub fn f_to_c(data: &[u8], shape: &[u64], itemsize: usize) -> Vec<u8> {
    let dims: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
    let n: usize = dims.iter().product();
    if dims.len() < 2 || n == 0 || itemsize == 0 {
        return data.to_vec();
    }
    let mut stride = vec![1usize; dims.len()];
    for k in 1..dims.len() {
        stride[k] = stride[k - 1] * dims[k - 1];
    }
    let mut out = Vec::with_capacity(data.len());
    let mut idx = vec![0usize; dims.len()];
    let mut f = 0usize;
    for _ in 0..n {
        out.extend_from_slice(&data[f * itemsize..(f + 1) * itemsize]);
        // The C odometer: the last axis moves fastest.
        for k in (0..dims.len()).rev() {
            idx[k] += 1;
            f += stride[k];
            if idx[k] < dims[k] {
                break;
            }
            f -= stride[k] * dims[k];
            idx[k] = 0;
        }
    }
    out
}

#[cfg(feature = "hdf5")]
pub use imp::H5Part;

#[cfg(not(feature = "hdf5"))]
pub use stub::H5Part;

#[cfg(not(feature = "hdf5"))]
mod stub {
    use super::*;
    use crate::stage_out::partition::Record;

    /// Without the `hdf5` feature: refuses to start.
    pub struct H5Part;

    impl H5Part {
        pub fn create(_dir: &std::path::Path, _id: u32, _o: &Options) -> anyhow::Result<H5Part> {
            anyhow::bail!(crate::stage_out::NO_HDF5)
        }
        pub fn write(&mut self, _r: &Record<'_>) -> anyhow::Result<Placed> {
            anyhow::bail!(crate::stage_out::NO_HDF5)
        }
        pub fn datasets(&self) -> u64 {
            0
        }
        pub fn finish(self) -> anyhow::Result<std::path::PathBuf> {
            anyhow::bail!(crate::stage_out::NO_HDF5)
        }
    }
}

#[cfg(feature = "hdf5")]
mod imp {
    use std::path::{Path, PathBuf};
    use std::str::FromStr;

    use anyhow::Context;
    use hdf5_metno::types::VarLenUnicode;
    use serde_json::json;
    use strom_client::select::{ArrayLayout, Order};

    use super::*;
    use crate::h5::dtype::Dtype;
    use crate::h5::write::{set_attrs, Appendable, AttrValue, H5Out, IndexRow, Table};
    use crate::stage_out::partition::{hex, Record};

    /// `/data` once the first event fixed its dtype and row shape.
    struct Rows {
        app: Appendable,
        dtype: Dtype,
        /// `append`: the whole event shape; `concat`: its trailing shape.
        shape: Vec<u64>,
        table: Table,
    }

    /// One partition's `events.h5`.
    pub struct H5Part {
        out: H5Out,
        path: PathBuf,
        id: u32,
        o: Options,
        events: Option<hdf5_metno::Group>,
        rows: Option<Rows>,
        datasets: u64,
    }

    /// An array event as HDF5 takes it: dtype, shape, C-order bytes.
    struct Array {
        dtype: Dtype,
        shape: Vec<u64>,
        bytes: Vec<u8>,
    }

    /// The event's array, or why it is not one HDF5 holds.
    fn array(r: &Record<'_>) -> Result<Array, String> {
        let Some(l) = ArrayLayout::parse(r.descriptor) else {
            return Err("no array descriptor (dtype, shape, order): raw bytes".into());
        };
        if l.nbytes() != Some(r.data_len) {
            return Err(format!(
                "the array descriptor describes {} bytes but the data has {}: raw bytes",
                l.nbytes().map_or("too many".into(), |n| n.to_string()),
                r.data_len
            ));
        }
        let dtype = Dtype::parse_numpy(&l.dtype).map_err(|e| format!("{e}: raw bytes"))?;
        let joined = r.data.concat();
        let bytes = match l.order {
            Order::C => joined,
            Order::F => f_to_c(&joined, &l.shape, dtype.itemsize() as usize),
        };
        Ok(Array {
            dtype,
            shape: l.shape,
            bytes,
        })
    }

    /// The metadata as text: JSON when it is, else hex.
    fn meta_text(r: &Record<'_>) -> (String, bool) {
        match std::str::from_utf8(r.raw_meta)
            .ok()
            .filter(|s| r.json_serializer && serde_json::from_str::<Value>(s).is_ok())
        {
            Some(s) => (s.to_string(), false),
            None => (hex(r.raw_meta), true),
        }
    }

    /// A metadata key that can be an attribute of its own.
    fn plain_key(k: &str) -> bool {
        !k.is_empty() && k != "." && !k.starts_with("strom_") && !k.contains('\0')
    }

    fn attr_value(v: &Value) -> AttrValue {
        match v {
            Value::String(s) if !s.contains('\0') => AttrValue::Str(s.clone()),
            Value::Bool(b) => AttrValue::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => AttrValue::I64(i),
                (None, Some(u), _) => AttrValue::U64(u),
                (None, None, Some(f)) => AttrValue::F64(f),
                _ => AttrValue::Str(n.to_string()),
            },
            other => AttrValue::Str(other.to_string()),
        }
    }

    /// A per-event dataset's attributes: `strom_*`, then one per
    /// top-level metadata key.
    fn attrs(id: u32, r: &Record<'_>) -> Vec<(String, AttrValue)> {
        let (text, is_hex) = meta_text(r);
        let mut v = vec![
            ("strom_partition".to_string(), AttrValue::U64(id.into())),
            ("strom_offset".to_string(), AttrValue::U64(r.offset)),
            (
                "strom_timestamp_us".to_string(),
                AttrValue::U64(r.timestamp_us),
            ),
            ("strom_metadata".to_string(), AttrValue::Str(text.clone())),
            (
                "strom_metadata_encoding".to_string(),
                AttrValue::Str(if is_hex { "hex" } else { "json" }.into()),
            ),
        ];
        let parsed = match (&r.decoded, is_hex) {
            (Some(d), _) => Some(d.clone()),
            (None, false) => serde_json::from_str::<Value>(&text).ok(),
            (None, true) => None,
        };
        if let Some(Value::Object(m)) = parsed {
            for (k, val) in m.iter().filter(|(k, _)| plain_key(k)) {
                v.push((k.clone(), attr_value(val)));
            }
        }
        v
    }

    impl H5Part {
        pub fn create(dir: &Path, id: u32, o: &Options) -> anyhow::Result<H5Part> {
            let path = dir.join(FILE);
            let out = H5Out::create(&path, o.gzip)?;
            set_attrs(
                out.root(),
                &[
                    ("strom_topic".into(), AttrValue::Str(o.topic.clone())),
                    ("strom_partition".into(), AttrValue::U64(id.into())),
                    (
                        "strom_layout".into(),
                        AttrValue::Str(o.layout.as_str().into()),
                    ),
                    ("strom_format_version".into(), AttrValue::U64(1)),
                ],
            )?;
            Ok(H5Part {
                out,
                path,
                id,
                o: o.clone(),
                events: None,
                rows: None,
                datasets: 0,
            })
        }

        /// Datasets written so far (`/data` and `/index` count once each).
        pub fn datasets(&self) -> u64 {
            self.datasets
        }

        /// Writes one event's data; says where it went.
        pub fn write(&mut self, r: &Record<'_>) -> anyhow::Result<Placed> {
            let a = match array(r) {
                Ok(a) => a,
                Err(_) if r.data_len == 0 => return Ok(Placed::None),
                Err(note) if self.o.layout == Layout::PerEvent || self.o.fallback => {
                    return Ok(Placed::Raw(note))
                }
                Err(note) => anyhow::bail!(
                    "event {}/{}: cannot be appended to /data ({note}); --hdf5-fallback writes \
                     such events elsewhere",
                    self.id,
                    r.offset
                ),
            };
            if self.o.layout == Layout::PerEvent {
                return self.per_event(r, &a).map(Placed::Hdf5);
            }
            match self.append(r, &a)? {
                Ok(v) => Ok(Placed::Hdf5(v)),
                Err(why) if self.o.fallback => {
                    tracing::debug!(partition = self.id, offset = r.offset, %why, "own dataset");
                    self.per_event(r, &a).map(Placed::Hdf5)
                }
                Err(why) => anyhow::bail!(
                    "event {}/{}: cannot be appended to /data: {why}; --hdf5-fallback writes \
                     such events to their own datasets",
                    self.id,
                    r.offset
                ),
            }
        }

        fn per_event(&mut self, r: &Record<'_>, a: &Array) -> anyhow::Result<Value> {
            if self.events.is_none() {
                self.events = Some(self.out.group("events")?);
            }
            let name = format!("/events/{:012}", r.offset);
            let ds = self.out.array(&name, &a.dtype, &a.shape, &a.bytes)?;
            set_attrs(&ds, &attrs(self.id, r)).with_context(|| format!("attributes of {name}"))?;
            self.datasets += 1;
            Ok(json!({"file": FILE, "format": "hdf5", "dataset": name}))
        }

        /// Appends to `/data`: `Ok(Err(why))` when the event does not fit.
        fn append(&mut self, r: &Record<'_>, a: &Array) -> anyhow::Result<Result<Value, String>> {
            let (rows, shape) = match self.o.layout {
                Layout::Concat => match a.shape.split_first() {
                    Some((n, rest)) => (*n, rest.to_vec()),
                    None => return Ok(Err("a 0-d array has no axis 0 to concatenate".into())),
                },
                _ => (1, a.shape.clone()),
            };
            if self.rows.is_none() {
                let app = match self.out.appendable("/data", &a.dtype, &shape) {
                    Ok(app) => app,
                    Err(crate::h5::Hdf5Error::Refused(why)) => return Ok(Err(why)),
                    Err(e) => return Err(e.into()),
                };
                let table = self.out.table("/index")?;
                self.datasets += 2;
                self.rows = Some(Rows {
                    app,
                    dtype: a.dtype,
                    shape: shape.clone(),
                    table,
                });
            }
            let Some(s) = self.rows.as_mut() else {
                anyhow::bail!("internal: /data is not open");
            };
            if a.dtype != s.dtype || shape != s.shape {
                let what = if self.o.layout == Layout::Concat {
                    "trailing shape"
                } else {
                    "shape"
                };
                return Ok(Err(format!(
                    "its dtype {} and {what} {shape:?} differ from the first event's, {} and {:?}",
                    a.dtype.numpy(),
                    s.dtype.numpy(),
                    s.shape
                )));
            }
            let start = s.app.rows;
            s.app.append(rows, &a.bytes)?;
            let (text, is_hex) = meta_text(r);
            // meta_text is JSON text or hex: never a NUL byte.
            let metadata = VarLenUnicode::from_str(&text).map_err(|_| {
                anyhow::anyhow!("event {}/{}: metadata with a NUL", self.id, r.offset)
            })?;
            s.table.push(IndexRow {
                offset: r.offset,
                timestamp_us: r.timestamp_us,
                row_start: start,
                rows,
                metadata,
                metadata_hex: is_hex,
            })?;
            Ok(Ok(json!({
                "file": FILE, "format": "hdf5", "dataset": "/data", "rows": [start, start + rows],
            })))
        }

        /// Writes what is pending and closes the file (fsynced by the caller).
        pub fn finish(mut self) -> anyhow::Result<PathBuf> {
            if let Some(s) = self.rows.as_mut() {
                s.table.flush()?;
            }
            drop(self.rows.take());
            drop(self.events.take());
            self.out
                .close()
                .with_context(|| format!("writing {}", self.path.display()))?;
            Ok(self.path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fortran_order_becomes_c_order() {
        // A 2x3 array [[0, 1, 2], [3, 4, 5]] stored column-major.
        let f = [0u8, 3, 1, 4, 2, 5];
        assert_eq!(f_to_c(&f, &[2, 3], 1), vec![0, 1, 2, 3, 4, 5]);
        // 2-byte elements, 3x2: [[a, b], [c, d], [e, f]] column-major is a c e b d f.
        let f = [1, 0, 3, 0, 5, 0, 2, 0, 4, 0, 6, 0];
        assert_eq!(
            f_to_c(&f, &[3, 2], 2),
            vec![1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0]
        );
        // 1-d and 0-d arrays are the same in both orders.
        assert_eq!(f_to_c(&[1, 2, 3], &[3], 1), vec![1, 2, 3]);
        assert_eq!(f_to_c(&[9], &[], 1), vec![9]);
    }

    #[test]
    fn compress_options_parse() {
        assert_eq!(parse_compress("none").ok(), Some(None));
        assert_eq!(parse_compress("gzip").ok(), Some(Some(4)));
        assert_eq!(parse_compress("gzip:9").ok(), Some(Some(9)));
        for bad in ["gzip:10", "gzip:", "zstd", "gzip:-1", ""] {
            assert!(parse_compress(bad).is_err(), "{bad}");
        }
    }
}
