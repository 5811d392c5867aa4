//! `Driver` and `Topic`: connecting (or embedding a server), topic
//! administration, and the factories for producers and consumers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use strom_client::{
    Acks, Batching, ConsumerOptions, DataBroker, DataSelector, Driver, Durability, ErrorCode,
    Overflow, PartitionType, PoolBroker, ProducerOptions, Selection, Topic, TopicInfo, TopicSpec,
};

use crate::common::{positive_seconds, release_pending, ForkSafe};
use crate::consumer::{start_pos, Ctx, PyConsumer};
use crate::errors::{self, IntoPy};
use crate::producer::PyProducer;
use strom_client::select::Selector;

use crate::select::{ConsumerSelector, PyBroker, PySelection, SelectorKind};

/// A topic description as a dict.
fn info_dict<'py>(py: Python<'py>, info: &TopicInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let s = &info.spec;
    d.set_item("name", &s.name)?;
    d.set_item("type", s.partition_type.as_str())?;
    d.set_item("durability", s.durability.to_string())?;
    d.set_item("validator", &s.validator)?;
    d.set_item("schema", &s.schema)?;
    d.set_item("selector", &s.selector)?;
    d.set_item("serializer", &s.serializer)?;
    d.set_item("retention_bytes", s.retention_bytes)?;
    d.set_item("retention_ms", s.retention_ms)?;
    d.set_item("segment_bytes", s.segment_bytes)?;
    d.set_item("overflow", s.effective_overflow().map(Overflow::as_str))?;
    let parts = PyList::empty(py);
    for p in &info.partitions {
        let pd = PyDict::new(py);
        pd.set_item("id", p.id)?;
        pd.set_item("member", p.member)?;
        pd.set_item("addr", &p.addr)?;
        pd.set_item("first_offset", p.first_offset)?;
        pd.set_item("next_offset", p.next_offset)?;
        pd.set_item("status", p.status.as_str())?;
        pd.set_item("reason", p.status.reason())?;
        pd.set_item("dropped_events", p.dropped_events)?;
        pd.set_item("replicas", p.replicas.clone())?;
        pd.set_item("isr", p.isr.clone())?;
        pd.set_item("epoch", p.epoch)?;
        parts.append(pd)?;
    }
    d.set_item("partitions", parts)?;
    let st = PyDict::new(py);
    st.set_item("open_producers", info.state.open_producers)?;
    st.set_item("closed_producers", info.state.closed_producers)?;
    st.set_item("expired_producers", info.state.expired_producers)?;
    st.set_item("ended", info.state.ended)?;
    d.set_item("state", st)?;
    Ok(d)
}

/// A handle on a Strom deployment: `Driver.connect(group_file)` or
/// `Driver.embedded(path)` (a server inside this process). Network progress
/// runs on the driver's own threads, whatever Python is doing.
///
/// Strom's threads do not survive `fork()`: create the driver in the
/// process that uses it (a forked child raises `strom.ForkError`).
#[pyclass(module = "strom._strom", name = "Driver", frozen)]
pub struct PyDriver {
    inner: ForkSafe<Driver>,
}

fn topic_obj(t: Topic) -> PyTopic {
    PyTopic {
        inner: ForkSafe::new(t, "Topic"),
    }
}

