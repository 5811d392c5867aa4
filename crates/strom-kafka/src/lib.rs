//! Strom's Kafka wire-protocol front end: Kafka clients (kcat, librdkafka,
//! confluent-kafka) produce to and consume from Strom topics, one more
//! front end over the service layer (`strom_server::Services`). It decodes
//! Kafka requests, calls the same typed data and control operations the
//! native front end calls, and encodes Kafka responses; it never touches
//! the registry state or storage except through them, and it must never
//! depend on the client or CLI crates.
//!
//! - `conn`: framing (size-capped), the request header, ordered responses.
//! - `guard`: checks every count and length of a request body before
//!   `kafka-protocol` decodes it.
//! - `api`: dispatch, `ApiVersions`, unsupported keys and versions.
//! - `admin`: `Metadata`, `CreateTopics`, `DeleteTopics`, `InitProducerId`.
//! - `produce`, `records`, `mapping`: record batches in, events out;
//!   `producer_ids`: `InitProducerId`'s ids, unique across the group and
//!   restarts (retried batches are recognised by the partitions' durable
//!   producer table, as native producers' are).
//! - `fetch`, `encode`: `Fetch` with long polling, `ListOffsets`; stored
//!   batches out as record batches.
//! - `groups`, `group_api`: the classic group protocol (coordinator in
//!   memory) and committed offsets as Strom consumer offsets;
//!   `consumer_protocol`: subscriptions and assignments read off members'
//!   metadata; `report`: the groups shown to the registry master, so they
//!   appear among Strom's consumer groups.
//!
//! Started beside the native front end by `strom server --kafka-listen`
//! (docs/kafka.md).

mod acls;
mod admin;
mod api;
mod conn;
mod consumer_protocol;
mod encode;
pub mod error;
mod error_counts;
mod fetch;
mod group_api;
mod groups;
pub mod guard;
pub mod mapping;
mod produce;
mod producer_ids;
pub mod records;
mod report;
mod request;
mod sasl;
mod scram_admin;
mod throttle;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use strom_server::Services;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use api::check_request;
pub use error::KafkaError;
pub use request::SUPPORTED;

/// How often group sessions and rebalance deadlines are checked.
const GROUP_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// A running Kafka listener.
pub struct KafkaHandle {
    addr: SocketAddr,
    /// `kafka://host:port` as `Metadata` names this broker.
    url: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl KafkaHandle {
    /// The address bound (with the port picked, for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address this broker advertises, as a URL (`kafka://host:port`):
    /// what the server publishes among its addresses
    /// (`ServerHandle::advertise`), so other members list it in `Metadata`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops accepting connections. Open connections end with the runtime.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The scheme of a member's Kafka address in the group file.
pub const SCHEME: &str = "kafka";

/// `host:port`, with an IPv6 host in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The host and port of a `kafka://host:port` address.
pub fn parse_url(url: &str) -> Option<(String, i32)> {
    let rest = url.strip_prefix(SCHEME)?.strip_prefix("://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some((host.trim_matches(['[', ']']).to_string(), i32::from(port)))
}

/// The host `Metadata` names as this broker: the configured host, unless
/// it is a wildcard (`0.0.0.0`, `::`); then the native listener's host if
/// that one is specific, else `localhost`.
fn advertised_host(configured: &str, local: SocketAddr, native: &str) -> String {
    let host = |a: &str| {
        a.rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
    };
    if !local.ip().is_unspecified() {
        return host(configured).unwrap_or_else(|| local.ip().to_string());
    }
    let n = native.strip_prefix("tcp://").unwrap_or(native);
    match host(n) {
        Some(h) if !h.is_empty() && h != "0.0.0.0" && h != "::" => h,
        _ => "localhost".to_string(),
    }
}

/// Binds `addr` (`HOST:PORT`) and serves the Kafka protocol over
/// `services` until [`KafkaHandle::shutdown`]. At most
/// `kafka_max_connections` Kafka connections are served at once; each is
/// one task.
pub async fn serve(services: Arc<Services>, addr: &str) -> Result<KafkaHandle, KafkaError> {
    let bind_err = |source| KafkaError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let local = listener.local_addr().map_err(bind_err)?;
    let host = advertised_host(addr, local, services.control.addr());
    let url = format!("{SCHEME}://{}", join_host_port(&host, local.port()));
    services.stats.kafka.enable();
    let cfg = &services.config;
    let groups = groups::Coordinator::new(
        std::time::Duration::from_millis(cfg.kafka_group_retention_ms),
        cfg.kafka_group_max_size as usize,
        std::time::Duration::from_millis(cfg.kafka_group_initial_rebalance_delay_ms),
    );
    let producer_ids = producer_ids::ProducerIds::new(&cfg.data_dir);
    let inflight = Arc::new(tokio::sync::Semaphore::new(
        cfg.kafka_queued_max_request_bytes
            .min(tokio::sync::Semaphore::MAX_PERMITS as u64) as usize,
    ));
    let limit = cfg.kafka_max_connections;
    let acceptor = match cfg.kafka_tls {
        true => match services.tls_server_config() {
            Ok(Some(c)) => Some(strom_server::tls::tokio_rustls::TlsAcceptor::from(c)),
            Ok(None) => None,
            Err(e) => return Err(KafkaError::Tls(e.to_string())),
        },
        false => None,
    };
    let ctx = Arc::new(request::Ctx {
        services,
        who: Arc::new(strom_auth::Principal::anonymous()),
        peer: None,
        host,
        port: i32::from(local.port()),
        producer_ids: Arc::new(producer_ids),
        groups: Arc::new(groups),
        inflight,
        mute: Default::default(),
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(limit as usize));
    let (stop, mut stopped) = watch::channel(false);
    tokio::spawn(report::run(ctx.clone(), stopped.clone()));
    let task = tokio::spawn(async move {
        let mut refused = 0u64;
        let mut failures = strom_server::AcceptErrors::new("kafka");
        let mut tick = tokio::time::interval(GROUP_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                c = listener.accept() => match c {
                    Ok((sock, peer)) => match slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            tracing::debug!(peer = %peer, "Kafka connection");
                            let (ctx, acceptor) = (ctx.clone(), acceptor.clone());
                            tokio::spawn(async move {
                                match acceptor {
                                    Some(a) => tls::serve(a, sock, peer, ctx).await,
                                    None => conn::serve(sock, peer, ctx).await,
                                }
                                drop(slot);
                            });
                        }
                        Err(_) => {
                            refused += 1;
                            if refused.is_power_of_two() {
                                tracing::warn!(peer = %peer, refused, limit, "Kafka connection limit reached; closing new connections (kafka_max_connections)");
                            }
                        }
                    },
                    Err(e) => {
                        failures.failed(&e);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                _ = tick.tick() => {
                    ctx.groups.tick();
                    let (groups, members) = ctx.groups.counts();
                    ctx.services.stats.kafka.set_groups(groups, members);
                }
                _ = stopped.changed() => break,
            }
        }
    });
    tracing::info!(addr = %local, "strom kafka listening");
    Ok(KafkaHandle {
        addr: local,
        url,
        stop,
        task,
    })
}
