//! Server lifecycle: decide this process's role in its group, bind, reopen
//! hosted partitions, publish addresses, accept connections, heartbeat, run
//! retention, and shut down cleanly (stop accepting, finish queued appends,
//! sync every partition).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use strom_net::Transports;
use strom_proto::{ErrorCode, Request, Response};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::group::{read_group_file, write_atomic};
use crate::host::Host;
use crate::launch::{rank_from_env, rendezvous_file};
use crate::member_auth::{self, Identity};
use crate::members::MemberLink;
use crate::native;
use crate::ownership::{check_group_file, DataDirLock};
use crate::peers::Peers;
use crate::registry::Registry;
use crate::security_sync::{spawn_security_sync, super_users};
use crate::service::{Access, ControlService, DataService, Services};

/// How this process finds the master, if it is not the master itself.
enum Role {
    Master {
        expected: u32,
    },
    Member {
        want: Option<u32>,
        master: MasterSource,
    },
}

#[derive(Clone)]
enum MasterSource {
    GroupFile(PathBuf),
    Rendezvous(PathBuf),
}

impl MasterSource {
    fn resolve(&self) -> Result<String, String> {
        match self {
            MasterSource::GroupFile(p) => {
                let g = read_group_file(p)?;
                g.members
                    .iter()
                    .find(|m| m.id == g.master)
                    .map(|m| m.addr.clone())
                    .ok_or_else(|| format!("group file {} names no master", p.display()))
            }
            MasterSource::Rendezvous(p) => std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .map_err(|e| format!("waiting for rank 0 to write {}: {e}", p.display())),
        }
    }
}

pub struct Server;

/// A running server. Dropping it without [`ServerHandle::shutdown`] leaves
/// the tasks running until the runtime stops.
pub struct ServerHandle {
    state: Arc<Services>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

fn role(config: &ServerConfig) -> Result<(Role, Option<u32>), ServerError> {
    let bad = |m: String| ServerError::coded(ErrorCode::INVALID_ARGUMENT, m);
    if let Some(join) = &config.join {
        let want = crate::member_id::check_join(&config.data_dir, config.member_id)?;
        return Ok((
            Role::Member {
                want,
                master: MasterSource::GroupFile(join.clone()),
            },
            None,
        ));
    }
    let launched = match (config.rank, config.size) {
        (Some(r), Some(s)) => Some((r, s)),
        (None, None) => rank_from_env(),
        _ => return Err(bad("give both rank and size, or neither".into())),
    };
    match launched {
        Some((rank, size)) if size > 1 => {
            let group = config.group_file.clone().ok_or_else(|| {
                bad(format!("rank {rank} of {size}: a launched group needs --group-file on a shared file system"))
            })?;
            let role = if rank == 0 {
                Role::Master { expected: size }
            } else {
                Role::Member {
                    want: Some(rank),
                    master: MasterSource::Rendezvous(rendezvous_file(&group)),
                }
            };
            Ok((role, Some(rank)))
        }
        _ => Ok((Role::Master { expected: 1 }, None)),
    }
}

impl Server {
    /// Binds, reopens every hosted partition, takes its place in the group
    /// and starts serving, over every built-in transport (TCP, shm) with
    /// the configured `max_frame_bytes`.
    /// Must run inside a multi-threaded tokio runtime.
    pub async fn start(config: ServerConfig) -> Result<ServerHandle, ServerError> {
        let transports = with_tls(Transports::new(config.max_frame_bytes), &config)?;
        Self::start_with(config, transports).await
    }

