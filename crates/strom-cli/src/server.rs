//! `strom server`: run one server process until SIGTERM or SIGINT, then shut
//! down cleanly (stop accepting, finish queued appends, sync, exit 0).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use strom_server::{Server, ServerConfig};

#[derive(Args)]
pub struct ServerArgs {
    /// TOML configuration file; flags below override its values.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory (registry and file partitions).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port. This primary address
    /// is what other members use (TCP in a multi-node group).
    #[arg(long)]
    listen: Option<String>,
    /// Also serve clients on this address (repeatable), e.g. `shm://auto`
    /// for clients on this node. Every address goes into the group file and
    /// clients pick the best one they can reach.
    #[arg(long = "also-listen", value_name = "URL")]
    also_listen: Vec<String>,
    /// Do not serve same-node clients over shared memory. By default a
    /// server also listens on a private `shm://auto` socket, which clients
    /// on this node of the server's user prefer (config key `shm`).
    #[arg(long)]
    no_shm: bool,
    /// Join the running group of this group file as a new member.
    #[arg(long)]
    join: Option<PathBuf>,
    /// With --join: take this member id, to replace a dead member (start
    /// on an empty data dir; the replicas it held are copied again).
    #[arg(long, value_name = "N")]
    member_id: Option<u32>,
    /// The group's cluster secret (a file, 0600), which members prove to
    /// each other when they connect. Default: the copy in the data dir,
    /// else `<group file>.secret`, which the group's first server writes.
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// Serve /metrics (Prometheus), the dashboard (/) and its JSON API on
    /// this HOST:PORT; port 0 picks a free port.
    #[arg(long)]
    http_listen: Option<String>,
    /// Microseconds each connection keeps polling for its next request
    /// before its thread may sleep: lower latency for up to this much CPU
    /// after every request (0 = never; config key `busy_poll_us`).
    #[arg(long, value_name = "US")]
    busy_poll_us: Option<u64>,
    /// Serve the Kafka wire protocol (kcat, librdkafka, confluent-kafka) on
    /// this HOST:PORT; port 0 picks a free port (docs/kafka.md).
    #[arg(long)]
    kafka_listen: Option<String>,
    /// How long the first rebalance of an empty Kafka group waits for more
    /// members to join (config key `kafka_group_initial_rebalance_delay_ms`;
    /// default 3000, as Kafka's `group.initial.rebalance.delay.ms`; 0 = none).
    #[arg(long, value_name = "MS")]
    kafka_group_initial_rebalance_delay_ms: Option<u64>,
    /// Replicate the topic registry with Raft over this many members (1, 3
    /// or 5; config key `meta_voters`). With 3 or 5, the group keeps its
    /// registry when any minority of them dies, member 0 included.
    #[arg(long, value_name = "N")]
    meta_voters: Option<u32>,
    /// A member unheard for this long is dead and its replicated
    /// partitions fail over (config key `member_timeout_ms`; default 3000).
    #[arg(long, value_name = "MS")]
    member_timeout_ms: Option<u64>,
    /// Copy closed segments of file partitions to this directory (a
    /// parallel file system, any mounted path) and read old offsets back
    /// from it (config key `tier_dir`; docs/tiering.md).
    #[arg(long, value_name = "DIR")]
    tier_dir: Option<PathBuf>,
    /// Run no in-transit transforms in this process (config key
    /// `transforms = false`; docs/transforms.md).
    #[arg(long)]
    no_transforms: bool,
    /// The same to an object store: `s3://bucket/prefix` (AWS_* variables
    /// for credentials and endpoint) or `file:///path` (config key
    /// `tier_url`).
    #[arg(long, value_name = "URL")]
    tier_url: Option<String>,
    /// Authenticate every connection (tokens, same-node uids, members) and
    /// check every request against the ACLs (config key `auth`;
    /// docs/security.md). Needed to serve a non-loopback address.
    #[arg(long)]
    auth: bool,
    /// Serve non-loopback addresses without --auth: anyone who reaches a
    /// port may read, write and delete everything (config key `insecure`).
    #[arg(long)]
    insecure: bool,
    /// A principal allowed everything (User:NAME or uid:N; repeatable;
    /// config key `super_users`). The server's own uid always is one.
    #[arg(long = "super-user", value_name = "PRINCIPAL")]
    super_users: Vec<String>,
    /// This server's certificate chain (PEM) for `tls://` listen addresses
    /// (config key `tls_cert`; docs/security.md).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM; config key `tls_key`).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require TLS clients to present a certificate chaining to this CA;
    /// its common name is the principal (config key `tls_client_ca`).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serve the Kafka listener over TLS with --tls-cert (Kafka clients'
    /// SSL and SASL_SSL; config key `kafka_tls`).
    #[arg(long, requires = "tls_cert")]
    kafka_tls: bool,
    /// Serve the HTTP endpoint (--http-listen) over TLS with --tls-cert
    /// (config key `http_tls`).
    #[arg(long, requires = "tls_cert")]
    http_tls: bool,
}

