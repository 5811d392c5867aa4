//! Transports by URL scheme.
//!
//! An address is `scheme://rest`, and the scheme picks the transport that
//! gets `rest`; a bare `host:port` means `tcp`. A server listens, and its
//! clients and peers connect, through one [`Transports`] registry, so a new
//! transport (shared memory, libfabric) is one [`Transports::with`] away
//! from every caller.
//!
//! A listener's `local_addr` is an address the same registry resolves back
//! to it: a bare `host:port` for TCP (so group files stay as they were) and
//! `scheme://…` for any other transport.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{Conn, Listener, NetError, ShmTransport, TcpTransport, Transport};

/// The scheme of a bare `host:port` address.
pub const DEFAULT_SCHEME: &str = "tcp";

/// Transports keyed by URL scheme. Cheap to clone.
#[derive(Clone)]
pub struct Transports {
    by_scheme: Arc<Vec<(String, Arc<dyn Transport>)>>,
    busy_poll: Duration,
}

/// Environment variable: the default [`Transports::busy_poll`], in µs.
pub const BUSY_POLL_ENV: &str = "STROM_BUSY_POLL_US";

impl Transports {
    /// Only TCP, enforcing `max_frame` on every frame read or written.
    pub fn tcp(max_frame: u32) -> Self {
        Transports {
            by_scheme: Arc::new(Vec::new()),
            busy_poll: busy_poll_from_env(),
        }
        .with(DEFAULT_SCHEME, Arc::new(TcpTransport { max_frame }))
    }

    /// Every transport this build has: TCP, `shm` for clients on the
    /// server's node and, with the `ofi` feature, libfabric's `ofi+tcp`,
    /// `ofi+shm`, `ofi+verbs` and `ofi+cxi`, each enforcing `max_frame`.
    pub fn new(max_frame: u32) -> Self {
        let t = Self::tcp(max_frame)
            .with("shm", Arc::new(ShmTransport::new(max_frame)))
            .with("tls", Arc::new(crate::TlsTransport::for_clients(max_frame)));
        // libfabric providers open lazily: a scheme whose provider this
        // machine lacks fails on connect or listen, not here.
        #[cfg(feature = "ofi")]
        let t = [
            crate::OfiTransport::tcp(max_frame),
            crate::OfiTransport::shm(max_frame),
            crate::OfiTransport::verbs(max_frame),
            crate::OfiTransport::cxi(max_frame),
        ]
        .into_iter()
        .fold(t, |t, o| t.with(o.name(), Arc::new(o)));
        t
    }

    /// This registry with `transport` serving `scheme` (replacing any
    /// transport registered for it).
    pub fn with(self, scheme: &str, transport: Arc<dyn Transport>) -> Self {
        let mut by_scheme: Vec<_> = self
            .by_scheme
            .iter()
            .filter(|(s, _)| s != scheme)
            .cloned()
            .collect();
        by_scheme.push((scheme.to_string(), transport));
        Transports {
            by_scheme: Arc::new(by_scheme),
            busy_poll: self.busy_poll,
        }
    }

    /// This registry with connections whose readers busy-poll for `window`
    /// after each frame before their thread may sleep (zero: never).
    /// Defaults to `STROM_BUSY_POLL_US`, else zero. See [`crate::spin`].
    pub fn with_busy_poll(mut self, window: Duration) -> Self {
        self.busy_poll = window;
        self
    }

    /// How long a connection's reader busy-polls after each frame.
    pub fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    /// The schemes this registry knows.
    pub fn schemes(&self) -> impl Iterator<Item = &str> {
        self.by_scheme.iter().map(|(s, _)| s.as_str())
    }