    /// [`start`](Self::start) with the transports to listen on
    /// (`config.listen` names one by its scheme) and to reach the other
    /// members through. Each transport enforces its own frame limit: build
    /// them with `config.max_frame_bytes`, as `start` does.
    pub async fn start_with(
        mut config: ServerConfig,
        transports: Transports,
    ) -> Result<ServerHandle, ServerError> {
        config
            .validate()
            .map_err(|e| ServerError::coded(ErrorCode::INVALID_ARGUMENT, e.to_string()))?;
        if config.exposed_without_auth() {
            tracing::warn!(
                "INSECURE: serving network addresses without authentication (--insecure): anyone who reaches a port may read, write and delete every topic (docs/security.md)"
            );
        }
        crate::fd_budget::apply(&mut config)
            .map_err(|e| ServerError::coded(ErrorCode::INVALID_ARGUMENT, e))?;
        let (role, rank) = role(&config)?;
        if let Some(r) = rank {
            config.data_dir = config.data_dir.join(format!("rank-{r}"));
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            ServerError::io(
                format!("creating data dir {}", config.data_dir.display()),
                e,
            )
        })?;
        let lock = DataDirLock::acquire(&config.data_dir)?;
        if matches!(role, Role::Master { .. }) {
            crate::member_id::record_master(&config.data_dir)?;
        }
        let mut listeners = vec![transports.listen(&config.listen).await?];
        for url in &config.also_listen {
            listeners.push(transports.listen(url).await?);
        }
        if config.default_shm() {
            // Asked for by default, not by the user: without it the server
            // still serves every client, over its other addresses.
            match transports.listen("shm://auto").await {
                Ok(l) => listeners.push(l),
                Err(e) => {
                    tracing::warn!(error = %e, "not serving same-node clients over shared memory")
                }
            }
        }
        let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr()).collect();
        let addr = addrs[0].clone();
        let host = {
            let config = config.clone();
            tokio::task::spawn_blocking(move || Host::open(&config))
                .await
                .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))??
        };
        let host = Arc::new(host);
        let initial_member = match role {
            Role::Master { .. } => 0,
            Role::Member { .. } => u32::MAX,
        };
        // Before the rendezvous and the group file name this server: the
        // servers that join find the secret beside the group file.
        let secret = member_auth::load_secret(
            &config.data_dir,
            config.cluster_secret_file.as_deref(),
            matches!(role, Role::Master { .. }),
            config.group_file.as_deref(),
        )?;
        let claim = match &role {
            Role::Master { .. } => 0,
            Role::Member { want, .. } => want.unwrap_or(member_auth::NO_ID),
        };
        let identity = Arc::new(Identity::new(secret, claim));
        let peers = Peers::new(transports).with_identity(identity);
        let link = Arc::new(MemberLink::new(
            initial_member,
            addrs.clone(),
            host.clone(),
            peers,
        ));
        // A member 0 that took part in a quorum stays in it, whatever it is
        // told now: a registry of its own would split the group.
        let quorum = config.meta_voters > 1
            || matches!(role, Role::Member { .. })
            || crate::quorum_boot::took_part(&config.data_dir);
        let registry = match &role {
            Role::Master { expected } if !quorum => Some(
                Registry::open(
                    &config.data_dir,
                    config.group_file.clone(),
                    *expected,
                    link.clone(),
                )?
                .with_default_lease(config.producer_lease_ms)
                .with_member_timeout(config.member_timeout_ms),
            ),
            _ => None,
        };
        if let (Some(reg), Some(g)) = (&registry, &config.group_file) {
            check_group_file(g, reg.group_id()).await?;
        }
        let (stop, _) = watch::channel(false);
        let mut control = ControlService::new(
            registry,
            link,
            config.max_frame_bytes,
            config.max_batch_bytes,
        );
        if quorum {
            let expected = match role {
                Role::Master { expected } => expected,
                Role::Member { .. } => 1,
            };
            control = control.with_quorum(crate::quorum_boot::place(
                &config,
                expected,
                stop.subscribe(),
            ));
        }
        let quotas = Arc::new(crate::quota::Quotas::default());
        let state = Arc::new(Services {
            data: DataService::new(host, &config, quotas.clone()),
            quotas,
            access: Access::new(config.auth, super_users(&config)),
            audit: crate::audit::AuditLog::new(config.auth),
            control,
            config,
            stats: Default::default(),
            left: watch::Sender::new(false),
            _lock: lock,
        });
        let slots = Arc::new(tokio::sync::Semaphore::new(
            state.config.max_connections as usize,
        ));
        crate::security_sync::load_local(&state).await;
        let mut tasks: Vec<JoinHandle<()>> = listeners
            .into_iter()
            .map(|l| spawn_accept(l, state.clone(), slots.clone(), stop.subscribe()))
            .collect();
        tasks.push(spawn_retention(state.clone(), stop.subscribe()));
        tasks.extend(spawn_security_sync(state.clone(), stop.subscribe()));
        tasks.push(crate::quota::sync::spawn(state.clone(), stop.subscribe()));
        tasks.extend(crate::audit::writer::spawn(state.clone(), stop.subscribe()));
        if quorum {
            crate::quorum_boot::boot(&state, matches!(role, Role::Master { .. })).await?;
        }
        match role {
            Role::Master { expected } => {
                if let (true, Some(g)) = (expected > 1, &state.config.group_file) {
                    write_atomic(&rendezvous_file(g), addr.as_bytes())?;
                }
                if let Some(reg) = state.control.master_registry() {
                    reg.publish_initial().await;
                }
                tasks.push(spawn_lease_loop(state.clone(), stop.subscribe()));
                if quorum {
                    let source = state.config.group_file.clone().map(MasterSource::GroupFile);
                    tasks.push(tokio::spawn(membership(
                        state.clone(),
                        Some(0),
                        source,
                        stop.subscribe(),
                    )));
                }
            }
            Role::Member { want, master } => {
                tasks.push(spawn_lease_loop(state.clone(), stop.subscribe()));
                tasks.push(tokio::spawn(membership(
                    state.clone(),
                    want,
                    Some(master),
                    stop.subscribe(),
                )));
            }
        }
        tracing::info!(addr = %addr, also = ?&addrs[1..], data_dir = %state.config.data_dir.display(), master = state.control.master_registry().is_some(), "strom server listening");
        Ok(ServerHandle { state, stop, tasks })
    }
}

