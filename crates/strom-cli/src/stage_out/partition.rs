//! One partition's files in a stage-out: `pN/events.jsonl` (one index line
//! per event), and by format `pN/data.bin` (data parts concatenated), one
//! `pN/<offset>.npy` per array event, or the arrays in `pN/events.h5`
//! (`hdf5.rs`). The index line format is documented in docs/stage-out.md;
//! [`index_line`] builds it.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Map, Value};
use strom_client::select::{ArrayLayout, Order};

use super::hdf5::{self, H5Part, Placed};
use super::npy;
use super::target::{sync_dir, sync_file};

/// What the data files hold (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Data parts concatenated in one `data.bin` per partition.
    Raw,
    /// One `.npy` file per array event; other data as in `raw`.
    Npy,
    /// The index alone: no data is fetched or written.
    Jsonl,
    /// Arrays in one HDF5 file per partition (docs/hdf5.md); other data
    /// as in `raw`.
    Hdf5,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Npy => "npy",
            Format::Jsonl => "jsonl",
            Format::Hdf5 => "hdf5",
        }
    }
}

/// The index file's name in each partition directory.
pub const INDEX: &str = "events.jsonl";
/// The concatenated data file's name in each partition directory.
pub const DATA: &str = "data.bin";

/// One event as the writer needs it, independent of the client's types.
pub struct Record<'a> {
    pub offset: u64,
    pub timestamp_us: u64,
    /// The metadata as stored.
    pub raw_meta: &'a [u8],
    /// The topic stores JSON text (serializer `json`).
    pub json_serializer: bool,
    /// The metadata decoded by the topic's serializer, for binary topics.
    pub decoded: Option<Value>,
    pub descriptor: &'a [u8],
    pub data_len: u64,
    /// The data part in pieces (empty with `--format jsonl`).
    pub data: Vec<&'a [u8]>,
}

/// An offset range the partition could not deliver.
#[derive(Clone, Debug)]
pub struct Gap {
    pub first: u64,
    pub last: u64,
    pub reason: String,
}

/// What a partition's writer did, for the manifest and the summary.
#[derive(Debug, Default)]
pub struct Stats {
    pub events: u64,
    pub data_bytes: u64,
    /// Files written in this partition, the index included.
    pub files: u64,
    /// Bytes of all those files.
    pub bytes_written: u64,
    pub npy_files: u64,
    /// Datasets in `events.h5` (`hdf5` only).
    pub hdf5_datasets: u64,
    pub raw_fallbacks: u64,
    pub gaps: Vec<Gap>,
}

