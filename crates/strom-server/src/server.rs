//! Server lifecycle: bind, write the group file, accept connections, run
//! retention, and shut down cleanly (stop accepting, finish queued appends,
//! sync every partition).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use strom_net::{TcpTransport, Transport};
use strom_proto::{GroupFile, GroupMember};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ServerConfig;
use crate::conn;
use crate::error::ServerError;
use crate::group::write_group_file;
use crate::registry::Registry;

/// State shared by every connection of one server process.
pub struct State {
    pub config: ServerConfig,
    pub registry: Registry,
    pub member: u32,
    pub addr: String,
}

impl State {
    pub fn members(&self) -> Vec<GroupMember> {
        vec![GroupMember {
            id: self.member,
            addr: self.addr.clone(),
        }]
    }
}

pub struct Server;

/// A running server. Dropping it without [`ServerHandle::shutdown`] leaves
/// the tasks running until the runtime stops.
pub struct ServerHandle {
    state: Arc<State>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds, recovers every partition, writes the group file and starts
    /// serving. Must run inside a multi-threaded tokio runtime.
    pub async fn start(config: ServerConfig) -> Result<ServerHandle, ServerError> {
        config
            .validate()
            .map_err(|e| ServerError::coded(strom_proto::ErrorCode::INVALID_ARGUMENT, e))?;
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            ServerError::io(
                format!("creating data dir {}", config.data_dir.display()),
                e,
            )
        })?;
        let transport = TcpTransport {
            max_frame: config.max_frame_bytes,
        };
        let mut listener = transport.listen(&config.listen).await?;
        let addr = listener.local_addr();
        let registry = {
            let (config, addr) = (config.clone(), addr.clone());
            tokio::task::spawn_blocking(move || Registry::open(&config, 0, addr))
                .await
                .map_err(|e| {
                    ServerError::coded(strom_proto::ErrorCode::INTERNAL, e.to_string())
                })??
        };
        let state = Arc::new(State {
            config,
            registry,
            member: 0,
            addr: addr.clone(),
        });
        if let Some(path) = &state.config.group_file {
            write_group_file(
                path,
                &GroupFile {
                    members: state.members(),
                    master: 0,
                },
            )?;
        }
        let (stop, mut stopped) = watch::channel(false);
        let accept_state = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                tokio::select! {
                    c = listener.accept() => match c {
                        Ok(c) => { tokio::spawn(conn::serve(c, accept_state.clone())); }
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    _ = stopped.changed() => break,
                }
            }
        });
        let retention_state = state.clone();
        let mut stopped = stop.subscribe();
        let retention = tokio::spawn(async move {
            let every = Duration::from_millis(retention_state.config.retention_check_ms.max(10));
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stopped.changed() => break,
                }
                let s = retention_state.clone();
                let _ = tokio::task::spawn_blocking(move || s.registry.enforce_retention(now_us()))
                    .await;
            }
        });
        tracing::info!(addr = %addr, data_dir = %state.config.data_dir.display(), "strom server listening");
        Ok(ServerHandle {
            state,
            stop,
            tasks: vec![accept, retention],
        })
    }
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl ServerHandle {
    /// The address the server actually bound.
    pub fn addr(&self) -> &str {
        &self.state.addr
    }

    /// Stops accepting, finishes queued appends and syncs every partition.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.registry.shutdown()).await;
        tracing::info!(addr = %self.state.addr, "strom server stopped");
    }
}
