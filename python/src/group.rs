//! Consumer groups in Python: the keyword arguments of `Topic.consumer`
//! turned into [`GroupOptions`], and a group's description as a dict.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use strom_client::{ConsumerGroupInfo, ConsumerGroupMode, GroupOptions, RebalanceListener};

use crate::common::seconds;
use crate::errors;

/// `on_assigned` / `on_revoked` of a partitioned group, called with the
/// list of partitions from inside `pull` (the thread that pulls; the GIL is
/// taken back for the call). An exception is raised from that `pull`.
pub struct PyListener {
    pub on_assigned: Option<Py<PyAny>>,
    pub on_revoked: Option<Py<PyAny>>,
    pub error: Arc<Mutex<Option<PyErr>>>,
}

impl PyListener {
    fn call(&self, f: &Option<Py<PyAny>>, partitions: &[u32]) {
        let Some(f) = f else { return };
        Python::attach(|py| {
            if let Err(e) = f.bind(py).call1((partitions.to_vec(),)) {
                self.error.lock().get_or_insert(e);
            }
        });
    }
}

impl RebalanceListener for PyListener {
    fn on_assigned(&self, partitions: &[u32]) {
        self.call(&self.on_assigned, partitions);
    }

    fn on_revoked(&self, partitions: &[u32]) {
        self.call(&self.on_revoked, partitions);
    }
}

/// `Topic.consumer`'s group arguments.
pub struct GroupArgs<'a> {
    pub group: String,
    pub label: Option<&'a str>,
    pub mode: &'a str,
    pub session_timeout: f64,
    pub visibility_timeout: f64,
    pub max_deliveries: Option<u32>,
    pub dead_letter: Option<String>,
    pub listener: Option<PyListener>,
}

/// `(group name, options)` from `Topic.consumer`'s group arguments.
pub fn options(py: Python<'_>, a: GroupArgs<'_>) -> PyResult<(String, GroupOptions)> {
    let GroupArgs {
        group,
        label,
        mode,
        session_timeout: session,
        visibility_timeout: visibility,
        max_deliveries,
        dead_letter,
        listener,
    } = a;
    let mode: ConsumerGroupMode = mode.parse().map_err(|e: String| errors::invalid(py, e))?;
    if listener.is_some() && mode != ConsumerGroupMode::Partitioned {
        return Err(errors::invalid(
            py,
            "on_assigned and on_revoked apply to partitioned groups",
        ));
    }
    let opts = GroupOptions {
        listener: listener.map(|l| Arc::new(l) as Arc<dyn RebalanceListener>),
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
    d.set_item(
        "max_deliveries",
        (s.max_deliveries > 0).then_some(s.max_deliveries),
    )?;
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