/// Writes one partition's directory.
pub struct PartitionWriter {
    id: u32,
    dir: PathBuf,
    format: Format,
    index: BufWriter<File>,
    /// `data.bin`, opened on first use, and its length so far.
    data: Option<(BufWriter<File>, u64)>,
    /// `.npy` files written; fsynced in [`finish`](Self::finish).
    npy_paths: Vec<PathBuf>,
    /// `events.h5` (`hdf5` only).
    h5: Option<H5Part>,
    pub stats: Stats,
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The array a descriptor describes, as the index line shows it.
fn array_json(l: &ArrayLayout) -> Value {
    json!({"dtype": l.dtype, "shape": l.shape, "order": l.order.to_string()})
}

/// The index line of an event, without its `data` field.
pub fn index_line(partition: u32, r: &Record<'_>) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("partition".into(), partition.into());
    m.insert("offset".into(), r.offset.into());
    m.insert("timestamp_us".into(), r.timestamp_us.into());
    let parsed = if r.json_serializer {
        serde_json::from_slice::<Value>(r.raw_meta).ok()
    } else {
        None
    };
    match parsed {
        Some(v) => {
            m.insert("metadata_encoding".into(), "json".into());
            m.insert("metadata".into(), v);
        }
        None => {
            m.insert("metadata_encoding".into(), "hex".into());
            m.insert("metadata".into(), hex(r.raw_meta).into());
            if let Some(d) = &r.decoded {
                m.insert("metadata_decoded".into(), d.clone());
            }
        }
    }
    if !r.descriptor.is_empty() {
        match serde_json::from_slice::<Value>(r.descriptor) {
            Ok(v) => m.insert("descriptor".into(), v),
            Err(_) => m.insert("descriptor_hex".into(), hex(r.descriptor).into()),
        };
    }
    if let Some(l) = ArrayLayout::parse(r.descriptor).filter(|l| l.nbytes() == Some(r.data_len)) {
        m.insert("array".into(), array_json(&l));
    }
    m.insert("data_len".into(), r.data_len.into());
    m
}

/// How an event's data is written in `npy` format: the `.npy` preamble,
/// or why the raw bytes go to `data.bin` instead.
fn npy_plan(r: &Record<'_>) -> Result<Vec<u8>, String> {
    let Some(l) = ArrayLayout::parse(r.descriptor) else {
        return Err("no array descriptor (dtype, shape, order): raw bytes".into());
    };
    match l.nbytes() {
        Some(n) if n == r.data_len => {}
        n => {
            return Err(format!(
                "the array descriptor describes {} bytes but the data has {}: raw bytes",
                n.map_or("too many".to_string(), |n| n.to_string()),
                r.data_len
            ))
        }
    }
    npy::preamble(&l.dtype, l.order == Order::F, &l.shape).map_err(|e| format!("{e}: raw bytes"))
}

fn write_all(w: &mut impl Write, parts: &[&[u8]]) -> std::io::Result<()> {
    parts.iter().try_for_each(|p| w.write_all(p))
}

impl PartitionWriter {
    /// Creates `root/pN/` and its index file.
    pub fn create(
        root: &Path,
        id: u32,
        format: Format,
        h5: &hdf5::Options,
    ) -> anyhow::Result<PartitionWriter> {
        let dir = root.join(format!("p{id}"));
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(INDEX);
        let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let (h5, files) = match format {
            Format::Hdf5 => (Some(H5Part::create(&dir, id, h5)?), 2),
            _ => (None, 1),
        };
        Ok(PartitionWriter {
            id,
            dir,
            format,
            index: BufWriter::with_capacity(1 << 20, f),
            data: None,
            npy_paths: Vec::new(),
            h5,
            stats: Stats {
                files,
                ..Stats::default()
            },
        })
    }

    /// Writes one event: its data where the format puts it, then its line.
    pub fn write(&mut self, r: &Record<'_>) -> anyhow::Result<()> {
        let mut line = index_line(self.id, r);
        let data = match self.format {
            Format::Jsonl => Value::Null,
            Format::Raw => self.write_raw(r)?,
            Format::Npy => match npy_plan(r) {
                Ok(pre) => self.write_npy(r, &pre)?,
                Err(_) if r.data_len == 0 => Value::Null,
                Err(note) => {
                    self.stats.raw_fallbacks += 1;
                    line.insert("note".into(), note.into());
                    self.write_raw(r)?
                }
            },
            Format::Hdf5 => {
                let Some(h5) = self.h5.as_mut() else {
                    anyhow::bail!("{} is not open", hdf5::FILE);
                };
                match h5.write(r)? {
                    Placed::Hdf5(v) => v,
                    Placed::None => Value::Null,
                    Placed::Raw(note) => {
                        self.stats.raw_fallbacks += 1;
                        line.insert("note".into(), note.into());
                        self.write_raw(r)?
                    }
                }
            }
        };
        line.insert("data".into(), data);
        serde_json::to_writer(&mut self.index, &line)?;
        self.index.write_all(b"\n").context("writing the index")?;
        self.stats.events += 1;
        self.stats.data_bytes += r.data_len;
        Ok(())
    }

