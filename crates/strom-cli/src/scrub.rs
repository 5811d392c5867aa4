//! `strom scrub TOPIC`: checks every CRC of a topic's partitions on the
//! servers that host them, while they keep serving. Prints one JSON line per
//! partition; damaged ranges are quarantined by the server and reported
//! here. Exits 1 if any partition has damage or could not be checked.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct ScrubArgs {
    topic: String,
    /// Only these partitions (comma separated).
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<u32>>,
}

pub fn run(a: ScrubArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    let info = d.describe(&a.topic)?;
    let mut bad = 0usize;
    for p in &info.partitions {
        if a.partitions.as_ref().is_some_and(|w| !w.contains(&p.id)) {
            continue;
        }
        let line = match d.scrub(&a.topic, p.id) {
            Ok(r) => {
                if !r.quarantined.is_empty() {
                    bad += 1;
                    eprintln!(
                        "strom: partition {} of '{}' has quarantined offsets {:?}; readers get DATA_CORRUPT gaps there (see docs/on-disk-format.md)",
                        p.id, a.topic, r.quarantined
                    );
                }
                serde_json::json!({
                    "partition": p.id,
                    "member": p.member,
                    "segments": r.segments,
                    "batches": r.batches,
                    "bytes": r.bytes,
                    "damaged": r.damaged,
                    "quarantined": r.quarantined,
                })
            }
            Err(e) => {
                bad += 1;
                eprintln!(
                    "strom: partition {} of '{}' could not be checked: {e}",
                    p.id, a.topic
                );
                serde_json::json!({ "partition": p.id, "member": p.member, "error": e.to_string() })
            }
        };
        println!("{line}");
    }
    if bad > 0 {
        return Err(crate::Exit(1).into());
    }
    Ok(())
}