#[pymethods]
impl PyDriver {
    /// Connects to the group described by `group_file` (written by
    /// `strom server --group-file`; default `$STROM_GROUP_FILE`), or to
    /// `host:port` given as `address`. Every connection presents `token`
    /// (a Strom token, docs/security.md), else the one `$STROM_TOKEN` or
    /// the file `$STROM_TOKEN_FILE` holds, if any.
    #[staticmethod]
    #[pyo3(signature = (group_file=None, *, address=None, token=None))]
    fn connect(
        py: Python<'_>,
        group_file: Option<PathBuf>,
        address: Option<String>,
        token: Option<String>,
    ) -> PyResult<Self> {
        let token = match token {
            Some(t) => Some(t),
            None => strom_client::credentials::token_from_env().py(py)?,
        };
        let group_file = match (&group_file, &address) {
            (None, None) => std::env::var_os("STROM_GROUP_FILE").map(Into::into),
            _ => group_file,
        };
        let d = match (group_file, address) {
            (Some(g), None) => py.detach(|| Driver::connect_as(g, Default::default(), token)),
            (None, Some(a)) => py.detach(|| Driver::connect_addr_as(&a, Default::default(), token)),
            _ => {
                return Err(errors::invalid(
                    py,
                    "give either a group file (or set STROM_GROUP_FILE) or address=",
                ))
            }
        }
        .py(py)?;
        Ok(PyDriver {
            inner: ForkSafe::new(d, "Driver"),
        })
    }

    /// Starts a server inside this process with its data under `path`, and
    /// connects to it. Nothing else needs to run.
    ///
    /// By default the server is a group of its own on a free loopback
    /// port. `listen` names another address; `group_file` writes the new
    /// group's file there (and its cluster secret beside it, for members
    /// that join); `join` makes the server a member of the running group
    /// that group file describes (`cluster_secret_file`: default beside
    /// it); `insecure` serves a network address without authentication.
    #[staticmethod]
    #[pyo3(signature = (path, *, listen=None, group_file=None, join=None, cluster_secret_file=None, insecure=false))]
    fn embedded(
        py: Python<'_>,
        path: PathBuf,
        listen: Option<String>,
        group_file: Option<PathBuf>,
        join: Option<PathBuf>,
        cluster_secret_file: Option<PathBuf>,
        insecure: bool,
    ) -> PyResult<Self> {
        let alone = join.is_none();
        let mut config = strom_client::ServerConfig {
            data_dir: path,
            group_file,
            join,
            cluster_secret_file,
            insecure,
            // A new group of one, whatever a launcher's environment says.
            rank: alone.then_some(0),
            size: alone.then_some(1),
            ..Default::default()
        };
        if let Some(l) = listen {
            config.listen = l;
        }
        let d = py.detach(|| Driver::embedded_with(config)).py(py)?;
        Ok(PyDriver {
            inner: ForkSafe::new(d, "Driver"),
        })
    }

    /// Longest a registry request (topic administration, opening and
    /// closing producers and consumers, group heartbeats) waits for the
    /// registry's answer, in seconds; then it raises a `StromError` with
    /// code `TIMEOUT` instead of waiting for ever on a server that stopped
    /// answering. Default 30. Producers have their own (`request_timeout=`).
    fn set_request_timeout(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        let limit = positive_seconds(py, seconds, "request timeout")?;
        self.inner.get(py)?.set_request_timeout(limit);
        Ok(())
    }

