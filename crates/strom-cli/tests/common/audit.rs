//! Reading the audit topic (docs/security.md, "Audit") in tests.

use std::time::{Duration, Instant};

use strom_client::{ConsumerOptions, Driver, Next, StartPos};
use strom_proto::ErrorCode;

/// The topic every member appends its audit records to.
pub const AUDIT: &str = "strom.audit";

/// The audit records stored now, as JSON, read by `d` from the start.
pub fn records(d: &Driver, name: &str) -> strom_client::Result<Vec<serde_json::Value>> {
    let t = d.open_topic(AUDIT)?;
    let end: u64 = t.describe()?.partitions.iter().map(|p| p.next_offset).sum();
    let opts = ConsumerOptions {
        start: StartPos::Beginning,
        ..Default::default()
    };
    let c = t.consumer_with(name, opts)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while (out.len() as u64) < end {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "read {} of {end} audit records", out.len());
        match c.pull_timeout(left) {
            Ok(Next::Event(ev)) => {
                out.push(serde_json::from_slice(ev.raw()).expect("a JSON record"))
            }
            Ok(Next::EndOfStream) => panic!("the audit topic never ends"),
            Err(e) if e.code() == ErrorCode::TIMEOUT => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
