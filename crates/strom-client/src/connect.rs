//! How a [`Driver`] comes to be: from a group file, a server address, a
//! Kafka bootstrap list (`kafka://`), or a server embedded in this
//! process. This is where a backend is chosen; everything after calls it
//! through the backend traits (`backend.rs`).

use std::path::Path;
use std::sync::Arc;

use strom_net::Transports;
use strom_proto::GroupFile;

use crate::credentials::token_from_env;
#[cfg(feature = "embedded")]
use crate::driver::wait;
use crate::driver::{runtime, Driver, KAFKA_SCHEME};
use crate::error::{Error, Result};
use crate::native::Native;

impl Driver {
    /// Connects to the group described by a group file, over TCP.
    pub fn connect(group_file: impl AsRef<Path>) -> Result<Driver> {
        Self::connect_with(group_file, Transports::default())
    }

    /// Connects to the group described by a group file, reaching each
    /// member through the transport its address's scheme names.
    pub fn connect_with(group_file: impl AsRef<Path>, transports: Transports) -> Result<Driver> {
        Self::connect_as(group_file, transports, token_from_env()?)
    }

    /// [`connect_with`](Self::connect_with), presenting `token` (a Strom
    /// token, docs/security.md) on every connection instead of the one
    /// `STROM_TOKEN` or `STROM_TOKEN_FILE` gives; `None`: none.
    pub fn connect_as(
        group_file: impl AsRef<Path>,
        transports: Transports,
        token: Option<String>,
    ) -> Result<Driver> {
        let path = group_file.as_ref();
        let text = std::fs::read(path).map_err(|e| {
            Error::GroupFile(format!("cannot read group file {}: {e}", path.display()))
        })?;
        let group: GroupFile = serde_json::from_slice(&text).map_err(|e| {
            Error::GroupFile(format!("group file {} is not valid: {e}", path.display()))
        })?;
        let master = group
            .members
            .iter()
            .find(|m| m.id == group.master)
            .ok_or_else(|| {
                Error::GroupFile(format!(
                    "group file {} names no master member",
                    path.display()
                ))
            })?;
        let d = Self::start(master.addr.clone(), transports, token)?;
        d.learn(group.members.iter().map(|m| (&m.addr, &m.addrs)));
        d.know_members(group.members.iter().map(|m| m.addr.clone()));
        *d.inner.group_file.lock() = Some(path.to_path_buf());
        d.connect_master()?;
        Ok(d)
    }

    /// Connects to the server holding the registry at `host:port`, over TCP.
    pub fn connect_addr(addr: &str) -> Result<Driver> {
        Self::connect_addr_with(addr, Transports::default())
    }

    /// Connects to the server holding the registry at `addr` (`host:port`
    /// or `scheme://…`) through `transports`.
    pub fn connect_addr_with(addr: &str, transports: Transports) -> Result<Driver> {
        if let Some(bootstrap) = addr.strip_prefix(KAFKA_SCHEME) {
            return Self::connect_kafka(bootstrap);
        }
        Self::connect_addr_as(addr, transports, token_from_env()?)
    }

    /// [`connect_addr_with`](Self::connect_addr_with) presenting `token`
    /// (none: `None`) instead of the environment's.
    pub fn connect_addr_as(
        addr: &str,
        transports: Transports,
        token: Option<String>,
    ) -> Result<Driver> {
        let d = Self::start(addr.to_string(), transports, token)?;
        d.connect_master()?;
        Ok(d)
    }

    /// Connects to a Kafka cluster (`bootstrap`: `host:port[,host:port…]`)
    /// through librdkafka: topics, producers and consumers keep their API,
    /// with events mapped to records as docs/kafka.md describes ("Client
    /// adapter"). Needs the `kafka` feature.
    pub fn connect_kafka(bootstrap: &str) -> Result<Driver> {
        #[cfg(feature = "kafka")]
        {
            let rt = runtime()?;
            let kafka = crate::kafka::KafkaDriver::connect(bootstrap, rt.handle().clone())?;
            let master = format!("{KAFKA_SCHEME}{bootstrap}");
            Ok(Self::with_runtime(
                rt,
                master,
                Transports::default(),
                Arc::new(kafka),
                None,
            ))
        }
        #[cfg(not(feature = "kafka"))]
        Err(Error::InvalidArgument(format!(
            "cannot connect to Kafka at {bootstrap}: this build of the Strom client has no `kafka` feature (build strom with `--features kafka`; make test does)"
        )))
    }

    /// Starts a server inside this process, with its data in `dir`, and
    /// connects to it. Nothing else needs to run. The server stands alone
    /// also inside an MPI or Slurm job: the launcher's rank variables, which
    /// make `strom server` processes form a group, are ignored here.
    #[cfg(feature = "embedded")]
    pub fn embedded(dir: impl AsRef<Path>) -> Result<Driver> {
        Self::embedded_with(strom_server::ServerConfig {
            data_dir: dir.as_ref().to_path_buf(),
            rank: Some(0),
            size: Some(1),
            ..Default::default()
        })
    }

    /// Stops the embedded server now, as dropping the last clone of the
    /// driver would: it syncs and closes its partitions. Call it before
    /// removing the server's directory; requests after it fail. Without an
    /// embedded server it does nothing.
    #[cfg(feature = "embedded")]
    pub fn stop_embedded(&self) {
        let Some(server) = self.inner.embedded.lock().take() else {
            return;
        };
        let handle = self.inner.handle.clone();
        let _ = std::thread::scope(|s| s.spawn(|| handle.block_on(server.shutdown())).join());
    }

    /// [`embedded`](Self::embedded) with a full server configuration.
    #[cfg(feature = "embedded")]
    pub fn embedded_with(config: strom_server::ServerConfig) -> Result<Driver> {
        let rt = runtime()?;
        let server = wait(rt.handle(), strom_server::Server::start(config))?
            .map_err(|e| Error::coded(e.code(), format!("embedded server failed to start: {e}")))?;
        let d = Self::with_runtime(
            rt,
            server.addr().to_string(),
            Transports::default(),
            Arc::new(Native),
            token_from_env()?,
        );
        *d.inner.embedded.lock() = Some(server);
        d.block_on({
            let d = d.clone();
            async move { d.reach_master().await }
        })?;
        Ok(d)
    }

    /// [`embedded_with`](Self::embedded_with), with the transports the
    /// server listens on (`config.listen` names one by its scheme) and the
    /// driver connects through. With an in-process transport
    /// ([`MemTransport`](strom_net::MemTransport), `listen = "mem://name"`)
    /// no socket is opened at all.
    #[cfg(feature = "embedded")]
    pub fn embedded_over(
        config: strom_server::ServerConfig,
        transports: Transports,
    ) -> Result<Driver> {
        let rt = runtime()?;
        let start = strom_server::Server::start_with(config, transports.clone());
        let server = wait(rt.handle(), start)?
            .map_err(|e| Error::coded(e.code(), format!("embedded server failed to start: {e}")))?;
        let d = Self::with_runtime(
            rt,
            server.addr().to_string(),
            transports,
            Arc::new(Native),
            token_from_env()?,
        );
        *d.inner.embedded.lock() = Some(server);
        d.block_on({
            let d = d.clone();
            async move { d.reach_master().await }
        })?;
        Ok(d)
    }

    /// A driver whose registry master is at `master`, not connected yet.
    fn start(master: String, transports: Transports, token: Option<String>) -> Result<Driver> {
        Ok(Self::with_runtime(
            runtime()?,
            master,
            transports,
            Arc::new(Native),
            token,
        ))
    }
}