/// Accepts connections from `listener` until `stopped`, serving each in
/// its own task while a connection slot is free.
fn spawn_accept(
    mut listener: Box<dyn strom_net::Listener>,
    state: Arc<Services>,
    slots: Arc<tokio::sync::Semaphore>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut refused = 0u64;
        let mut failures = crate::accept_errors::AcceptErrors::new("native");
        loop {
            tokio::select! {
                c = listener.accept() => match c {
                    Ok(c) => match slots.clone().try_acquire_owned() {
                        Ok(slot) => { tokio::spawn(native::serve(c, state.clone(), slot)); }
                        Err(_) => {
                            refused += 1;
                            if refused.is_power_of_two() {
                                tracing::warn!(peer = %c.peer, refused, limit = state.config.max_connections, "connection limit reached; closing new connections (max_connections)");
                            }
                        }
                    },
                    Err(e) => {
                        failures.failed(&e);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = stopped.changed() => break,
            }
        }
    })
}

fn spawn_retention(state: Arc<Services>, mut stopped: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_millis(state.config.retention_check_ms.max(10));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.changed() => break,
            }
            let s = state.clone();
            let _ = tokio::task::spawn_blocking(move || s.data.host().enforce_retention(now_us()))
                .await;
        }
    })
}

/// On the master: expires producers whose lease ran out and consumers
/// whose session did, and moves partitioned groups' partitions, every
/// 250 ms. A tick that comes late (the process was stalled) first extends
/// every lease and session by the delay, so a stalled master expires no
/// live producer or consumer.
fn spawn_lease_loop(state: Arc<Services>, mut stopped: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_millis(250);
        let mut last = std::time::Instant::now();
        let mut roles_sent = std::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.changed() => break,
            }
            let Some(reg) = state.control.master_registry() else {
                // Not the master (now): with a quorum, this member may lead later.
                if !state.control.has_quorum() {
                    break;
                }
                last = std::time::Instant::now();
                continue;
            };
            let late = last.elapsed().saturating_sub(every);
            last = std::time::Instant::now();
            if late > Duration::from_secs(1) {
                tracing::warn!(
                    late_ms = late.as_millis() as u64,
                    "lease loop ran late; extending producer leases by the delay"
                );
                reg.extend_leases(late).await;
                reg.extend_sessions(late).await;
                continue;
            }
            state.control.link().set_master(state.control.addr());
            state.stats.leases_expired(reg.expire_due().await);
            reg.expire_consumers().await;
            reg.rebalance_groups().await;
            reg.fail_over().await;
            reg.advance_moves().await;
            if roles_sent.elapsed() >= crate::registry::ROLES_EVERY {
                roles_sent = std::time::Instant::now();
                reg.resend_roles().await;
            }
        }
    })
}

