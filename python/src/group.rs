//! Consumer groups in Python: the keyword arguments of `Topic.consumer`
//! turned into [`GroupOptions`], and a group's description as a dict.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use strom_client::{ConsumerGroupInfo, ConsumerGroupMode, GroupOptions};

use crate::errors;

fn seconds(py: Python<'_>, s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| errors::invalid(py, format!("{what} must be a number of seconds, not {s}")))
}

/// `(group name, options)` from `Topic.consumer`'s group arguments.
pub fn options(
    py: Python<'_>,
    group: String,
    label: Option<&str>,
    mode: &str,
    (session, visibility): (f64, f64),
    max_deliveries: Option<u32>,
    dead_letter: Option<String>,
) -> PyResult<(String, GroupOptions)> {
    let mode: ConsumerGroupMode = mode.parse().map_err(|e: String| errors::invalid(py, e))?;
    let opts = GroupOptions {
        mode,
        label: label.map(str::to_string),
        session_timeout: seconds(py, session, "session_timeout")?,
        visibility_timeout: seconds(py, visibility, "visibility_timeout")?,
        max_deliveries,
        dead_letter,
        ..Default::default()
    };
    Ok((group, opts))
}

/// A consumer group as a dict: `name`, `topic`, `mode`, `generation`,
/// settings, `consumers` and `partitions` (committed, next_offset, lag,
/// pending, redelivered, dead_lettered), plus totals.
pub fn info_dict<'py>(py: Python<'py>, g: &ConsumerGroupInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let s = &g.spec;
    d.set_item("name", &s.name)?;
    d.set_item("topic", &s.topic)?;
    d.set_item("mode", s.mode.as_str())?;
    d.set_item("generation", g.generation)?;
    d.set_item("session_timeout", f64::from(s.session_ms) / 1000.0)?;
    d.set_item("visibility_timeout", f64::from(s.visibility_ms) / 1000.0)?;
    d.set_item("max_deliveries", (s.max_deliveries > 0).then_some(s.max_deliveries))?;
    d.set_item("dead_letter", &s.dead_letter)?;
    let consumers = PyList::empty(py);
    for c in &g.consumers {
        let cd = PyDict::new(py);
        cd.set_item("id", c.id)?;
        cd.set_item("label", &c.label)?;
        cd.set_item("alive", c.alive)?;
        cd.set_item("last_seen_ms", c.last_seen_ms)?;
        cd.set_item("partitions", c.partitions.clone())?;
        consumers.append(cd)?;
    }
    d.set_item("consumers", consumers)?;
    let parts = PyList::empty(py);
    let (mut lag, mut pending, mut redelivered, mut dead) = (0u64, 0u64, 0u64, 0u64);
    for p in &g.partitions {
        let pd = PyDict::new(py);
        pd.set_item("partition", p.partition)?;
        pd.set_item("member", p.member)?;
        pd.set_item("committed", p.committed)?;
        pd.set_item("next_offset", p.next_offset)?;
        pd.set_item("lag", p.lag())?;
        pd.set_item("pending", p.pending)?;
        pd.set_item("redelivered", p.redelivered)?;
        pd.set_item("dead_lettered", p.dead_lettered)?;
        pd.set_item("status", p.status.as_str())?;
        parts.append(pd)?;
        lag += p.lag();
        pending += p.pending;
        redelivered += p.redelivered;
        dead += p.dead_lettered;
    }
    d.set_item("partitions", parts)?;
    d.set_item("lag", lag)?;
    d.set_item("pending", pending)?;
    d.set_item("redelivered", redelivered)?;
    d.set_item("dead_lettered", dead)?;
    Ok(d)
}