pub fn run(
    args: ServerArgs,
    group_file: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(p) => ServerConfig::load(p)?,
        None => ServerConfig::default(),
    };
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(l) = args.listen {
        config.listen = l;
    }
    config.also_listen.extend(args.also_listen);
    config.shm &= !args.no_shm;
    if group_file.is_some() {
        config.group_file = group_file;
    }
    if args.join.is_some() {
        config.join = args.join;
    }
    if args.member_id.is_some() {
        config.member_id = args.member_id;
    }
    if args.cluster_secret_file.is_some() {
        config.cluster_secret_file = args.cluster_secret_file;
    }
    if let Some(us) = args.busy_poll_us {
        config.busy_poll_us = us;
    }
    if args.http_listen.is_some() {
        config.http_listen = args.http_listen;
    }
    if args.kafka_listen.is_some() {
        config.kafka_listen = args.kafka_listen;
    }
    if let Some(ms) = args.kafka_group_initial_rebalance_delay_ms {
        config.kafka_group_initial_rebalance_delay_ms = ms;
    }
    if let Some(n) = args.meta_voters {
        config.meta_voters = n;
    }
    if let Some(ms) = args.member_timeout_ms {
        config.member_timeout_ms = ms;
    }
    if args.tier_dir.is_some() {
        config.tier_dir = args.tier_dir;
    }
    if args.tier_url.is_some() {
        config.tier_url = args.tier_url;
    }
    if args.no_transforms {
        config.transforms = false;
    }
    config.auth |= args.auth;
    config.insecure |= args.insecure;
    config.super_users.extend(args.super_users);
    config.kafka_tls |= args.kafka_tls;
    config.http_tls |= args.http_tls;
    for (key, value) in [
        (&mut config.tls_cert, args.tls_cert),
        (&mut config.tls_key, args.tls_key),
        (&mut config.tls_client_ca, args.tls_client_ca),
        (&mut config.tls_ca, tls_ca),
    ] {
        if value.is_some() {
            *key = value;
        }
    }
    let launching_user = crate::launch_auth::launcher_defaults(&mut config);
    config.validate()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("strom-server")
        .enable_all()
        .build()
        .context("starting the server runtime")?;
    let group_file = config.group_file.clone().or(config.join.clone());
    let run_transforms = config.transforms;
    let max_transform_workers = config.max_transform_workers;
    rt.block_on(async move {
        let http_listen = config.http_listen.clone();
        let kafka_listen = config.kafka_listen.clone();
        // Before the group file tells anyone the server is up: a SIGTERM
        // from then on is a clean shutdown.
        let signals = Signals::install()?;
        let server = Server::start(config).await?;
        eprintln!("strom server listening on {}", server.addrs().join(" "));
        if let (Some(user), Some(group)) = (&launching_user, &group_file) {
            let path = crate::launch_auth::token_beside(group);
            let secret = strom_server::member_auth::beside(group);
            match crate::launch_auth::write_token(&path, &secret, user) {
                Ok(()) => eprintln!(
                    "strom server: a token for User:{user} (a super user of this group): export STROM_TOKEN_FILE={}",
                    path.display()
                ),
                Err(e) => tracing::warn!(error = %e, "could not write the launching user's token"),
            }
        }
        let http = match http_listen {
            Some(addr) => match strom_http::serve(server.services(), &addr).await {
                Ok(h) => {
                    eprintln!("strom http listening on {}", h.url());
                    Some(h)
                }
                Err(e) => {
                    server.shutdown().await;
                    return Err(e.into());
                }
            },
            None => None,
        };
        let kafka = match kafka_listen {
            Some(addr) => match strom_kafka::serve(server.services(), &addr).await {
                Ok(k) => {
                    eprintln!("strom kafka listening on {}", k.addr());
                    // Other members list this broker in their Metadata.
                    server.advertise(k.url()).await;
                    Some(k)
                }
                Err(e) => {
                    server.shutdown().await;
                    return Err(e.into());
                }
            },
            None => None,
        };
        // Built-in transforms of the source partitions this member leads.
        let services = server.services();
        let minter = server.services();
        let transforms = run_transforms.then(|| {
            strom_client::transform::host::TransformHost::start(
                group_file,
                server.addr().to_string(),
                move || services.control.member(),
                max_transform_workers,
                Box::new(move || minter.internal_token()),
            )
        });
        tokio::select! {
            _ = signals.wait() => {}
            _ = server.left() => eprintln!("strom server: this member left its group (drained or removed); stopping"),
        }
        tracing::info!("shutting down");
        if let Some(t) = transforms {
            tokio::task::block_in_place(|| t.stop());
        }
        if let Some(k) = kafka {
            k.shutdown().await;
        }
        if let Some(h) = http {
            h.shutdown().await;
        }
        server.shutdown().await;
        Ok::<_, anyhow::Error>(())
    })?;
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    Ok(())
}

/// SIGTERM and SIGINT, caught from [`Signals::install`] on.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
