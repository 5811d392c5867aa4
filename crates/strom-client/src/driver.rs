//! The driver: a client's entry point. It owns the background runtime
//! (network progress runs on its threads, never on the caller's), one
//! connection per server member it needs, and optionally an embedded server.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strom_net::Transports;
use strom_proto::{ErrorCode, MemberInfo, Request, Response, TopicInfo};
use tokio::runtime::{Handle, Runtime};

use crate::backend::Backend;
use crate::conn::ClientConn;
use crate::error::{unexpected, Error, Result};
use crate::lease::Leases;

/// The address scheme of the Kafka backend: `kafka://host:port`.
pub const KAFKA_SCHEME: &str = "kafka://";

/// A cheap-to-clone handle on a Strom deployment.
#[derive(Clone)]
pub struct Driver {
    pub(crate) inner: Arc<DriverInner>,
}

pub(crate) struct DriverInner {
    runtime: Mutex<Option<Runtime>>,
    pub handle: Handle,
    pub transports: Transports,
    /// The registry master's address (with a metadata quorum: the leader
    /// last found; `leader.rs` follows it).
    pub master: Mutex<String>,
    /// Every member's primary address known (the group file, `Hello`s):
    /// where to look for a new leader.
    pub members: Mutex<Vec<String>>,
    /// The group file this driver connected with, read again when no
    /// member it knows answers (every one of them restarted elsewhere).
    pub group_file: Mutex<Option<std::path::PathBuf>>,
    /// The member id of the master last reached.
    pub master_id: Mutex<Option<u32>>,
    /// Voters of the metadata quorum, as the master last reached said (1:
    /// none): with a quorum, a master that is gone is replaced by an election.
    pub meta_voters: std::sync::atomic::AtomicU32,
    conns: Mutex<HashMap<String, Arc<ClientConn>>>,
    /// Every address of each member, by its primary address (from the
    /// group file and the servers' `Hello`).
    routes: Mutex<HashMap<String, Vec<String>>>,
    /// The address each open connection really uses, by primary address.
    via: Mutex<HashMap<String, String>>,
    /// Producer leases renewed by this driver's one renewal task.
    pub leases: Leases,
    #[cfg(feature = "embedded")]
    pub(crate) embedded: Mutex<Option<strom_server::ServerHandle>>,
    /// What topics, producers and consumers talk to: Strom servers
    /// (`native.rs`), or a Kafka cluster (`kafka://host:port`, `kafka/`).
    pub backend: Arc<dyn Backend>,
    /// The token every connection presents (`credentials.rs`).
    pub token: Option<String>,
    /// [`Driver::set_request_timeout`], in milliseconds.
    pub request_timeout_ms: AtomicU64,
}

/// How long a registry request waits for its answer unless
/// [`Driver::set_request_timeout`] says otherwise (Kafka's
/// `request.timeout.ms` default).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A request timeout in whole milliseconds, at least 1.
fn millis(limit: Duration) -> u64 {
    u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Runs `f` on `handle`'s runtime and waits for it on this thread, which
/// must not be one of that runtime's (that would deadlock). A panic in `f`
/// or a runtime shutting down is an error, never a panic here.
pub(crate) fn wait<F>(handle: &Handle, f: F) -> Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = handle.spawn(f);
    handle.spawn(async move {
        let _ = tx.send(task.await);
    });
    match rx.recv() {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) if e.is_panic() => Err(Error::coded(
            ErrorCode::INTERNAL,
            format!("a driver task panicked: {}", panic_message(e.into_panic())),
        )),
        // Cancelled, or the waiting task itself dropped: the runtime is
        // shutting down.
        Ok(Err(_)) | Err(_) => Err(Error::Closed("the driver")),
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

pub(crate) fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("strom-client")
        .enable_all()
        .build()
        .map_err(|e| {
            Error::coded(
                ErrorCode::INTERNAL,
                format!("cannot start the client runtime: {e}"),
            )
        })
}

impl Driver {
    /// Whether this driver talks to a Kafka cluster (`kafka://`).
    pub fn is_kafka(&self) -> bool {
        self.inner.backend.name() == "kafka"
    }

