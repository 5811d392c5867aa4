//! The native part of Strom's Python package (`strom._strom`): PyO3
//! classes over the Rust client. Network progress and batching run on the
//! client's own threads; every call that waits or copies releases the GIL;
//! built-in data selectors run in Rust without the GIL; data moves between
//! Python buffers and the network without copies. The pure-Python package
//! `strom` re-exports these classes. This crate depends on the client
//! crates only, never on the server outside embedded mode.

use pyo3::prelude::*;

/// The client's own allocations (events, buffers, batches, the runtime's
/// tasks) use mimalloc, as the `strom` binary does, keeping freed memory
/// warm (`strom_client::alloc`); Python's objects keep Python's allocator.
/// glibc's malloc and free took about 1,300 instructions per pulled 1 KiB
/// event (bench/callgrind-per-event).
#[global_allocator]
static GLOBAL: strom_client::alloc::MiMalloc = strom_client::alloc::MiMalloc;

mod aio;
mod array;
mod bench;
mod common;
mod consumer;
mod driver;
mod errors;
mod event;
mod group;
mod json;
mod lazy;
mod ndarray_api;
mod producer;
mod push_future;
mod select;
mod transform;

#[pymodule]
fn _strom(m: &Bound<'_, PyModule>) -> PyResult<()> {
    strom_client::alloc::keep_freed_memory_warm();
    m.add_class::<driver::PyDriver>()?;
    m.add_class::<driver::PyTopic>()?;
    m.add_class::<producer::PyProducer>()?;
    m.add_class::<push_future::PyPushFuture>()?;
    m.add_class::<push_future::PyPushFutures>()?;
    m.add_class::<push_future::PyEventId>()?;
    m.add_class::<consumer::PyConsumer>()?;
    m.add_class::<event::PyEvent>()?;
    m.add_class::<event::PyAckFuture>()?;
    m.add_class::<event::PyDataBuffer>()?;
    m.add_class::<select::PySelection>()?;
    m.add_function(wrap_pyfunction!(bench::rust_consume, m)?)?;
    m.add_function(wrap_pyfunction!(bench::rust_push, m)?)?;
    m.add_function(wrap_pyfunction!(transform::transform, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