    /// The group's members: a list of dicts with `id`, `addr` and `alive`.
    fn members<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let d = self.inner.get(py)?;
        let all = py.detach(|| d.members()).py(py)?;
        let l = PyList::empty(py);
        for m in &all {
            let e = PyDict::new(py);
            e.set_item("id", m.id)?;
            e.set_item("addr", &m.addr)?;
            e.set_item("alive", m.alive)?;
            l.append(e)?;
        }
        Ok(l)
    }

    /// `host:port` of the server holding the topic registry.
    #[getter]
    fn address(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.inner.get(py)?.master_addr().to_string())
    }

    /// Creates a topic and returns it.
    ///
    /// `type`: `"file"` (persistent, default) or `"memory"`; `durability`:
    /// `"always"` (default), `"never"` or `"interval:<ms>"`; `validator`: `"none"`,
    /// `"json"` or `"json-schema"` (with `schema`, a dict or JSON text);
    /// `selector`: `"round-robin"`, `"hash:<field>"` or `"explicit"`;
    /// `serializer`: `"json"` or `"binary"` (needs `schema`); `overflow`
    /// (memory topics only): `"block"` (default: producers wait for
    /// consumers' acks once the partition is full) or `"drop-oldest"`
    /// (readers that fall behind get a `DataExpired` gap).
    ///
    /// `replication_factor`: copies of each partition on distinct members
    /// (default 1); `min_in_sync`: in-sync copies an `acks="all"` push needs
    /// (default: a majority). See docs/replication.md.
    ///
    /// `compression`: how producers compress each event's data part:
    /// `"none"` (default), `"zstd"`, `"zstd:<1..22>"`, `"lz4"`,
    /// `"lz4:<0..12>"`; consumers decompress transparently. See
    /// docs/compression.md.
    ///
    /// `exist_ok=True` returns the topic if it already exists (say, on a
    /// program's second run) instead of raising `TopicExists`, provided it
    /// has the partition count and type asked for; if it does not,
    /// `TopicExists` says how the existing topic differs.
    #[pyo3(signature = (name, partitions=1, r#type="file", durability="always", validator="none",
        schema=None, selector="round-robin", serializer="json", retention_bytes=None,
        retention_ms=None, segment_bytes=None, exist_ok=false, overflow=None,
        replication_factor=1, min_in_sync=None, compression="none"))]
    #[allow(clippy::too_many_arguments)]
    fn create_topic(
        &self,
        py: Python<'_>,
        name: &str,
        partitions: u32,
        r#type: &str,
        durability: &str,
        validator: &str,
        schema: Option<&Bound<'_, PyAny>>,
        selector: &str,
        serializer: &str,
        retention_bytes: Option<u64>,
        retention_ms: Option<u64>,
        segment_bytes: Option<u64>,
        exist_ok: bool,
        overflow: Option<&str>,
        replication_factor: u32,
        min_in_sync: Option<u32>,
        compression: &str,
    ) -> PyResult<PyTopic> {
        let d = self.inner.get(py)?;
        let mut spec = TopicSpec::new(name, partitions);
        spec.partition_type = PartitionType::parse(r#type).map_err(|e| errors::invalid(py, e))?;
        spec.durability = Durability::parse(durability).map_err(|e| errors::invalid(py, e))?;
        spec.validator = validator.into();
        spec.schema = match schema {
            None => None,
            Some(s) if s.is_none() => None,
            Some(s) => match s.cast::<PyString>() {
                Ok(t) => Some(t.to_str()?.to_string()),
                Err(_) => {
                    let mut out = Vec::new();
                    crate::json::write(s, &mut out)?;
                    Some(String::from_utf8_lossy(&out).into_owned())
                }
            },
        };
        spec.selector = selector.into();
        spec.serializer = serializer.into();
        spec.retention_bytes = retention_bytes;
        spec.retention_ms = retention_ms;
        spec.segment_bytes = segment_bytes;
        spec.replication_factor = replication_factor;
        spec.min_in_sync = min_in_sync.unwrap_or(0);
        if compression != "none" {
            spec.compression = compression.into();
        }
        spec.overflow = overflow
            .map(Overflow::parse)
            .transpose()
            .map_err(|e| errors::invalid(py, e))?;
        let wanted = (spec.partitions, spec.partition_type);
        let t = match py.detach(|| d.create_topic(spec)) {
            Err(e) if exist_ok && e.code() == ErrorCode::TOPIC_EXISTS => {
                let t = py.detach(|| d.open_topic(name)).py(py)?;
                let have = (t.partitions(), t.info().spec.partition_type);
                if have != wanted {
                    return Err(errors::coded_named(
                        py,
                        "TopicExists",
                        ErrorCode::TOPIC_EXISTS,
                        &format!(
                            "topic '{name}' already exists with {} partition(s) of type '{}', \
                             but create_topic(exist_ok=True) asked for {} of type '{}'; use \
                             open_topic to take it as it is, or delete_topic it first",
                            have.0,
                            have.1.as_str(),
                            wanted.0,
                            wanted.1.as_str()
                        ),
                    ));
                }
                t
            }
            created => created.py(py)?,
        };
        Ok(topic_obj(t))
    }

    /// Opens an existing topic.
    fn open_topic(&self, py: Python<'_>, name: &str) -> PyResult<PyTopic> {
        let d = self.inner.get(py)?;
        let t = py.detach(|| d.open_topic(name)).py(py)?;
        Ok(topic_obj(t))
    }

    /// Describes a topic: spec, partitions (with offsets) and stream state, as a dict.
    fn describe<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let d = self.inner.get(py)?;
        let info = py.detach(|| d.describe(name)).py(py)?;
        info_dict(py, &info)
    }

    /// Every topic, as a list of dicts (see `describe`).
    fn list_topics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let d = self.inner.get(py)?;
        let all = py.detach(|| d.list_topics()).py(py)?;
        let l = PyList::empty(py);
        for t in &all {
            l.append(info_dict(py, t)?)?;
        }
        Ok(l)
    }

    /// Deletes a topic and its data.
    fn delete_topic(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let d = self.inner.get(py)?;
        py.detach(|| d.delete_topic(name)).py(py)
    }

    /// A consumer group as a dict: settings, members, and per partition
    /// the committed position, lag, pending and redelivered events.
    fn describe_group<'py>(&self, py: Python<'py>, group: &str) -> PyResult<Bound<'py, PyDict>> {
        let d = self.inner.get(py)?;
        let g = py.detach(|| d.describe_group(group)).py(py)?;
        crate::group::info_dict(py, &g)
    }

    /// Every consumer group, as a list of dicts (see `describe_group`).
    fn list_groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let d = self.inner.get(py)?;
        let all = py.detach(|| d.list_groups()).py(py)?;
        let l = PyList::empty(py);
        for g in &all {
            l.append(crate::group::info_dict(py, g)?)?;
        }
        Ok(l)
    }

    /// Deletes a consumer group and its state on every partition.
    fn delete_group(&self, py: Python<'_>, group: &str) -> PyResult<()> {
        let d = self.inner.get(py)?;
        py.detach(|| d.delete_group(group)).py(py)
    }

    /// Committed offsets of every consumer name on one partition: `{name: offset}`.
    fn consumer_offsets<'py>(
        &self,
        py: Python<'py>,
        topic: &str,
        partition: u32,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = self.inner.get(py)?;
        let o = py.detach(|| d.consumer_offsets(topic, partition)).py(py)?;
        let out = PyDict::new(py);
        for (k, v) in o {
            out.set_item(k, v)?;
        }
        Ok(out)
    }
}

