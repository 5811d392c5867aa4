//! Rust baselines for `python -m strom.bench`: the same workloads driven
//! by the Rust client in this process, with the GIL released, so Python's
//! numbers can be compared with Rust's in one run.

use std::time::Instant;

use pyo3::prelude::*;
use strom_client::Next;

use crate::driver::PyTopic;
use crate::errors::IntoPy;

/// Consumes `count` events (or up to the end of the stream) of `topic`
/// from the beginning with the Rust client under consumer name `name`;
/// returns `(events, data_bytes, seconds)`.
#[pyfunction]
pub fn rust_consume(
    py: Python<'_>,
    topic: &PyTopic,
    name: &str,
    count: u64,
) -> PyResult<(u64, u64, f64)> {
    let t = topic.inner.get(py)?;
    py.detach(|| {
        let c = t.consumer_with(
            name,
            strom_client::ConsumerOptions {
                start: strom_client::StartPos::Beginning,
                ..Default::default()
            },
        )?;
        let start = Instant::now();
        let (mut n, mut bytes) = (0u64, 0u64);
        while n < count {
            match c.pull().wait()? {
                Next::Event(e) => {
                    n += 1;
                    bytes += e.data().len() as u64;
                }
                Next::EndOfStream => break,
            }
        }
        Ok((n, bytes, start.elapsed().as_secs_f64()))
    })
    .py(py)
}

/// Pushes `count` events with `metadata` (JSON text) and no data from
/// Rust, timing each call; returns the per-call times in nanoseconds.
#[pyfunction]
pub fn rust_push(
    py: Python<'_>,
    topic: &PyTopic,
    metadata: &str,
    count: u64,
) -> PyResult<Vec<u64>> {
    let t = topic.inner.get(py)?;
    let meta = bytes::Bytes::copy_from_slice(metadata.as_bytes());
    py.detach(|| {
        let p = t.producer()?;
        let mut times = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let s = Instant::now();
            let f = p.push(meta.clone(), ())?;
            times.push(s.elapsed().as_nanos() as u64);
            drop(f);
        }
        p.flush()?;
        Ok(times)
    })
    .py(py)
}
