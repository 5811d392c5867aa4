//! Server configuration: a typed struct with defaults, loadable from TOML.
//! Unknown keys are rejected with a message that names them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The shortest and longest producer lease granted, in milliseconds.
pub const LEASE_RANGE_MS: (u32, u32) = (1_000, 300_000);
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Directory holding the registry and every file partition.
    pub data_dir: PathBuf,
    /// Address to bind; port 0 picks a free port. This primary address is
    /// what the other members use, so in a group spanning nodes it must be
    /// TCP (`host:port`).
    pub listen: String,
    /// More addresses to serve clients on, e.g. `["shm://auto"]` for clients
    /// on this node (`auto` picks a private socket path). All of them are
    /// published in the group file, and clients pick the best they reach.
    pub also_listen: Vec<String>,
    /// Also serve clients on this node over a private `shm://auto` socket
    /// when the primary address is plain TCP and no `shm://` address is
    /// listed (`--no-shm` turns it off; a primary on TLS, RDMA or shm is a
    /// transport chosen, and is left alone). Same-node clients then take shared memory without being told;
    /// other users' clients cannot open the socket's directory (mode 0700)
    /// and stay on their first address.
    pub shm: bool,
    /// Where to write the group file clients bootstrap from.
    pub group_file: Option<PathBuf>,
    /// Join the running group described by this group file as a new member.
    pub join: Option<PathBuf>,
    /// With `join`: the member id to join under. A server started on an
    /// empty data dir with a dead member's id replaces it, and copies again
    /// the replicas that member held. Default: the id kept in the data
    /// dir's `member-id` file, else a new one.
    pub member_id: Option<u32>,
    /// The group's cluster secret, for a server that joins (docs/safety.md,
    /// "What members trust"). Default: the copy in the data dir after a
    /// restart, else `<group file>.secret`, which member 0 writes; member 0
    /// of a new group creates the secret.
    pub cluster_secret_file: Option<PathBuf>,
    /// Rank and size in a launcher's job (default: from the environment:
    /// STROM_RANK/SIZE, OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS).
    pub rank: Option<u32>,
    pub size: Option<u32>,
    /// Milliseconds between a member's heartbeats to the master.
    pub heartbeat_ms: u64,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame_bytes: u32,
    /// Largest batch (metadata + data) a producer may send, in bytes.
    pub max_batch_bytes: u64,
    /// Upper bound on the prefetch window a consumer may ask for, in events.
    pub max_prefetch_events: u32,
    /// Default segment size of file partitions, in bytes.
    pub segment_bytes: u64,
    /// Sparse index interval of file partitions, in bytes of log.
    pub index_interval_bytes: u32,
    /// How often retention runs, in milliseconds.
    pub retention_check_ms: u64,
    /// Size bound of a `memory` partition whose topic sets no
    /// `retention_bytes`: the oldest batches are dropped past it.
    pub memory_retention_bytes: u64,
    /// Most client connections served at once; more are closed at accept.
    pub max_connections: u32,
    /// A new connection must deliver its first whole frame within this many
    /// milliseconds, or it is closed.
    pub handshake_timeout_ms: u64,
    /// Once a frame has started to arrive, all of it (header, body and bulk
    /// payload) must arrive within this many milliseconds.
    pub frame_timeout_ms: u64,
    /// Microseconds a connection keeps polling for its next request before
    /// its worker thread may sleep (0: never spin). Spinning saves a thread
    /// wake-up per request, tens of microseconds on a virtual machine, at the
    /// cost of up to this much CPU after every request; an idle connection
    /// costs one window. Clients have their own setting.
    pub busy_poll_us: u64,
    /// Bytes of fetched data one connection may have read but not yet sent;
    /// past it the server stops reading that connection's requests.
    pub max_connection_buffer_bytes: u64,
    /// The lease, in milliseconds, of a producer that asks for the default:
    /// a leased producer not renewed for this long expires, and its part of
    /// the stream is closed. Requested leases are clamped to 1000..=300000.
    pub producer_lease_ms: u32,
    /// Address of the HTTP endpoint (`/metrics`, the dashboard and its
    /// JSON API), e.g. `127.0.0.1:9464`; port 0 picks a free port. None
    /// (the default) serves no HTTP.
    pub http_listen: Option<String>,
    /// Address of the Kafka wire-protocol front end (`strom-kafka`, see
    /// docs/kafka.md), e.g. `127.0.0.1:9092`; port 0 picks a free port.
    /// None (the default) serves no Kafka protocol.
    pub kafka_listen: Option<String>,
    /// Voters of the metadata quorum that holds the registry (1, 3 or 5,
    /// docs/replication.md). 1 (the default): member 0 holds the registry
    /// alone, in `registry.log`. 3 or 5: the registry is replicated with
    /// Raft over that many members, and survives the death of any
    /// minority of them, member 0 included. Set on member 0 (and on any
    /// member that may lead); a new group only.
    pub meta_voters: u32,
    /// A member the master has not heard from for this long is reported
    /// dead, and the replicated partitions it leads fail over (ms). At
    /// least twice `heartbeat_ms`.
    pub member_timeout_ms: u64,
    /// Tiered storage (docs/tiering.md): a directory (a parallel file
    /// system or any mounted path) to copy closed segments of file
    /// partitions to. None (the default): no tier.
    pub tier_dir: Option<PathBuf>,
    /// Whether the `strom server` process runs the in-transit transforms
    /// of the source partitions it leads (docs/transforms.md). Its
    /// transform host is a client of the group: one connection to the
    /// registry master, and more to partition leaders while transforms
    /// run. `false`: this member runs none (another leader's do).
    pub transforms: bool,
    /// The most transform worker threads (one per source partition of a
    /// transform) this member runs at once; the other partitions wait,
    /// with a warning, until one stops. At least 1.
    pub max_transform_workers: usize,
    /// The tier as a URL instead: `s3://bucket/prefix` (credentials,
    /// region and endpoint from the `AWS_*` environment variables) or
    /// `file:///path` (object_store's local-filesystem backend).
    pub tier_url: Option<String>,
    /// Bytes of closed segments kept locally once they are verified in the
    /// tier (the active segment always stays). None: no size bound.
    pub tier_local_retention_bytes: Option<u64>,
    /// Drop local segments (verified in the tier) whose newest event is
    /// older than this many milliseconds. None: no age bound.
    pub tier_local_retention_ms: Option<u64>,
    /// How often each tiered partition copies its closed segments, in ms.
    pub tier_check_ms: u64,
    /// Segments fetched back from the tier kept per partition (in
    /// `<partition>/tier-cache`).
    pub tier_cache_segments: u32,
    /// Most HTTP connections (`http_listen`) served at once; more are
    /// closed at accept.
    pub http_max_connections: u32,
    /// An HTTP request's whole header must arrive within this many
    /// milliseconds of the connection being ready for it, or the
    /// connection is closed.
    pub http_header_timeout_ms: u64,
    /// An HTTP connection that reads and writes nothing for this many
    /// milliseconds (an idle keep-alive) is closed.
    pub http_idle_timeout_ms: u64,
    /// File descriptors kept free for storage (segment and index files),
    /// member links and the transform host: the connection caps of every
    /// listener (native, Kafka, HTTP) must fit in RLIMIT_NOFILE minus
    /// this, or they are lowered at startup (docs/configuration.md).
    pub fd_reserve: u32,
    /// Most Kafka connections (`kafka_listen`) served at once; more are
    /// closed at accept.
    pub kafka_max_connections: u32,
    /// Bytes of Kafka requests read but not yet answered, over all
    /// connections (Kafka's `queued.max.request.bytes`). A connection
    /// waits for budget before reading more of a request; at least
    /// `max_frame_bytes`.
    pub kafka_queued_max_request_bytes: u64,
    /// A Kafka group left without members is forgotten after this many
    /// milliseconds, with its committed offsets and its entry among the
    /// registry's consumer groups (Kafka's `offsets.retention.minutes`).
    pub kafka_group_retention_ms: u64,
    /// Most members of one Kafka group (Kafka's `group.max.size`); one
    /// more is refused with `GROUP_MAX_SIZE_REACHED`.
    pub kafka_group_max_size: u32,
    /// How long the first rebalance of an empty Kafka group waits for more
    /// members, in milliseconds (Kafka's
    /// `group.initial.rebalance.delay.ms`); a new member joining during
    /// the wait of a new group extends it by as much again, up to the
    /// members' rebalance timeout. So consumers started together share the
    /// partitions instead of the first taking them all. 0: no wait.
    pub kafka_group_initial_rebalance_delay_ms: u64,
    /// No longer used (Kafka idempotent producers share the partitions'
    /// durable producer table); still accepted so config files load.
    pub kafka_max_producer_states: u32,
    /// A Kafka `Metadata` request naming a topic that does not exist
    /// creates it (Kafka's `auto.create.topics.enable`), with
    /// `kafka_auto_create_partitions` partitions and the defaults of
    /// `TopicSpec`. Off by default: a typo must not become a topic.
    pub kafka_auto_create_topics: bool,
    /// Partitions of a topic created on first use (Kafka's `num.partitions`).
    pub kafka_auto_create_partitions: u32,
    /// Authentication and authorization (docs/security.md): every
    /// connection proves who it is (a Strom token, a same-node peer's uid,
    /// membership) and every request is checked against the registry's
    /// ACLs. Off (the default): every client may do everything, so the
    /// server serves only loopback and same-node addresses unless
    /// `insecure` is set (protected mode).
    pub auth: bool,
    /// Serve non-loopback addresses without `auth` (everyone who reaches a
    /// port may read, write and delete everything). Says so in the first
    /// log line and in `strom status`.
    pub insecure: bool,
    /// Principals allowed everything (`User:NAME`, `uid:N`). The uid that
    /// runs the server is always one (it can read the data dir anyway).
    pub super_users: Vec<String>,
    /// How often a member reads the registry's ACLs and revoked tokens
    /// when they changed (ms): a change takes effect everywhere within it.
    pub acl_refresh_ms: u64,
    /// TLS (docs/security.md): this server's certificate chain (PEM), for
    /// `tls://` listen addresses. With `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// Require every TLS client to present a certificate that chains to
    /// this CA (mutual TLS); its subject's common name is the connection's
    /// principal (`User:<CN>`).
    pub tls_client_ca: Option<PathBuf>,
    /// The CA this server trusts other members' certificates by when it
    /// connects to them over `tls://`. Default: `tls_client_ca`, else
    /// `tls_cert` itself (a group sharing one self-signed certificate).
    pub tls_ca: Option<PathBuf>,
    /// With `auth`: networks (CIDR) that may read `/metrics` without a
    /// token (a Prometheus scraper's). Default: loopback only.
    pub http_metrics_networks: Vec<String>,
    /// Serve the Kafka listener over TLS with `tls_cert` (`--kafka-tls`;
    /// Kafka clients' `SSL` and `SASL_SSL`), and with `tls_client_ca` take
    /// a client certificate's common name as the principal.
    pub kafka_tls: bool,
    /// Serve the HTTP endpoint (metrics, dashboard, API) over TLS with
    /// `tls_cert` (`--http-tls`); with `tls_client_ca`, clients must
    /// present a certificate it signs.
    pub http_tls: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("strom-data"),
            listen: "127.0.0.1:0".into(),
            also_listen: Vec::new(),
            shm: true,
            group_file: None,
            join: None,
            member_id: None,
            cluster_secret_file: None,
            rank: None,
            size: None,
            heartbeat_ms: 1000,
            max_frame_bytes: strom_proto::DEFAULT_MAX_FRAME,
            max_batch_bytes: strom_proto::DEFAULT_MAX_FRAME as u64,
            max_prefetch_events: 1 << 16,
            segment_bytes: 1 << 30,
            index_interval_bytes: 4096,
            retention_check_ms: 10_000,
            memory_retention_bytes: 512 << 20,
            max_connections: 4096,
            handshake_timeout_ms: 10_000,
            frame_timeout_ms: 60_000,
            busy_poll_us: 0,
            max_connection_buffer_bytes: 256 << 20,
            producer_lease_ms: 10_000,
            http_listen: None,
            kafka_listen: None,
            meta_voters: 1,
            member_timeout_ms: 3_000,
            tier_dir: None,
            tier_url: None,
            transforms: true,
            max_transform_workers: 64,
            tier_local_retention_bytes: None,
            tier_local_retention_ms: None,
            tier_check_ms: 1_000,
            tier_cache_segments: 4,
            http_max_connections: 256,
            http_header_timeout_ms: 10_000,
            http_idle_timeout_ms: 60_000,
            fd_reserve: 256,
            kafka_max_connections: 4096,
            kafka_queued_max_request_bytes: 512 << 20,
            kafka_group_retention_ms: 7 * 24 * 3_600_000,
            kafka_group_max_size: 10_000,
            kafka_group_initial_rebalance_delay_ms: 3_000,
            kafka_max_producer_states: 100_000,
            kafka_auto_create_topics: false,
            kafka_auto_create_partitions: 1,
            auth: false,
            insecure: false,
            super_users: vec![],
            acl_refresh_ms: 1_000,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_ca: None,
            http_metrics_networks: vec!["127.0.0.0/8".into(), "::1/128".into()],
            kafka_tls: false,
            http_tls: false,
        }
    }
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl ServerConfig {
    /// Reads a TOML file; every key is optional and unknown keys are errors.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: ServerConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Rejects values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map_err(ConfigError::Invalid)
    }

    fn check(&self) -> Result<(), String> {
        if self.max_transform_workers == 0 {
            return Err("max_transform_workers must be at least 1".into());
        }
        if self.max_frame_bytes < 4096 {
            return Err("max_frame_bytes must be at least 4096".into());
        }
        if self.busy_poll_us > 1_000_000 {
            return Err("busy_poll_us must be at most 1000000 (one second)".into());
        }
        if self.max_prefetch_events == 0 {
            return Err("max_prefetch_events must be at least 1".into());
        }
        if self.member_id.is_some() && self.join.is_none() {
            return Err("member_id needs join: it names the id a joining server takes".into());
        }
        if let (Some(r), Some(s)) = (self.rank, self.size) {
            if r >= s {
                return Err(format!("rank {r} must be below size {s}"));
            }
        }
        if self.index_interval_bytes == 0 || self.max_batch_bytes == 0 || self.heartbeat_ms == 0 {
            return Err(
                "index_interval_bytes, max_batch_bytes and heartbeat_ms must be positive".into(),
            );
        }
        if self.max_connections == 0
            || self.handshake_timeout_ms == 0
            || self.frame_timeout_ms == 0
            || self.max_connection_buffer_bytes < 1 << 20
        {
            return Err("max_connections, handshake_timeout_ms and frame_timeout_ms must be positive, and max_connection_buffer_bytes at least 1 MiB".into());
        }
        if let Some(h) = &self.http_listen {
            check_socket_addr("http_listen", h)?;
        }
        if let Some(k) = &self.kafka_listen {
            check_socket_addr("kafka_listen", k)?;
        }
        let (lo, hi) = LEASE_RANGE_MS;
        if !(lo..=hi).contains(&self.producer_lease_ms) {
            return Err(format!(
                "producer_lease_ms must be between {lo} and {hi}, not {}",
                self.producer_lease_ms
            ));
        }
        if self.member_timeout_ms < self.heartbeat_ms.saturating_mul(2) {
            return Err(format!(
                "member_timeout_ms ({}) must be at least twice heartbeat_ms ({})",
                self.member_timeout_ms, self.heartbeat_ms
            ));
        }
        if ![1, 3, 5].contains(&self.meta_voters) {
            return Err(format!(
                "meta_voters must be 1, 3 or 5, not {}",
                self.meta_voters
            ));
        }
        if self.segment_bytes < 4096 {
            return Err("segment_bytes must be at least 4096".into());
        }
        self.check_tier()?;
        self.check_security()?;
        self.check_front_end_limits()
    }

    /// The super users' names, and protected mode: without `auth`, only
    /// loopback and same-node addresses unless `insecure`.
    fn check_security(&self) -> Result<(), String> {
        if let Some(bad) = self
            .super_users
            .iter()
            .find(|s| !strom_auth::principal::valid_pattern(s))
        {
            return Err(format!(
                "super_users entry '{bad}' is not User:NAME, uid:N or *"
            ));
        }
        if self.acl_refresh_ms == 0 {
            return Err("acl_refresh_ms must be positive".into());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("set tls_cert and tls_key together".into());
        }
        let tls_addr = std::iter::once(&self.listen)
            .chain(&self.also_listen)
            .find(|a| a.starts_with("tls://"));
        if self.http_tls && self.tls_cert.is_none() {
            return Err("http_tls needs tls_cert and tls_key".into());
        }
        if self.kafka_tls && self.tls_cert.is_none() {
            return Err("kafka_tls needs tls_cert and tls_key".into());
        }
        if let (Some(a), None) = (tls_addr, &self.tls_cert) {
            return Err(format!(
                "{a} needs tls_cert and tls_key (--tls-cert, --tls-key)"
            ));
        }
        if self.auth || self.insecure {
            return Ok(());
        }
        match self.exposed_address() {
            Some(a) => Err(format!(
                "refusing to serve {a} without authentication: anyone who reaches it could read, write and delete every topic. Turn on auth (--auth, docs/security.md), listen on a loopback or shm:// address, or pass --insecure to accept the risk"
            )),
            None => Ok(()),
        }
    }

    /// Whether this server serves anyone beyond loopback without `auth`.
    /// Whether to add the default `shm://auto` listener ([`Self::shm`]).
    pub fn default_shm(&self) -> bool {
        let plain_tcp = !self.listen.contains("://") || self.listen.starts_with("tcp://");
        self.shm && plain_tcp && !self.also_listen.iter().any(|a| a.starts_with("shm://"))
    }

    pub fn exposed_without_auth(&self) -> bool {
        !self.auth && self.insecure && self.exposed_address().is_some()
    }

    /// The first address this server listens on (native, HTTP or Kafka)
    /// that reaches beyond this node, if any.
    pub fn exposed_address(&self) -> Option<&str> {
        std::iter::once(&self.listen)
            .chain(&self.also_listen)
            .chain(&self.http_listen)
            .chain(&self.kafka_listen)
            .map(String::as_str)
            .find(|a| !local_only(a))
    }

    /// The HTTP and Kafka front ends' limits.
    fn check_front_end_limits(&self) -> Result<(), String> {
        if self.http_max_connections == 0
            || self.http_header_timeout_ms == 0
            || self.http_idle_timeout_ms == 0
            || self.kafka_max_connections == 0
        {
            return Err("http_max_connections, http_header_timeout_ms, http_idle_timeout_ms and kafka_max_connections must be positive".into());
        }
        if self.kafka_queued_max_request_bytes < u64::from(self.max_frame_bytes) {
            return Err(format!(
                "kafka_queued_max_request_bytes ({}) must be at least max_frame_bytes ({}): a whole request must fit",
                self.kafka_queued_max_request_bytes, self.max_frame_bytes
            ));
        }
        if self.kafka_group_retention_ms == 0
            || self.kafka_group_max_size == 0
            || self.kafka_max_producer_states == 0
            || self.kafka_auto_create_partitions == 0
        {
            return Err("kafka_group_retention_ms, kafka_group_max_size, kafka_max_producer_states and kafka_auto_create_partitions must be positive".into());
        }
        Ok(())
    }

    fn check_tier(&self) -> Result<(), String> {
        if self.tier_dir.is_some() && self.tier_url.is_some() {
            return Err("set tier_dir or tier_url, not both".into());
        }
        if let Some(u) = &self.tier_url {
            if !u.starts_with("s3://") && !u.starts_with("file://") {
                return Err(format!("tier_url = '{u}' must start with s3:// or file://"));
            }
        }
        if self.tier_check_ms == 0 || self.tier_cache_segments == 0 {
            return Err("tier_check_ms and tier_cache_segments must be positive".into());
        }
        Ok(())
    }
}

