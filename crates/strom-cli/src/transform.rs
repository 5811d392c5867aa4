//! `strom transform create|list|delete`: in-transit transforms, run by
//! the servers that lead their source partitions (docs/transforms.md).
//! The steps run in a fixed order: filter, project, rename, downsample;
//! `--compress` and `--decompress` set how the output stores data parts.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use strom_client::transform::{self, defs, Op, TransformSpec};
use strom_client::{Driver, ErrorCode, TopicSpec};

#[derive(Subcommand)]
pub enum TransformCmd {
    /// Define a transform; the servers start it within a second. A missing
    /// output topic is created like the source (partitions, replication).
    Create(Box<CreateArgs>),
    /// The defined transforms and their lag (source events not yet done).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Stop and forget a transform (its output stays).
    Delete { name: String },
}

#[derive(Args)]
pub struct CreateArgs {
    name: String,
    /// Source topic.
    #[arg(long)]
    from: String,
    /// Output topic; output partition = source partition modulo its count.
    #[arg(long)]
    to: String,
    /// Keep events whose metadata matches FIELD OP VALUE (e.g. `t >= 10`).
    #[arg(long, value_name = "EXPR")]
    filter: Option<String>,
    /// Keep only these metadata fields; `a=b` keeps `a` named `b`.
    #[arg(long, value_delimiter = ',', value_name = "FIELD[=NEW],..")]
    project: Vec<String>,
    /// Rename metadata fields, keeping the others.
    #[arg(long, value_delimiter = ',', value_name = "FIELD=NEW,..")]
    rename: Vec<String>,
    /// Keep every S-th element along each axis of array payloads.
    #[arg(long, value_delimiter = ',', value_name = "S,..")]
    downsample: Vec<u64>,
    /// Store the output's data parts compressed: zstd[:1..22] or lz4[:0..12].
    #[arg(long, value_name = "CODEC", conflicts_with = "decompress")]
    compress: Option<String>,
    /// Store the output's data parts uncompressed.
    #[arg(long)]
    decompress: bool,
}

impl CreateArgs {
    fn spec(&self) -> TransformSpec {
        let mut ops = Vec::new();
        if let Some(expr) = &self.filter {
            ops.push(Op::Filter { expr: expr.clone() });
        }
        if !self.project.is_empty() {
            ops.push(Op::Project {
                fields: self.project.clone(),
            });
        }
        if !self.rename.is_empty() {
            ops.push(Op::Rename {
                fields: self.rename.clone(),
            });
        }
        if !self.downsample.is_empty() {
            ops.push(Op::Downsample {
                strides: self.downsample.clone(),
            });
        }
        if let Some(codec) = &self.compress {
            ops.push(Op::Compress {
                codec: codec.clone(),
            });
        }
        if self.decompress {
            ops.push(Op::Decompress);
        }
        TransformSpec {
            name: self.name.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            ops,
        }
    }
}

pub fn run(c: TransformCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    match c {
        TransformCmd::Create(a) => {
            let spec = a.spec();
            let pipeline = spec.check()?;
            create_output(&d, &spec, pipeline.compression())?;
            defs::create(&d, &spec)?;
            println!(
                "transform '{}' created: {} -> {} ({} steps)",
                spec.name,
                spec.from,
                spec.to,
                spec.ops.len()
            );
        }
        TransformCmd::List { json } => list(&d, json)?,
        TransformCmd::Delete { name } => {
            defs::delete(&d, &name)?;
            println!("transform '{name}' deleted");
        }
    }
    Ok(())
}

/// Creates the output topic like the source if it does not exist.
fn create_output(
    d: &Driver,
    spec: &TransformSpec,
    compression: Option<strom_client::Compression>,
) -> anyhow::Result<()> {
    match d.describe(&spec.to) {
        Ok(_) => return Ok(()),
        Err(e) if e.code() == ErrorCode::TOPIC_NOT_FOUND => {}
        Err(e) => return Err(e.into()),
    }
    let src = d
        .describe(&spec.from)
        .with_context(|| format!("source topic '{}'", spec.from))?;
    let out = TopicSpec {
        name: spec.to.clone(),
        compression: compression.unwrap_or_default().to_string(),
        ..src.spec.clone()
    };
    d.create_topic(out)
        .with_context(|| format!("creating the output topic '{}'", spec.to))?;
    eprintln!(
        "created output topic '{}' like '{}' ({} partitions)",
        spec.to, spec.from, src.spec.partitions
    );
    Ok(())
}

/// A transform's lag: source events after its committed offsets, summed
/// over the source partitions (`None` if a partition did not answer).
pub(crate) fn lag(d: &Driver, spec: &TransformSpec) -> Option<u64> {
    let info = d.describe(&spec.from).ok()?;
    let name = transform::consumer_name(&spec.name);
    let mut total = 0;
    for p in &info.partitions {
        let offsets = d.consumer_offsets_at(&p.addr, &spec.from, p.id).ok()?;
        let committed = offsets
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(p.first_offset, |(_, o)| *o);
        total += p.next_offset.saturating_sub(committed);
    }
    Some(total)
}

/// One JSON row per defined transform, with its lag (none if the
/// definitions cannot be read).
pub(crate) fn rows(d: &Driver) -> Vec<serde_json::Value> {
    let Ok(all) = defs::list(d) else {
        return Vec::new();
    };
    all.values()
        .map(|s| {
            serde_json::json!({
                "name": s.name, "from": s.from, "to": s.to, "ops": s.ops, "lag": lag(d, s),
            })
        })
        .collect()
}

/// The transforms as a table.
pub(crate) fn print_rows(rows: &[serde_json::Value]) {
    println!(
        "{:<20} {:<20} {:<20} {:>10}  STEPS",
        "TRANSFORM", "FROM", "TO", "LAG"
    );
    for r in rows {
        let steps: Vec<&str> = r["ops"]
            .as_array()
            .map(|a| a.iter().map(|o| o["op"].as_str().unwrap_or("?")).collect())
            .unwrap_or_default();
        let lag = r["lag"].as_u64().map_or("?".to_string(), |l| l.to_string());
        println!(
            "{:<20} {:<20} {:<20} {:>10}  {}",
            r["name"].as_str().unwrap_or(""),
            r["from"].as_str().unwrap_or(""),
            r["to"].as_str().unwrap_or(""),
            lag,
            steps.join(",")
        );
    }
}

fn list(d: &Driver, json: bool) -> anyhow::Result<()> {
    defs::list(d)?;
    let rows = rows(d);
    if json {
        for r in rows {
            println!("{r}");
        }
    } else if rows.is_empty() {
        println!("no transforms");
    } else {
        print_rows(&rows);
    }
    Ok(())
}