/// A member's life in the group: join the master (under its previous id
/// after a restart), then heartbeat; rejoin whenever the master is lost.
async fn membership(
    state: Arc<Services>,
    want: Option<u32>,
    source: Option<MasterSource>,
    mut stopped: watch::Receiver<bool>,
) {
    let id_file = state.config.data_dir.join(crate::member_id::FILE);
    let mut want = want.or_else(|| crate::member_id::read(&state.config.data_dir));
    let every = Duration::from_millis(state.config.heartbeat_ms);
    let mut joined: Option<(u32, String)> = None;
    // Until its first join, this process is a restarted member to the
    // registry (its replicas may have lost what they held).
    let mut restarted = true;
    loop {
        if state.control.master_registry().is_some() {
            // This member leads the quorum: it is alive by definition.
            joined = None;
        } else if let Err(e) = heartbeat_once(
            &state,
            &mut joined,
            &mut want,
            &mut restarted,
            &source,
            &id_file,
        )
        .await
        {
            if e.contains(ErrorCode::MEMBER_REMOVED.name()) {
                tracing::warn!(error = %e, "this member left the group; stopping");
                state.left.send_replace(true);
                return;
            }
            tracing::warn!(error = %e, "cannot reach the registry master; retrying");
            joined = None;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopped.changed() => return,
        }
    }
}

/// Joins the group (if not joined) or heartbeats to the master once.
async fn heartbeat_once(
    state: &Services,
    joined: &mut Option<(u32, String)>,
    want: &mut Option<u32>,
    restarted: &mut bool,
    source: &Option<MasterSource>,
    id_file: &std::path::Path,
) -> Result<(), String> {
    // With a quorum, the leader this member knows of is where to go.
    // (Not this member itself: after a restart it may still remember
    // leading, from its last vote.)
    let me = state.control.member();
    let hint = state
        .control
        .leader_hint()
        .filter(|(id, _)| *id != me)
        .map(|(_, a)| a);
    if let (Some(h), Some((_, master))) = (&hint, joined.as_ref()) {
        if h != master {
            *joined = None;
        }
    }
    {
        let result = match &*joined {
            None => join_once(state, *want, *restarted, source, hint)
                .await
                .map(|(id, master)| {
                    *restarted = false;
                    // Kept in the data dir, also when the id was asked
                    // for (`--member-id`, a launcher's rank).
                    if *want != Some(id) || !id_file.exists() {
                        let _ = write_atomic(id_file, id.to_string().as_bytes());
                    }
                    *want = Some(id);
                    state.control.link().set_member(id);
                    state.control.link().set_master(&master);
                    *joined = Some((id, master));
                }),
            Some((id, master)) => {
                let req = Request::Heartbeat {
                    member: *id,
                    addr: state.control.addr().to_string(),
                    addrs: state.control.link().addrs(),
                };
                state
                    .control
                    .link()
                    .peers()
                    .call(master, &req)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{}: {e}", e.code()))
            }
        };
        result
    }
}

async fn join_once(
    state: &Services,
    want: Option<u32>,
    restarted: bool,
    source: &Option<MasterSource>,
    hint: Option<String>,
) -> Result<(u32, String), String> {
    let master = match (hint, source) {
        (Some(h), _) => h,
        (None, Some(s)) => s.resolve()?,
        (None, None) => return Err("no metadata leader is known yet".into()),
    };
    let identity = state.control.link().peers().identity().clone();
    let kept = state.config.data_dir.join(member_auth::SECRET_FILE);
    if !kept.exists() && state.config.cluster_secret_file.is_none() {
        // Read again before each join: a stale file from an earlier group
        // fails its proof until member 0 writes this group's.
        let group = state
            .config
            .join
            .as_ref()
            .or(state.config.group_file.as_ref());
        match group.map(|g| (g, member_auth::secret_beside(g))) {
            Some((_, Ok(s))) => identity.set_secret(s),
            Some((g, Err(e))) => {
                return Err(format!(
                    "no cluster secret to prove membership with: {e} (member 0 writes {}; or pass --cluster-secret-file)",
                    member_auth::beside(g).display()
                ))
            }
            None => return Err("no cluster secret: pass --cluster-secret-file".into()),
        }
    }
    identity.set_claim(want.unwrap_or(member_auth::NO_ID));
    let req = Request::Join {
        member: want,
        addr: state.control.addr().to_string(),
        addrs: state.control.link().addrs(),
        restarted,
    };
    match state.control.link().peers().call(&master, &req).await {
        Ok(Response::Joined { member, .. }) => {
            tracing::info!(member, master = %master, "joined the group");
            if let (false, Some(s)) = (kept.exists(), identity.secret()) {
                s.write(&kept).map_err(|e| e.to_string())?;
            }
            Ok((member, master))
        }
        Ok(other) => Err(format!("unexpected answer to join: {other:?}")),
        Err(e) => Err(format!("{}: {e}", e.code())),
    }
}