    /// `Error::Unsupported` for `what` on a Kafka driver: only Strom
    /// servers have a registry master and native connections.
    fn native_only(&self, what: &str) -> Result<()> {
        if !self.inner.backend.is_native() {
            return Err(Error::Unsupported {
                backend: self.inner.backend.name(),
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// Opens the connection to the registry master.
    pub(crate) fn connect_master(&self) -> Result<()> {
        self.block_on({
            let d = self.clone();
            async move { d.reach_master().await }
        })
    }

    /// A driver over runtime `rt` calling `backend` (chosen in
    /// `connect.rs`).
    pub(crate) fn with_runtime(
        rt: Runtime,
        master: String,
        transports: Transports,
        backend: Arc<dyn Backend>,
        token: Option<String>,
    ) -> Driver {
        Driver {
            inner: Arc::new(DriverInner {
                handle: rt.handle().clone(),
                runtime: Mutex::new(Some(rt)),
                transports,
                master: Mutex::new(master),
                members: Mutex::new(Vec::new()),
                group_file: Mutex::new(None),
                master_id: Mutex::new(None),
                meta_voters: std::sync::atomic::AtomicU32::new(0),
                conns: Mutex::new(HashMap::new()),
                routes: Mutex::new(HashMap::new()),
                via: Mutex::new(HashMap::new()),
                leases: Leases::default(),
                #[cfg(feature = "embedded")]
                embedded: Mutex::new(None),
                backend,
                token,
                request_timeout_ms: AtomicU64::new(millis(REQUEST_TIMEOUT)),
            }),
        }
    }

    /// Longest a registry request (topic administration, opening and
    /// closing producers and consumers, group heartbeats) waits for the
    /// registry master's answer, opening the connection included; then it
    /// fails with `TIMEOUT` instead of waiting for ever on a server that
    /// stopped answering. The default is [`REQUEST_TIMEOUT`]; producers
    /// have their own ([`ProducerOptions::request_timeout`](crate::ProducerOptions::request_timeout)).
    pub fn set_request_timeout(&self, limit: Duration) {
        self.inner
            .request_timeout_ms
            .store(millis(limit), Ordering::Relaxed);
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.request_timeout_ms.load(Ordering::Relaxed))
    }

    /// Address of the server holding the registry (with a metadata
    /// quorum: the leader this driver last found).
    pub fn master_addr(&self) -> String {
        self.master()
    }

    pub(crate) fn master(&self) -> String {
        self.inner.master.lock().clone()
    }

    /// Runs a future on the driver's runtime and waits for it from any
    /// thread but the runtime's own ([`Error::OnDriverThread`]).
    pub(crate) fn block_on<T, F>(&self, f: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let on_own_runtime = Handle::try_current().is_ok_and(|h| h.id() == self.inner.handle.id());
        if on_own_runtime {
            return Err(Error::OnDriverThread);
        }
        wait(&self.inner.handle, f)?
    }

    /// Remembers every address of `members` (primary address, all).
    pub(crate) fn learn<'a>(
        &self,
        members: impl IntoIterator<Item = (&'a String, &'a Vec<String>)>,
    ) {
        let mut routes = self.inner.routes.lock();
        for (addr, addrs) in members.into_iter().filter(|(_, a)| !a.is_empty()) {
            routes.insert(addr.clone(), addrs.clone());
        }
    }

    /// Asks the server behind `c` (reached at `addr`, whose other addresses
    /// are unknown) for the members' addresses. Only the master answers,
    /// and only at protocol version 3; anything else teaches nothing.
    async fn ask_routes(&self, addr: &str, c: &ClientConn) {
        self.know_members(c.greeting().members.into_iter().map(|m| m.addr));
        if self.inner.routes.lock().contains_key(addr) || c.version() < 3 {
            return;
        }
        if let Ok(Response::Members(ms)) = c.call(&Request::Members, Vec::new()).await {
            self.learn(ms.iter().map(|m| (&m.addr, &m.addrs)));
        }
    }

    /// Where the member whose primary address is `addr` can be reached,
    /// best first.
    fn candidates(&self, addr: &str) -> Vec<String> {
        let mut all = self
            .inner
            .routes
            .lock()
            .get(addr)
            .cloned()
            .unwrap_or_default();
        all.push(addr.to_string());
        // A member reached over TLS stays on TLS unless STROM_TRANSPORT
        // says otherwise: its certificate is what the client trusts, a
        // failed check must not fall through to another address, and a
        // client certificate names the client only over TLS.
        if addr.starts_with("tls://") && std::env::var_os("STROM_TRANSPORT").is_none() {
            all.retain(|u| u.starts_with("tls://"));
        }
        let ranked = self.inner.transports.rank(&all);
        if ranked.is_empty() {
            vec![addr.to_string()]
        } else {
            ranked
        }
    }

    /// The address the connection to the member at `addr` (its primary
    /// address, as in the group file) really uses, e.g. `shm://…` when the
    /// client is on the server's node; None if not connected.
    pub fn connected_via(&self, addr: &str) -> Option<String> {
        self.inner.via.lock().get(addr).cloned()
    }

    /// Opens a connection to the member at `addr` over the best address it
    /// can reach: the ones it knows first, then any better one the
    /// server's `Hello` names.
    async fn open(&self, addr: &str) -> Result<Arc<ClientConn>> {
        self.native_only(&format!(
            "a native connection to {addr} (this request goes to a Strom server)"
        ))?;
        let mut tried: Vec<String> = Vec::new();
        let mut failed: Vec<String> = Vec::new();
        loop {
            let Some(url) = self
                .candidates(addr)
                .into_iter()
                .find(|u| !tried.contains(u))
            else {
                return Err(Error::coded(
                    ErrorCode::CONNECTION_FAILED,
                    format!("cannot connect to server {addr}: {}", failed.join("; ")),
                ));
            };
            tried.push(url.clone());
            match ClientConn::connect(&self.inner.transports, &url, self.inner.token.as_deref())
                .await
            {
                Ok(c) => {
                    self.ask_routes(addr, &c).await;
                    let better = self
                        .candidates(addr)
                        .into_iter()
                        .take_while(|u| *u != url)
                        .find(|u| !tried.contains(u));
                    if let Some(better) = better {
                        if let Ok(b) = ClientConn::connect(
                            &self.inner.transports,
                            &better,
                            self.inner.token.as_deref(),
                        )
                        .await
                        {
                            self.inner.via.lock().insert(addr.to_string(), better);
                            return Ok(b);
                        }
                    }
                    self.inner.via.lock().insert(addr.to_string(), url);
                    return Ok(c);
                }
                // The server refused this client's credentials: every
                // address of it would.
                Err(e) if e.code() == ErrorCode::UNAUTHENTICATED => return Err(e),
                Err(e) => {
                    tracing::debug!(addr, url = %url, error = %e, "cannot connect over this address; trying the next");
                    failed.push(format!("{url}: {e}"));
                }
            }
        }
    }

    /// The connection to `addr`, opened on first use and reopened if lost.
    pub(crate) async fn conn(&self, addr: &str) -> Result<Arc<ClientConn>> {
        if let Some(c) = self.inner.conns.lock().get(addr).filter(|c| !c.is_dead()) {
            return Ok(c.clone());
        }
        let c = self.open(addr).await?;
        let mut conns = self.inner.conns.lock();
        match conns.get(addr).filter(|c| !c.is_dead()) {
            Some(existing) => Ok(existing.clone()),
            None => {
                conns.insert(addr.to_string(), c.clone());
                Ok(c)
            }
        }
    }

    pub(crate) async fn master_call(&self, req: Request) -> Result<Response> {
        if !self.inner.backend.is_native() {
            let what = format!("{req:?}");
            let kind = what.split([' ', '{', '(']).next().unwrap_or_default();
            self.native_only(&format!(
                "the registry request {kind} (topic administration beyond create, describe, list and delete, producer registration, Strom consumer groups)"
            ))?;
        }
        self.leader_call(&req).await
    }

    /// Sends a one-way request to the registry master if connected (best
    /// effort, never waits: for drop paths).
    pub(crate) fn master_oneway(&self, req: &Request) {
        let master = self.master();
        let conn = self.inner.conns.lock().get(&master).cloned();
        if let Some(c) = conn.filter(|c| !c.is_dead()) {
            c.send_oneway(req);
        }
    }

    /// The protocol version settled with the registry master.
    pub(crate) async fn master_version(&self) -> Result<u8> {
        Ok(self.conn(&self.master()).await?.version())
    }

    pub(crate) fn admin(&self, req: Request) -> Result<Response> {
        let d = self.clone();
        self.block_on(async move { d.master_call(req).await })
    }

    pub fn describe(&self, name: &str) -> Result<TopicInfo> {
        self.inner.backend.describe(self, name)
    }

    pub fn list_topics(&self) -> Result<Vec<TopicInfo>> {
        self.inner.backend.list_topics(self)
    }

    pub fn delete_topic(&self, name: &str) -> Result<()> {
        self.inner.backend.delete_topic(self, name)
    }

    /// Adds `count` partitions to a topic (on `member`, or round-robin).
    /// Running producers and consumers pick them up within a second.
    pub fn add_partitions(
        &self,
        topic: &str,
        count: u32,
        member: Option<u32>,
    ) -> Result<TopicInfo> {
        let req = Request::AddPartitions {
            topic: topic.into(),
            count,
            member,
        };
        match self.admin(req)? {
            Response::Topic(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    /// Starts moving a replicated partition to `replicas` (distinct
    /// members, the wanted leader first); `describe_topic` shows it in
    /// `moving_to` until it is done (docs/elasticity.md).
    pub fn move_partition(&self, topic: &str, partition: u32, replicas: Vec<u32>) -> Result<()> {
        let req = Request::MovePartition {
            topic: topic.into(),
            partition,
            replicas,
        };
        self.admin(req).map(|_| ())
    }

    /// Starts moving every partition off `member`, which then leaves the
    /// group (`dead`: it is gone; its copies are re-created from the
    /// others). `members` shows it `draining` until it has left.
    pub fn drain_member(&self, member: u32, dead: bool) -> Result<()> {
        self.admin(Request::DrainMember { member, dead })
            .map(|_| ())
    }

    /// The group's members, with whether each is alive (heartbeats).
    pub fn members(&self) -> Result<Vec<MemberInfo>> {
        match self.admin(Request::Members)? {
            Response::Members(m) => Ok(m),
            other => Err(unexpected(other)),
        }
    }

    /// The metrics snapshot (JSON, docs/observability.md) of the server at
    /// `addr`: its partitions' sizes and counters.
    pub fn server_snapshot_at(&self, addr: &str) -> Result<String> {
        let (d, addr) = (self.clone(), addr.to_string());
        let req = Request::ServerSnapshot;
        match self.block_on(async move { d.conn(&addr).await?.call(&req, Vec::new()).await })? {
            Response::ServerSnapshot { json } => Ok(json),
            other => Err(unexpected(other)),
        }
    }

    /// Committed offsets of every consumer name on one partition, asked of
    /// the server at `addr` that hosts it.
    pub fn consumer_offsets_at(
        &self,
        addr: &str,
        topic: &str,
        partition: u32,
    ) -> Result<Vec<(String, u64)>> {
        let req = Request::Offsets {
            topic: topic.into(),
            partition,
        };
        let (d, addr) = (self.clone(), addr.to_string());
        match self.block_on(async move { d.conn(&addr).await?.call(&req, Vec::new()).await })? {
            Response::Offsets(o) => Ok(o),
            other => Err(unexpected(other)),
        }
    }

    /// Checks every CRC of one partition on the server that hosts it,
    /// online; damaged ranges are quarantined and reported.
    pub fn scrub(&self, topic: &str, partition: u32) -> Result<ScrubReport> {
        let info = self.describe(topic)?;
        let p = info.partitions.get(partition as usize).ok_or_else(|| {
            Error::InvalidArgument(format!("topic '{topic}' has no partition {partition}"))
        })?;
        let req = Request::Scrub {
            topic: topic.into(),
            partition,
        };
        let (d, addr) = (self.clone(), p.addr.clone());
        match self.block_on(async move { d.conn(&addr).await?.call(&req, Vec::new()).await })? {
            Response::Scrubbed {
                segments,
                batches,
                bytes,
                damaged,
                quarantined,
            } => Ok(ScrubReport {
                segments,
                batches,
                bytes,
                damaged,
                quarantined,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Committed offsets of every consumer name on one partition.
    pub fn consumer_offsets(&self, topic: &str, partition: u32) -> Result<Vec<(String, u64)>> {
        let info = self.describe(topic)?;
        let p = info.partitions.get(partition as usize).ok_or_else(|| {
            Error::InvalidArgument(format!("topic '{topic}' has no partition {partition}"))
        })?;
        self.consumer_offsets_at(&p.addr, topic, partition)
    }
}

/// What [`Driver::scrub`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub segments: u32,
    /// Intact batches checked (record and data CRC).
    pub batches: u64,
    pub bytes: u64,
    /// Damaged ranges this pass found (now quarantined), `(first, last)`.
    pub damaged: Vec<(u64, u64)>,
    /// Every quarantined range of the partition after the pass.
    pub quarantined: Vec<(u64, u64)>,
}

impl Drop for DriverInner {
    fn drop(&mut self) {
        #[cfg(feature = "embedded")]
        if let Some(server) = self.embedded.lock().take() {
            let _ =
                std::thread::scope(|s| s.spawn(|| self.handle.block_on(server.shutdown())).join());
        }
        if let Some(rt) = self.runtime.lock().take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strom_proto::TopicSpec;

    /// A driver with a runtime and no server (nothing here connects).
    fn offline() -> Driver {
        Driver::with_runtime(
            runtime().unwrap(),
            "127.0.0.1:9".into(),
            Transports::default(),
            Arc::new(crate::native::Native),
            None,
        )
    }

    #[test]
    fn block_on_reports_a_panicking_task_as_an_error_and_keeps_working() {
        let d = offline();
        let e = d
            .block_on(async {
                if std::hint::black_box(true) {
                    panic!("boom in a driver task");
                }
                Ok(())
            })
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::INTERNAL);
        assert!(e.to_string().contains("boom in a driver task"), "{e}");
        assert_eq!(d.block_on(async { Ok(7) }).unwrap(), 7);
    }

    #[test]
    fn block_on_after_the_runtime_shut_down_is_an_error_not_a_panic() {
        let d = offline();
        if let Some(rt) = d.inner.runtime.lock().take() {
            rt.shutdown_background();
        }
        let e = d.block_on(async { Ok(()) }).unwrap_err();
        assert_eq!(e.code(), ErrorCode::SHUTTING_DOWN);
    }

    #[test]
    fn block_on_refuses_the_driver_runtime_threads_instead_of_deadlocking() {
        let d = offline();
        let inner = d.clone();
        let nested = d
            .block_on(async move { Ok(inner.block_on(async { Ok(1) })) })
            .unwrap();
        assert!(matches!(nested, Err(Error::OnDriverThread)), "{nested:?}");
        assert_eq!(
            nested.unwrap_err().code(),
            ErrorCode::INVALID_ARGUMENT,
            "a usage error, with a stable code"
        );
    }

    /// The whole stack over a transport whose bulk payloads move out of
    /// band: producer data reaches the server and fetched data lands in
    /// the consumer's buffers without ever being inline on the stream.
    #[cfg(feature = "embedded")]
    #[test]
    fn events_and_their_data_round_trip_over_an_out_of_band_bulk_transport() {
        use crate::Next;
        let dir = tempfile::tempdir().unwrap();
        let transports =
            Transports::default().with("mem", Arc::new(strom_net::MemTransport::default()));
        let config = strom_server::ServerConfig {
            data_dir: dir.path().to_path_buf(),
            listen: "mem://embedded".into(),
            ..Default::default()
        };
        let d = Driver::embedded_over(config, transports).unwrap();
        assert_eq!(d.master_addr(), "mem://embedded");
        let t = d.create_topic(TopicSpec::new("oob", 2)).unwrap();
        let p = t.producer().unwrap();
        let sizes = [0usize, 10, 40_000, 3 << 20];
        let data = |i: usize, n: usize| (0..n).map(|k| (k * 7 + i) as u8).collect::<Vec<u8>>();
        let futs: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| p.push(serde_json::json!({ "i": i }), data(i, n)).unwrap())
            .collect();
        p.close().unwrap();
        for f in futs {
            f.wait().unwrap();
        }
        let c = t.consumer("c").unwrap();
        let mut seen = 0;
        while let Next::Event(e) = c.pull_timeout(std::time::Duration::from_secs(10)).unwrap() {
            let i = e.json().unwrap()["i"].as_u64().unwrap() as usize;
            assert_eq!(e.data(), &data(i, sizes[i])[..], "event {i}");
            seen += 1;
        }
        assert_eq!(seen, sizes.len());
    }

    #[test]
    fn block_on_from_another_runtime_is_allowed() {
        // Not the driver's threads: waiting cannot deadlock the driver.
        let d = offline();
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = other.block_on(async { d.block_on(async { Ok(5) }) });
        assert_eq!(got.unwrap(), 5);
    }
}