/// Where a Python callback's exception waits to be raised.
type ErrorSlot = Arc<Mutex<Option<PyErr>>>;

/// A topic: makes producers and consumers. Get one from
/// `Driver.create_topic` or `Driver.open_topic`.
#[pyclass(module = "strom._strom", name = "Topic", frozen)]
pub struct PyTopic {
    pub inner: ForkSafe<Topic>,
}

#[pymethods]
impl PyTopic {
    /// The topic's name.
    #[getter]
    fn name(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.inner.get(py)?.name().to_string())
    }

    /// Number of partitions.
    #[getter]
    fn partitions(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.inner.get(py)?.partitions())
    }

    /// Fetches a fresh description (offsets, stream state) as a dict.
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = self.inner.get(py)?;
        let info = py.detach(|| t.describe()).py(py)?;
        info_dict(py, &info)
    }

    /// Ends the stream explicitly: consumers see the end of stream after
    /// every event written before, and pushing fails from now on.
    fn complete(&self, py: Python<'_>) -> PyResult<()> {
        let t = self.inner.get(py)?;
        py.detach(|| t.complete()).py(py)
    }

    /// A new producer. `batch`: `"adaptive"` (default: send whatever is
    /// ready whenever an in-flight slot frees), or a number of events per
    /// batch; `batch_bytes`: the batch size in bytes (with `batch` unset,
    /// send once this many bytes are batched; otherwise the most a batch of
    /// several events holds; a larger single event goes alone);
    /// `max_batches`: batches in flight per partition (backpressure past
    /// that); `linger`: seconds a partial count/bytes batch waits;
    /// `max_event_bytes`: refuse larger events at `push` (default: what the
    /// server accepts); `max_batch_bytes`: an older name for `batch_bytes`
    /// when `batch` is given; `lease`: seconds the producer's lease lasts,
    /// renewed in the background on the client's own threads (even while
    /// Python holds the GIL); if the process dies its part of the stream
    /// ends once the lease runs out. 0 (default) takes the server's
    /// `producer_lease_ms`; `None` takes no lease (the producer stays open
    /// until closed, even after the process exits). `acks`: `"all"`
    /// (default; a replicated partition answers once every in-sync copy
    /// has the event) or `"leader"` (after the leader's append).
    /// `idempotent`: stamp batches and resend those whose answer was lost
    /// to the partition's current leader, appended once each (`None`, the
    /// default: on for replicated topics). `request_timeout`: seconds a
    /// partition's server may leave every batch unanswered before its
    /// connection is given up and the batches fail as on a lost connection
    /// (default 30, Kafka's `request.timeout.ms`).
    #[pyo3(signature = (batch=None, batch_bytes=None, max_batches=2, linger=0.005, max_batch_bytes=None, max_event_bytes=None, lease=Some(0.0), acks="all", idempotent=None, request_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn producer(
        &self,
        py: Python<'_>,
        batch: Option<&Bound<'_, PyAny>>,
        batch_bytes: Option<u64>,
        max_batches: usize,
        linger: f64,
        max_batch_bytes: Option<u64>,
        max_event_bytes: Option<u64>,
        lease: Option<f64>,
        acks: &str,
        idempotent: Option<bool>,
        request_timeout: Option<f64>,
    ) -> PyResult<PyProducer> {
        release_pending(py);
        let t = self.inner.get(py)?;
        let trigger = match batch {
            None => None,
            Some(b) if b.is_none() => None,
            Some(b) => Some(match b.extract::<String>() {
                Ok(s) if s == "adaptive" => Batching::adaptive(),
                Ok(s) => {
                    return Err(errors::invalid(
                        py,
                        format!("unknown batch mode '{s}'; use 'adaptive' or a count"),
                    ))
                }
                Err(_) => Batching::count(b.extract()?),
            }),
        };
        let mut batching = match (trigger, batch_bytes.or(max_batch_bytes)) {
            (Some(t), Some(bytes)) => t.with_bytes(bytes),
            (Some(t), None) => t,
            (None, Some(bytes)) if batch_bytes.is_some() => Batching::bytes(bytes),
            (None, Some(bytes)) => Batching::adaptive().with_bytes(bytes),
            (None, None) => Batching::adaptive(),
        };
        if let Some(n) = max_event_bytes {
            if n == 0 {
                return Err(errors::invalid(py, "max_event_bytes must be positive"));
            }
            batching = batching.with_max_event_bytes(n);
        }
        let acks = match acks {
            "all" => Acks::All,
            "leader" => Acks::Leader,
            other => {
                return Err(errors::invalid(
                    py,
                    format!("acks must be 'all' or 'leader', not '{other}'"),
                ))
            }
        };
        let mut opts = ProducerOptions {
            acks,
            idempotent,
            batch: batching,
            max_batches,
            linger: Duration::try_from_secs_f64(linger.max(0.0)).map_err(|_| {
                errors::invalid(
                    py,
                    format!("linger must be a number of seconds >= 0, not {linger}"),
                )
            })?,
            lease: match lease {
                None => None,
                Some(s) if s >= 0.0 && Duration::try_from_secs_f64(s).is_ok() => {
                    Some(Duration::from_secs_f64(s))
                }
                Some(s) => {
                    return Err(errors::invalid(
                        py,
                        format!("lease must be a number of seconds >= 0 or None, not {s}"),
                    ))
                }
            },
            ..Default::default()
        };
        if let Some(s) = request_timeout {
            opts.request_timeout = positive_seconds(py, s, "request_timeout")?;
        }
        let p = py.detach(|| t.producer_with(opts)).py(py)?;
        Ok(PyProducer {
            inner: ForkSafe::new(p, "Producer"),
        })
    }

    /// A consumer named `name`. Acks are kept per name: a consumer that
    /// restarts under the same name resumes after its last ack.
    ///
    /// With `group="g"` it joins consumer group `g` instead (`name` is then
    /// the member's label). `mode="shared"`: any member may receive any
    /// event, each event goes to one member at a time and is acked on its
    /// own (`ev.ack()`, `ev.nack()`); an event not acked within
    /// `visibility_timeout` seconds, or held by a member that died, goes to
    /// another member with `ev.deliveries` raised; after `max_deliveries` it
    /// goes to the `dead_letter` topic (default `TOPIC.GROUP.dlq`). The
    /// group's settings are fixed by its first member. `prefetch` defaults
    /// to 64 in a group (in a shared group: the most unacked events a
    /// member holds per partition). `mode="partitioned"` (the default with
    /// `group`): members split the partitions; `on_assigned(partitions)`
    /// and `on_revoked(partitions)` are called from inside `pull` before
    /// any event of a newly assigned partition is returned.
    ///
    /// `partitions`: list of partitions to read (default all);
    /// `data_selector`: a `strom.select` selection (run in Rust), or a
    /// callable `f(metadata, info) -> selection` where `info` has `size`,
    /// `descriptor` and, for arrays, `dtype`, `shape`, `order`;
    /// `data_broker`: a callable `f(metadata, length)` returning a writable
    /// buffer (or a list of them) for the selected bytes; `start`:
    /// `"committed"` (default), `"beginning"`, `"end"`, an offset, or
    /// `("timestamp", µs)`; `prefetch`: events per partition the server
    /// may send ahead of demand; `prefetch_bytes`: bytes of fetched data
    /// held for events not pulled yet (all partitions).
    #[pyo3(signature = (name=None, partitions=None, data_selector=None, data_broker=None, start=None, prefetch=None, prefetch_bytes=None, *, group=None, mode="partitioned", session_timeout=10.0, visibility_timeout=30.0, max_deliveries=None, dead_letter=None, on_assigned=None, on_revoked=None))]
    #[allow(clippy::too_many_arguments)]
    fn consumer(
        &self,
        py: Python<'_>,
        name: Option<&str>,
        partitions: Option<Vec<u32>>,
        data_selector: Option<&Bound<'_, PyAny>>,
        data_broker: Option<&Bound<'_, PyAny>>,
        start: Option<&Bound<'_, PyAny>>,
        prefetch: Option<u32>,
        prefetch_bytes: Option<u64>,
        group: Option<String>,
        mode: &str,
        session_timeout: f64,
        visibility_timeout: f64,
        max_deliveries: Option<u32>,
        dead_letter: Option<String>,
        on_assigned: Option<Py<PyAny>>,
        on_revoked: Option<Py<PyAny>>,
    ) -> PyResult<PyConsumer> {
        release_pending(py);
        let t = self.inner.get(py)?;
        let failure = Arc::new(Mutex::new(None));
        let rebalance = Arc::new(Mutex::new(None));
        let listener =
            (on_assigned.is_some() || on_revoked.is_some()).then(|| crate::group::PyListener {
                on_assigned,
                on_revoked,
                error: rebalance.clone(),
            });
        let group = match group {
            None => None,
            Some(g) => Some(crate::group::options(
                py,
                crate::group::GroupArgs {
                    group: g,
                    label: name,
                    mode,
                    session_timeout,
                    visibility_timeout,
                    max_deliveries,
                    dead_letter,
                    listener,
                },
            )?),
        };
        let name = match (name, &group) {
            (Some(n), None) => n.to_string(),
            (_, Some((g, _))) => g.clone(),
            (None, None) => {
                return Err(errors::invalid(
                    py,
                    "a consumer needs a name, or a group to join",
                ))
            }
        };
        let name = name.as_str();
        let prefetch = prefetch.unwrap_or(if group.is_some() { 64 } else { 4096 });
        let mut layouts = None;
        let selector: Arc<dyn DataSelector> = match data_selector {
            None => Arc::new(Selection::All),
            Some(s) if s.is_none() => Arc::new(Selection::All),
            Some(s) => {
                let kind = match s.cast::<PySelection>() {
                    Ok(sel) => match &sel.get().sel {
                        Selector::Fixed(f) => {
                            // A fixed selection needs no adapter at all.
                            let f = f.clone();
                            return self.finish(
                                py,
                                t,
                                name,
                                partitions,
                                Arc::new(f),
                                data_broker,
                                start,
                                (prefetch, prefetch_bytes),
                                (failure, rebalance),
                                None,
                                group,
                            );
                        }
                        other => SelectorKind::Builtin(other.clone()),
                    },
                    Err(_) if s.is_callable() => SelectorKind::Python(s.clone().unbind()),
                    Err(_) => {
                        return Err(pyo3::exceptions::PyTypeError::new_err(
                            "data_selector must be a strom.select selection or a callable",
                        ))
                    }
                };
                let cs = ConsumerSelector {
                    kind,
                    layouts: Default::default(),
                    error: failure.clone(),
                };
                if cs.tracks_layouts() {
                    layouts = Some(cs.layouts.clone());
                }
                Arc::new(cs)
            }
        };
        self.finish(
            py,
            t,
            name,
            partitions,
            selector,
            data_broker,
            start,
            (prefetch, prefetch_bytes),
            (failure, rebalance),
            layouts,
            group,
        )
    }
}