pub(crate) use strom_storage::now_us;

impl ServerHandle {
    /// The address the server actually bound (its primary one).
    pub fn addr(&self) -> &str {
        self.state.control.addr()
    }

    /// Every address the server listens on, the primary first.
    pub fn addrs(&self) -> Vec<String> {
        self.state.control.link().addrs()
    }

    /// Publishes an address a front end started beside the native one
    /// serves (e.g. `kafka://host:port`): in the group file at once on the
    /// master, with the next heartbeat on another member. Clients skip
    /// schemes they have no transport for.
    pub async fn advertise(&self, url: &str) {
        if self.state.control.link().advertise(url) {
            if let Some(reg) = self.state.control.master_registry() {
                reg.refresh_own_addrs().await;
            }
        }
    }

    /// Resolves once this member has left its group (`strom member drain`
    /// moved everything off it, or `remove` dropped it): time to stop.
    pub async fn left(&self) {
        let mut left = self.state.left.subscribe();
        let _ = left.wait_for(|l| *l).await;
    }

    /// The server's services, for front ends started beside the native
    /// one (the HTTP endpoint).
    pub fn services(&self) -> Arc<Services> {
        self.state.clone()
    }

    /// This server's member id in its group (0 for the master).
    pub fn member(&self) -> u32 {
        self.state.control.member()
    }

    /// Stops accepting, finishes queued appends and syncs every partition.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.data.host().shutdown()).await;
        tracing::info!(addr = %self.state.control.addr(), "strom server stopped");
    }
}

/// `transports` serving `tls://` with the configured certificate (and
/// trusting other members by `tls_ca`, else the client CA, else the
/// certificate itself), if one is configured.
fn with_tls(transports: Transports, config: &ServerConfig) -> Result<Transports, ServerError> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(transports);
    };
    let bad =
        |e: strom_net::NetError| ServerError::coded(ErrorCode::INVALID_ARGUMENT, e.to_string());
    let ca = config
        .tls_ca
        .as_ref()
        .or(config.tls_client_ca.as_ref())
        .unwrap_or(cert);
    let tls = strom_net::TlsTransport::new(config.max_frame_bytes)
        .with_server(cert, key, config.tls_client_ca.as_deref())
        .map_err(bad)?;
    // Members present the server certificate when a client CA is required.
    let own = config
        .tls_client_ca
        .as_ref()
        .map(|_| (cert.as_path(), key.as_path()));
    let tls = tls.with_client(ca, own).map_err(bad)?;
    Ok(transports.with("tls", Arc::new(tls)))
}

#[cfg(test)]
mod tests {
    use strom_net::{MemTransport, MuxConn, OutFrame};

    use super::*;
    use crate::peers::tests::hello;

    fn config(dir: &std::path::Path) -> ServerConfig {
        ServerConfig {
            data_dir: dir.to_path_buf(),
            ..Default::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn peer_calls_use_the_configured_max_frame_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(ServerConfig {
            max_frame_bytes: 8192,
            ..config(dir.path())
        })
        .await
        .unwrap();
        // A peer of its own group (itself: the member handshake passes).
        let member = server.addr().to_string();
        let big = hello(&"x".repeat(10_000));
        let e = server
            .state
            .control
            .link()
            .peers()
            .call(&member, &big)
            .await;
        let e = e.unwrap_err().to_string();
        assert!(e.contains("maximum frame size of 8192"), "{e}");
        server.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_listens_on_whatever_transport_its_listen_url_names() {
        let dir = tempfile::tempdir().unwrap();
        let transports = Transports::default().with("mem", Arc::new(MemTransport::default()));
        let server = Server::start_with(
            ServerConfig {
                listen: "mem://solo".into(),
                ..config(dir.path())
            },
            transports.clone(),
        )
        .await
        .unwrap();
        assert_eq!(server.addr(), "mem://solo");
        let conn = transports.connect(server.addr()).await.unwrap();
        let mux: Arc<MuxConn> = MuxConn::start(conn, server.addr());
        let reply = mux
            .call(OutFrame::request(
                strom_proto::MIN_PROTOCOL_VERSION,
                0,
                &Request::Limits,
            ))
            .await
            .unwrap();
        let limits =
            Response::decode(reply.header.version, reply.header.opcode, &reply.body).unwrap();
        assert!(matches!(limits, Response::Limits { .. }), "{limits:?}");
        server.shutdown().await;
    }
}