    /// Appends the data to `data.bin`; `null` for an event without data.
    fn write_raw(&mut self, r: &Record<'_>) -> anyhow::Result<Value> {
        if r.data_len == 0 {
            return Ok(Value::Null);
        }
        if self.data.is_none() {
            let path = self.dir.join(DATA);
            let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            self.data = Some((BufWriter::with_capacity(4 << 20, f), 0));
            self.stats.files += 1;
        }
        let Some((w, len)) = self.data.as_mut() else {
            anyhow::bail!("data.bin is not open");
        };
        write_all(w, &r.data).with_context(|| format!("writing {}/{DATA}", self.dir.display()))?;
        let at = *len;
        *len += r.data_len;
        Ok(json!({"file": DATA, "format": "raw", "offset": at, "length": r.data_len}))
    }

    /// Writes `<offset>.npy`: the preamble, then the data.
    fn write_npy(&mut self, r: &Record<'_>, preamble: &[u8]) -> anyhow::Result<Value> {
        let name = format!("{:012}.npy", r.offset);
        let path = self.dir.join(&name);
        let mut f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        f.write_all(preamble)
            .and_then(|()| write_all(&mut f, &r.data))
            .with_context(|| format!("writing {}", path.display()))?;
        self.npy_paths.push(path);
        self.stats.files += 1;
        self.stats.npy_files += 1;
        self.stats.bytes_written += preamble.len() as u64 + r.data_len;
        Ok(json!({
            "file": name,
            "format": "npy",
            "offset": preamble.len(),
            "length": r.data_len,
        }))
    }

    /// A range of offsets that will not come (retention, damage).
    pub fn gap(&mut self, first: u64, last: u64, reason: String) {
        self.stats.gaps.push(Gap {
            first,
            last,
            reason,
        });
    }

    /// Flushes and fsyncs every file and the directory; returns the stats.
    pub fn finish(mut self) -> anyhow::Result<Stats> {
        let index_path = self.dir.join(INDEX);
        let f = self
            .index
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", index_path.display()))?;
        f.sync_all()
            .with_context(|| format!("fsync of {}", index_path.display()))?;
        self.stats.bytes_written += f.metadata()?.len();
        if let Some((w, len)) = self.data.take() {
            let f = w
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}/{DATA}", self.dir.display()))?;
            f.sync_all()
                .with_context(|| format!("fsync of {}/{DATA}", self.dir.display()))?;
            self.stats.bytes_written += len;
        }
        for p in &self.npy_paths {
            sync_file(p)?;
        }
        if let Some(h5) = self.h5.take() {
            self.stats.hdf5_datasets = h5.datasets();
            let path = h5.finish()?;
            sync_file(&path)?;
            self.stats.bytes_written += fs::metadata(&path)?.len();
        }
        sync_dir(&self.dir)?;
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(meta: &'a [u8], descriptor: &'a [u8], data: &'a [u8]) -> Record<'a> {
        Record {
            offset: 7,
            timestamp_us: 1,
            raw_meta: meta,
            json_serializer: true,
            decoded: None,
            descriptor,
            data_len: data.len() as u64,
            data: vec![data],
        }
    }

    #[test]
    fn json_metadata_is_inlined_and_other_bytes_are_hex() {
        let m = index_line(0, &record(br#"{"a":1}"#, b"", b""));
        assert_eq!(m["metadata_encoding"], "json");
        assert_eq!(m["metadata"], json!({"a": 1}));
        let m = index_line(0, &record(b"\x00\xffnot json", b"", b""));
        assert_eq!(m["metadata_encoding"], "hex");
        assert_eq!(m["metadata"], "00ff6e6f74206a736f6e");
    }

    #[test]
    fn array_descriptors_become_npy_and_others_fall_back() {
        let d = br#"{"dtype":"<i2","shape":[2],"order":"C"}"#;
        let pre = npy_plan(&record(b"{}", d, &[1, 0, 2, 0])).expect("an array");
        assert_eq!(pre.len(), 128);
        let e = npy_plan(&record(b"{}", d, &[1, 0])).expect_err("wrong size");
        assert!(e.contains("describes 4 bytes but the data has 2"), "{e}");
        let e = npy_plan(&record(b"{}", b"opaque", &[1])).expect_err("no array");
        assert!(e.contains("no array descriptor"), "{e}");
    }
}