/// `HOST:PORT` with a port, or the error naming the setting.
/// Whether `addr` is reachable only from this node: a loopback host, or a
/// same-node transport (`shm://`, libfabric's `ofi+shm://`, the in-process
/// `mem://`). libfabric's network providers (`ofi+tcp://auto`, verbs, cxi)
/// listen on the provider's network address: not local.
pub fn local_only(addr: &str) -> bool {
    let (scheme, rest) = addr.split_once("://").unwrap_or(("tcp", addr));
    if matches!(scheme, "shm" | "mem" | "ofi+shm") {
        return true;
    }
    if scheme.starts_with("ofi+") {
        return false;
    }
    let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn check_socket_addr(setting: &str, addr: &str) -> Result<(), String> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!(
            "{setting} = '{addr}' is not HOST:PORT (for example 127.0.0.1:9464, or port 0 for a free one)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_is_added_to_a_plain_tcp_primary_only() {
        let with = |t: &str| toml::from_str::<ServerConfig>(t).unwrap().default_shm();
        assert!(with(r#"listen = "127.0.0.1:0""#));
        assert!(with(r#"listen = "tcp://127.0.0.1:0""#));
        assert!(!with("listen = \"127.0.0.1:0\"\nshm = false"));
        assert!(!with(r#"also_listen = ["shm:///run/s.sock"]"#));
        for chosen in ["tls://127.0.0.1:0", "ofi+tcp://auto", "shm://auto"] {
            assert!(!with(&format!("listen = \"{chosen}\"")), "{chosen}");
        }
    }

    #[test]
    fn without_auth_only_local_addresses_are_served_unless_insecure() {
        let parse = |t: &str| {
            toml::from_str::<ServerConfig>(t)
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        for local in [
            "127.0.0.1:0",
            "localhost:9",
            "[::1]:5",
            "shm://auto",
            "127.0.0.2:1",
        ] {
            assert!(local_only(local), "{local}");
        }
        assert!(local_only("ofi+shm://auto"));
        for open in [
            "ofi+tcp://auto",
            "0.0.0.0:0",
            "10.1.2.3:9",
            "[::]:1",
            "node7:9092",
            "tcp://0.0.0.0:1",
        ] {
            assert!(!local_only(open), "{open}");
        }
        let e = parse("listen = \"0.0.0.0:0\"").unwrap_err();
        assert!(
            e.contains("refusing to serve 0.0.0.0:0") && e.contains("--insecure"),
            "{e}"
        );
        let e = parse("kafka_listen = \"0.0.0.0:0\"").unwrap_err();
        assert!(e.contains("0.0.0.0:0"), "{e}");
        assert!(parse("listen = \"0.0.0.0:0\"\ninsecure = true").is_ok());
        assert!(parse("listen = \"0.0.0.0:0\"\nauth = true").is_ok());
        let e = parse("super_users = [\"alice\"]").unwrap_err();
        assert!(e.contains("super_users"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = toml::from_str::<ServerConfig>("listen = \"x\"\nbogus_key = 1").unwrap_err();
        assert!(err.to_string().contains("bogus_key"), "{err}");
        let ok: ServerConfig = toml::from_str("listen = \"127.0.0.1:9\"").unwrap();
        assert_eq!(ok.listen, "127.0.0.1:9");
        assert_eq!(ok.segment_bytes, 1 << 30);
    }

    #[test]
    fn replication_settings_are_checked() {
        let parse = |t: &str| {
            toml::from_str::<ServerConfig>(t)
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        assert!(parse("meta_voters = 3\nmember_timeout_ms = 2000").is_ok());
        let e = parse("meta_voters = 2").unwrap_err();
        assert!(e.contains("meta_voters must be 1, 3 or 5"), "{e}");
        let e = parse("member_timeout_ms = 1500").unwrap_err();
        assert!(e.contains("at least twice heartbeat_ms"), "{e}");
        assert!(parse("member_timeout_ms = 1500\nheartbeat_ms = 500").is_ok());
    }

    #[test]
    fn tier_settings_are_checked() {
        let parse = |t: &str| {
            toml::from_str::<ServerConfig>(t)
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        assert!(parse("tier_dir = \"/pfs/strom\"\ntier_local_retention_bytes = 0").is_ok());
        assert!(parse("tier_url = \"s3://bucket/prefix\"").is_ok());
        let e = parse("tier_dir = \"/a\"\ntier_url = \"s3://b\"").unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = parse("tier_url = \"http://x\"").unwrap_err();
        assert!(e.contains("s3://"), "{e}");
        let e = parse("tier_check_ms = 0").unwrap_err();
        assert!(e.contains("tier_check_ms"), "{e}");
    }

    #[test]
    fn load_errors_are_typed() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        assert!(matches!(
            ServerConfig::load(&missing),
            Err(ConfigError::Read { .. })
        ));
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "bogus_key = 1").unwrap();
        match ServerConfig::load(&bad) {
            Err(e @ ConfigError::Parse { .. }) => assert!(e.to_string().contains("bogus_key")),
            other => panic!("expected a parse error, got {other:?}"),
        }
        std::fs::write(&bad, "max_frame_bytes = 10").unwrap();
        match ServerConfig::load(&bad) {
            Err(e @ ConfigError::Invalid(_)) => {
                assert!(e.to_string().contains("max_frame_bytes"))
            }
            other => panic!("expected an invalid value, got {other:?}"),
        }
        std::fs::write(&bad, "busy_poll_us = 5000000").unwrap();
        match ServerConfig::load(&bad) {
            Err(e @ ConfigError::Invalid(_)) => assert!(e.to_string().contains("busy_poll_us")),
            other => panic!("expected an invalid value, got {other:?}"),
        }
    }
}