impl PyTopic {
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        py: Python<'_>,
        t: &Topic,
        name: &str,
        partitions: Option<Vec<u32>>,
        selector: Arc<dyn DataSelector>,
        data_broker: Option<&Bound<'_, PyAny>>,
        start: Option<&Bound<'_, PyAny>>,
        (prefetch, prefetch_bytes): (u32, Option<u64>),
        (failure, rebalance): (ErrorSlot, ErrorSlot),
        layouts: Option<crate::select::Layouts>,
        group: Option<(String, strom_client::GroupOptions)>,
    ) -> PyResult<PyConsumer> {
        let broker: Arc<dyn DataBroker> = match data_broker {
            Some(b) if !b.is_none() => {
                if !b.is_callable() {
                    return Err(pyo3::exceptions::PyTypeError::new_err(
                        "data_broker must be a callable f(metadata, length) -> buffer(s)",
                    ));
                }
                Arc::new(PyBroker {
                    f: b.clone().unbind(),
                    error: failure.clone(),
                })
            }
            // Recycled buffers: a steady consumer fetches into warm memory
            // (a buffer goes back when Python drops the event's data); room
            // for a prefetch window of small events (a pull of 512 gives
            // 512 back at once), at most 64 MiB idle.
            _ => Arc::new(PoolBroker::with_limits(4096, 64 << 20)),
        };
        let start = match start {
            Some(s) if !s.is_none() => start_pos(py, s)?,
            _ => strom_client::StartPos::Committed,
        };
        let mut opts = ConsumerOptions {
            partitions,
            prefetch,
            start,
            selector,
            broker,
            ..Default::default()
        };
        if let Some(b) = prefetch_bytes {
            opts.prefetch_bytes = b;
        }
        let c = match group {
            Some((g, mut go)) => {
                go.consumer = ConsumerOptions {
                    start: strom_client::StartPos::Committed,
                    ..opts
                };
                if !matches!(start, strom_client::StartPos::Committed) {
                    go.start = start;
                }
                py.detach(|| t.consumer_group(&g, go)).py(py)?
            }
            None => py.detach(|| t.consumer_with(name, opts)).py(py)?,
        };
        Ok(PyConsumer::new(
            c,
            Ctx {
                layouts,
                failure,
                rebalance,
            },
        ))
    }
}
