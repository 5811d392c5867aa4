//! Helpers shared by the conformance suite: an embedded server per test in
//! its own temporary directory, topic creation per partition type, draining
//! a consumer to the end of its stream, and reproducible test data.

use std::time::Duration;

use serde_json::json;
use strom_client::{Consumer, Driver, Event, Next, PartitionType, Producer, TopicSpec};
use tempfile::TempDir;

/// Longest any single pull may wait in a test before it counts as a hang.
pub const PULL_LIMIT: Duration = Duration::from_secs(5);

/// An embedded server with its data in a fresh temporary directory. The
/// directory outlives the driver (fields drop in declaration order).
pub struct Server {
    pub driver: Driver,
    _dir: TempDir,
}

/// The transport a test's embedded server listens on and its driver
/// connects through.
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Tcp,
    /// shm with every data part pulled across processes (cross-memory
    /// attach), however small.
    Shm,
    /// shm with cross-memory attach off: data parts through the socket.
    ShmSocket,
    /// libfabric `tcp;ofi_rxm` (`ofi+tcp://auto`).
    OfiTcp,
    /// libfabric `shm` (`ofi+shm://auto`).
    OfiShm,
}

thread_local! {
    /// What [`Server::start`] uses on this test thread (set by the
    /// generated `shm::*` tests before they run a body).
    static VIA: std::cell::Cell<Via> = const { std::cell::Cell::new(Via::Tcp) };
}

/// Makes [`Server::start`] on this thread use `via`.
#[allow(dead_code)]
pub fn use_transport(via: Via) {
    VIA.with(|v| v.set(via));
}

impl Server {
    /// An embedded server over this thread's transport (TCP unless a
    /// generated `shm::*` test asked for shm).
    pub fn start() -> Server {
        Self::start_via(VIA.with(|v| v.get()))
    }

    pub fn start_via(via: Via) -> Server {
        let dir = tempfile::tempdir().expect("temporary directory");
        let driver = match via {
            Via::Tcp => Driver::embedded(dir.path()).expect("embedded server starts"),
            Via::Shm | Via::ShmSocket | Via::OfiTcp | Via::OfiShm => {
                let scheme = match via {
                    Via::OfiTcp => "ofi+tcp",
                    Via::OfiShm => "ofi+shm",
                    _ => "shm",
                };
                let config = strom_server::ServerConfig {
                    data_dir: dir.path().to_path_buf(),
                    listen: format!("{scheme}://auto"),
                    // ofi+tcp listens on a network address (protected mode
                    // would refuse it without auth).
                    insecure: via == Via::OfiTcp,
                    ..Default::default()
                };
                // Every data part pulled, however small (the default sends
                // payloads of at most 16 KiB through the socket), or none.
                let shm = match via {
                    Via::ShmSocket => strom_net::ShmTransport::default().without_cma(),
                    _ => strom_net::ShmTransport {
                        inline_max: 0,
                        ..Default::default()
                    },
                };
                let transports =
                    strom_client::Transports::default().with("shm", std::sync::Arc::new(shm));
                let d = Driver::embedded_over(config, transports)
                    .unwrap_or_else(|e| panic!("embedded server starts over {scheme}: {e}"));
                assert!(
                    d.master_addr().starts_with(&format!("{scheme}://")),
                    "server listens on {}",
                    d.master_addr()
                );
                d
            }
        };
        Server { driver, _dir: dir }
    }
}

/// A spec for a topic with `partitions` partitions of type `pt` and the
/// default policies. (Helpers build specs rather than return topics because
/// `strom_client` does not export its `Topic` type.)
pub fn spec(name: &str, partitions: u32, pt: PartitionType) -> TopicSpec {
    let mut spec = TopicSpec::new(name, partitions);
    spec.partition_type = pt;
    spec
}

/// The next event, failing the test on end of stream, error or hang.
pub fn next_event(c: &Consumer) -> Event {
    match c.pull_timeout(PULL_LIMIT) {
        Ok(Next::Event(e)) => e,
        Ok(Next::EndOfStream) => panic!("expected an event, got end of stream"),
        Err(e) => panic!("expected an event, got error: {e}"),
    }
}

/// Every event up to the end of the stream, which must come within
/// [`PULL_LIMIT`] of the previous event.
pub fn drain(c: &Consumer) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        match c.pull_timeout(PULL_LIMIT) {
            Ok(Next::Event(e)) => out.push(e),
            Ok(Next::EndOfStream) => return out,
            Err(e) => panic!(
                "expected an event or end of stream after {} events, got error: {e}",
                out.len()
            ),
        }
    }
}

/// Exactly `n` events (no end of stream required).
pub fn take(c: &Consumer, n: usize) -> Vec<Event> {
    (0..n).map(|_| next_event(c)).collect()
}

/// `len` reproducible pseudo-random bytes (xorshift), different per seed.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The `field` of an event's JSON metadata as an integer.
pub fn field(e: &Event, field: &str) -> u64 {
    let v = e.json().expect("metadata decodes");
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("metadata {v} has no integer field '{field}'"))
}

/// Generates `mod memory` and `mod file` (over TCP), each with one
/// `#[test]` per body, and the same two again under `mod shm` (over the
/// shared-memory transport, data parts pulled), `mod shm_socket` (shm with
/// data parts through the socket, the fallback), `mod ofi_tcp` and
/// `mod ofi_shm` (libfabric's `tcp;ofi_rxm` and `shm` providers).
#[allow(unused_macros)]
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        conformance_over!($($name),*);
        mod shm {
            conformance_over!(via Shm, $($name),*);
        }
        mod shm_socket {
            conformance_over!(via ShmSocket, $($name),*);
        }
        mod ofi_tcp {
            conformance_over!(via OfiTcp, $($name),*);
        }
        mod ofi_shm {
            conformance_over!(via OfiShm, $($name),*);
        }
    };
}

/// The per-partition-type modules of [`conformance!`], over TCP or, with
/// `via V`, over the transport [`Via::V`] names.
#[allow(unused_macros)]
macro_rules! conformance_over {
    (via $via:ident, $($name:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $name() {
                crate::common::use_transport(crate::common::Via::$via);
                super::super::$name(strom_client::PartitionType::Memory)
            })*
        }
        mod file {
            $(#[test]
            fn $name() {
                crate::common::use_transport(crate::common::Via::$via);
                super::super::$name(strom_client::PartitionType::File)
            })*
        }
    };
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $name() {
                super::$name(strom_client::PartitionType::Memory)
            })*
        }
        mod file {
            $(#[test]
            fn $name() {
                super::$name(strom_client::PartitionType::File)
            })*
        }
    };
}

/// Pushes `n` events with metadata `{"i": i}` and data from `data(i)`,
/// waits for all of them, and returns their ids.
pub fn push_n(p: &Producer, n: u64, data: impl Fn(u64) -> Vec<u8>) -> Vec<strom_client::EventId> {
    let futs: Vec<_> = (0..n)
        .map(|i| {
            p.push(json!({ "i": i }), data(i))
                .expect("push is accepted")
        })
        .collect();
    p.flush().expect("flush succeeds");
    futs.into_iter()
        .map(|f| f.wait().expect("event is stored"))
        .collect()
}

pub fn offsets(events: &[strom_client::Event]) -> Vec<u64> {
    events.iter().map(|e| e.offset).collect()
}

pub fn no_data(_: u64) -> Vec<u8> {
    Vec::new()
}