    /// The transport for `url` and the address it is given (`url` without
    /// its scheme).
    pub fn resolve<'a>(&self, url: &'a str) -> Result<(&Arc<dyn Transport>, &'a str), NetError> {
        let (scheme, rest) = url.split_once("://").unwrap_or((DEFAULT_SCHEME, url));
        self.by_scheme
            .iter()
            .find(|(s, _)| s == scheme)
            .map(|(_, t)| (t, rest))
            .ok_or_else(|| NetError::UnknownScheme {
                scheme: scheme.to_string(),
                known: self.schemes().collect::<Vec<_>>().join(", "),
            })
    }

    /// The addresses of `urls` this registry can use, best first: shared
    /// memory, then RDMA (`ofi+…`), then TCP, then any other; duplicates
    /// and unknown schemes dropped. `STROM_TRANSPORT` (a comma-separated
    /// list of schemes, e.g. `tcp` or `shm,tcp`) restricts and orders the
    /// choice instead.
    pub fn rank(&self, urls: &[String]) -> Vec<String> {
        let only = std::env::var("STROM_TRANSPORT").ok();
        let only: Option<Vec<&str>> = only.as_deref().map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        });
        let mut scored: Vec<(usize, &String)> = urls
            .iter()
            .filter(|u| self.resolve(u).is_ok())
            .filter_map(|u| {
                let scheme = scheme_of(u);
                let score = match &only {
                    Some(list) => list.iter().position(|s| *s == scheme)?,
                    None => match scheme {
                        "shm" => 0,
                        s if s.starts_with("ofi+") => 1,
                        DEFAULT_SCHEME => 2,
                        _ => 3,
                    },
                };
                Some((score, u))
            })
            .collect();
        scored.sort_by_key(|(s, _)| *s);
        let mut out: Vec<String> = Vec::new();
        for (_, u) in scored {
            if !out.contains(u) {
                out.push(u.clone());
            }
        }
        out
    }

    /// Connects to `url` with the transport its scheme names.
    pub async fn connect(&self, url: &str) -> Result<Conn, NetError> {
        let (transport, addr) = self.resolve(url)?;
        transport.connect(addr).await
    }

    /// Listens on `url` with the transport its scheme names.
    pub async fn listen(&self, url: &str) -> Result<Box<dyn Listener>, NetError> {
        let (transport, addr) = self.resolve(url)?;
        transport.listen(addr).await
    }
}

/// The scheme of `url` (`tcp` for a bare `host:port`).
pub fn scheme_of(url: &str) -> &str {
    url.split_once("://").map_or(DEFAULT_SCHEME, |(s, _)| s)
}

impl Default for Transports {
    /// Every transport ([`Transports::new`]) with the default maximum
    /// frame size.
    fn default() -> Self {
        Transports::new(strom_proto::DEFAULT_MAX_FRAME)
    }
}

impl fmt::Debug for Transports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.schemes()).finish()
    }
}

/// `STROM_BUSY_POLL_US` as a duration; unset or unparsable is zero (a
/// malformed value is logged, not fatal: it only tunes latency).
fn busy_poll_from_env() -> Duration {
    match std::env::var(BUSY_POLL_ENV) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(us) => Duration::from_micros(us.min(1_000_000)),
            Err(_) => {
                tracing::warn!(var = BUSY_POLL_ENV, value = %v, "ignored: not a number of microseconds");
                Duration::ZERO
            }
        },
        Err(_) => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_address_means_tcp_and_a_scheme_picks_its_transport() {
        let t = Transports::default();
        let (tcp, addr) = t.resolve("127.0.0.1:7000").unwrap();
        assert_eq!((tcp.name(), addr), ("tcp", "127.0.0.1:7000"));
        let (tcp, addr) = t.resolve("tcp://node1:7000").unwrap();
        assert_eq!((tcp.name(), addr), ("tcp", "node1:7000"));
        let (shm, addr) = t.resolve("shm:///run/strom/a.sock").unwrap();
        assert_eq!((shm.name(), addr), ("shm", "/run/strom/a.sock"));
    }

    #[test]
    fn an_unknown_scheme_is_an_error_that_names_the_known_ones() {
        let e = match Transports::default().resolve("ofi://node1:7000") {
            Err(e) => e,
            Ok(_) => panic!("ofi is not registered"),
        };
        let msg = e.to_string();
        assert!(msg.contains("'ofi'") && msg.contains("tcp"), "{msg}");
        assert_eq!(e.code(), strom_proto::ErrorCode::INVALID_ARGUMENT);
    }

    #[cfg(feature = "ofi")]
    #[test]
    fn every_ofi_scheme_is_registered() {
        let t = Transports::default();
        for scheme in ["ofi+tcp", "ofi+shm", "ofi+verbs", "ofi+cxi"] {
            let url = format!("{scheme}://auto");
            let (o, addr) = t.resolve(&url).unwrap();
            assert_eq!((o.name(), addr), (scheme, "auto"));
        }
    }

    #[test]
    fn rank_prefers_shared_memory_then_rdma_then_tcp_and_drops_the_unknown() {
        let t = Transports::default().with("ofi+tcp", Arc::new(TcpTransport { max_frame: 64 }));
        let urls: Vec<String> = [
            "127.0.0.1:7000",
            "bogus://x",
            "ofi+tcp://ab",
            "shm:///s",
            "127.0.0.1:7000",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            t.rank(&urls),
            ["shm:///s", "ofi+tcp://ab", "127.0.0.1:7000"]
        );
        assert_eq!(scheme_of("shm:///s"), "shm");
        assert_eq!(scheme_of("h:1"), "tcp");
    }

    #[test]
    fn registering_a_scheme_again_replaces_it() {
        let t = Transports::tcp(4096).with("tcp", Arc::new(TcpTransport { max_frame: 8192 }));
        assert_eq!(t.schemes().collect::<Vec<_>>(), ["tcp"]);
    }
}
