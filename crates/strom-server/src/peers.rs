//! Control-plane calls between members of a group (join, heartbeat, host,
//! seal, drop, stats). One multiplexed connection per peer
//! ([`strom_net::MuxConn`]) carries any number of calls at once, each
//! bounded by a timeout so a dead member cannot stall the master. A
//! connection that died, or that answered nothing for a whole timeout, is
//! replaced on the next call. Connections go through the server's
//! [`Transports`], so they use its frame limit (`max_frame_bytes`).
//!
//! Each connection opens with the member handshake
//! ([`crate::member_auth`]): this server proves it holds the cluster secret
//! under the id it claims, and checks the peer's proof in return. A
//! connection serves only the id it proved: when this server's id changes
//! (it joined), the next call opens a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strom_net::{MuxConn, NetError, OutFrame, Transports};
use strom_proto::{ErrorCode, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use tokio::time::{timeout_at, Instant};

use crate::error::ServerError;
use crate::member_auth::{self, Identity};

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to one peer and how many of its calls were answered (to
/// tell a slow peer from a silent one).
struct PeerConn {
    mux: Arc<MuxConn>,
    /// The protocol version settled with the peer's `Hello`.
    version: u8,
    /// The member id this connection proved (`None`: no secret yet).
    proved: Option<u32>,
    answered: AtomicU64,
}

/// The connection to one address, and a lock so that concurrent first
/// calls open it once.
#[derive(Default)]
struct Slot {
    conn: Mutex<Option<Arc<PeerConn>>>,
    opening: tokio::sync::Mutex<()>,
}

pub struct Peers {
    transports: Transports,
    timeout: Duration,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    identity: Arc<Identity>,
}

fn unreachable(addr: &str, why: impl std::fmt::Display) -> ServerError {
    ServerError::coded(
        ErrorCode::CONNECTION_FAILED,
        format!("group member at {addr} is unreachable: {why}"),
    )
}

impl Peers {
    /// Peers reached through `transports`, each call bounded by 5 s.
    pub fn new(transports: Transports) -> Self {
        Self::with_timeout(transports, CALL_TIMEOUT)
    }

    pub fn with_timeout(transports: Transports, timeout: Duration) -> Self {
        Peers {
            transports,
            timeout,
            slots: Mutex::new(HashMap::new()),
            identity: Arc::new(Identity::default()),
        }
    }

    /// Proves membership with `identity` on every connection it opens.
    pub fn with_identity(mut self, identity: Arc<Identity>) -> Self {
        self.identity = identity;
        self
    }

    /// The secret and the id this server proves on its connections.
    pub fn identity(&self) -> &Arc<Identity> {
        &self.identity
    }

    /// What a connection proved now must be: the id claimed, with a secret.
    fn wanted(&self) -> Option<u32> {
        self.identity.secret().map(|_| self.identity.claim())
    }

    /// The live connection to `addr`, opened if there is none.
    async fn conn(&self, addr: &str) -> Result<Arc<PeerConn>, ServerError> {
        let slot = self
            .slots
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone();
        let wanted = self.wanted();
        let live = |slot: &Slot| {
            slot.conn
                .lock()
                .clone()
                .filter(|c| !c.mux.is_dead() && c.proved == wanted)
        };
        if let Some(c) = live(&slot) {
            return Ok(c);
        }
        let _opening = slot.opening.lock().await;
        if let Some(c) = live(&slot) {
            return Ok(c);
        }
        let conn = self
            .transports
            .connect(addr)
            .await
            .map_err(|e| unreachable(addr, e))?;
        let mux = MuxConn::start(conn, addr);
        let (version, proved) = match hello(&mux, addr, &self.identity).await {
            Ok(v) => v,
            Err(e) => {
                mux.kill(NetError::Closed);
                return Err(e);
            }
        };
        if let Some(old) = slot.conn.lock().take() {
            old.mux.kill(NetError::Closed);
        }
        let c = Arc::new(PeerConn {
            mux,
            version,
            proved,
            answered: AtomicU64::new(0),
        });
        tracing::debug!(peer = %addr, "connected to a group member");
        *slot.conn.lock() = Some(c.clone());
        Ok(c)
    }

    /// Sends one request to the server at `addr` and waits for its
    /// response, at most the call timeout. Other calls to the same peer
    /// may be in flight meanwhile on the same connection.
    pub async fn call(&self, addr: &str, req: &Request) -> Result<Response, ServerError> {
        let deadline = Instant::now() + self.timeout;
        let no_answer = || unreachable(addr, format!("no answer within {:?}", self.timeout));
        let sent = timeout_at(deadline, async {
            let c = self.conn(addr).await?;
            let answered = c.answered.load(Ordering::Acquire);
            let waiter = c
                .mux
                .send(OutFrame::request(c.version, 0, req), Vec::new(), Vec::new())
                .await
                .map_err(|e| unreachable(addr, e))?;
            Ok::<_, ServerError>((c, answered, waiter))
        })
        .await;
        let (c, answered, waiter) = match sent {
            Ok(Ok(sent)) => sent,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(no_answer()),
        };
        let id = waiter.id();
        let reply = match timeout_at(deadline, waiter.wait()).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => return Err(unreachable(addr, e)),
            Err(_) => {
                c.mux.cancel(id);
                if c.answered.load(Ordering::Acquire) == answered {
                    // Nothing came back for a whole timeout: assume the
                    // connection is gone and open a new one next time.
                    tracing::warn!(peer = %addr, timeout = ?self.timeout, "group member answered nothing; dropping its connection");
                    c.mux.kill(NetError::Closed);
                }
                return Err(no_answer());
            }
        };
        c.answered.fetch_add(1, Ordering::AcqRel);
        match Response::decode(reply.header.version, reply.header.opcode, &reply.body) {
            Ok(Response::Error { code, message }) => Err(ServerError::Coded { code, message }),
            Ok(r) => Ok(r),
            Err(e) => {
                c.mux.kill(NetError::Proto(e.clone()));
                Err(unreachable(addr, e))
            }
        }
    }
}

/// One request and its decoded answer, on a connection being set up.
async fn ask(mux: &MuxConn, version: u8, req: &Request) -> Result<Response, NetError> {
    let frame = OutFrame::request(version, 0, req);
    let reply = mux
        .send(frame, Vec::new(), Vec::new())
        .await?
        .wait()
        .await?;
    Ok(Response::decode(
        reply.header.version,
        reply.header.opcode,
        &reply.body,
    )?)
}

fn unexpected(what: &'static str, r: &Response) -> NetError {
    NetError::Proto(strom_proto::ProtoError::Unknown {
        what,
        value: u64::from(r.opcode()),
    })
}

/// The handshake failed: the peer is no member of this group, or this
/// server is not (`NOT_A_MEMBER`).
fn refused(addr: &str, why: impl std::fmt::Display) -> ServerError {
    ServerError::coded(
        ErrorCode::NOT_A_MEMBER,
        format!("member handshake with {addr} failed: {why}"),
    )
}

/// Settles the protocol version with a newly connected peer (the newest
/// both speak) and, once this server holds the cluster secret, proves its
/// claimed id and checks the peer's proof. Returns the version and the id
/// proved.
async fn hello(
    mux: &MuxConn,
    addr: &str,
    identity: &Identity,
) -> Result<(u8, Option<u32>), ServerError> {
    let net = |e: NetError| unreachable(addr, e);
    let Some(secret) = identity.secret() else {
        let req = Request::Hello {
            client: "strom-server peer".into(),
            max_version: PROTOCOL_VERSION,
            nonce: Default::default(),
        };
        return match ask(mux, MIN_PROTOCOL_VERSION, &req).await.map_err(net)? {
            Response::Hello { version, .. } => {
                Ok((version.clamp(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION), None))
            }
            other => Err(net(unexpected("answer to Hello", &other))),
        };
    };
    let claim = identity.claim();
    let mine = member_auth::nonce()?;
    let req = Request::Hello {
        client: "strom-server member".into(),
        max_version: PROTOCOL_VERSION,
        nonce: mine.clone(),
    };
    // Sent at this build's version so the nonce goes with it: a member's
    // peers run the same protocol (a server older than 7 refuses it).
    let (version, theirs) = match ask(mux, PROTOCOL_VERSION, &req).await.map_err(net)? {
        Response::Hello { version, nonce, .. } => (version, nonce),
        Response::Error { code, message } => {
            return Err(refused(addr, format!("{code}: {message}")));
        }
        other => return Err(net(unexpected("answer to Hello", &other))),
    };
    if version < PROTOCOL_VERSION || theirs.is_empty() {
        return Err(refused(addr, format!(
            "the peer answered a member Hello at protocol version {version} without a nonce: it runs an older strom server"
        )));
    }
    let proof = Request::ProveMember {
        member: claim,
        proof: secret.member_proof(&theirs, &mine, claim),
    };
    match ask(mux, version, &proof).await.map_err(net)? {
        Response::MemberProven { member, proof } => {
            if !secret.check_server_proof(&theirs, &mine, member, &proof) {
                return Err(refused(
                    addr,
                    format!("the peer (member {member}) does not hold this group's cluster secret"),
                ));
            }
            Ok((version, Some(claim)))
        }
        Response::Error { code, message } => Err(refused(addr, format!("{code}: {message}"))),
        other => Err(net(unexpected("answer to ProveMember", &other))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicUsize;

    use strom_net::spawn_writer;
    use strom_proto::FrameKind;

    use super::*;

    /// A fake group member: answers `Hello` as member 7, at once, except
    /// `"slow"` (after 1 s), `"never"` (no answer) and `"bye"` (answers,
    /// then closes the connection). Returns its address and a count of the
    /// connections it accepted.
    pub(crate) async fn fake_member() -> (String, Arc<AtomicUsize>) {
        let mut listener = Transports::default().listen("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok(conn) = listener.accept().await {
                count.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(async move {
                    let writer = spawn_writer(conn.writer, conn.direct, conn.peer, |_| {});
                    let mut reader = conn.reader;
                    while let Ok(Some((h, body))) = reader.next().await {
                        assert_eq!(h.kind, FrameKind::Request);
                        let Ok(Request::Hello { client, .. }) =
                            Request::decode(h.version, h.opcode, &body)
                        else {
                            return;
                        };
                        let hello = Response::Hello {
                            member: 7,
                            master: 0,
                            members: Vec::new(),
                            version: PROTOCOL_VERSION,
                            nonce: Default::default(),
                        };
                        let answer = OutFrame::response(h.version, h.id, &hello);
                        match client.as_str() {
                            "never" => {}
                            "slow" => {
                                let w = writer.clone();
                                tokio::spawn(async move {
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                    let _ = w.send(answer).await;
                                });
                            }
                            "bye" => {
                                let _ = writer.send(answer).await;
                                return;
                            }
                            _ => {
                                let _ = writer.send(answer).await;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    pub(crate) fn hello(client: &str) -> Request {
        Request::Hello {
            client: client.into(),
            max_version: PROTOCOL_VERSION,
            nonce: Default::default(),
        }
    }

    fn is_member_7(r: Result<Response, ServerError>) -> bool {
        matches!(r, Ok(Response::Hello { member: 7, .. }))
    }

    #[tokio::test]
    async fn many_concurrent_calls_to_one_peer_complete_over_one_connection() {
        let (addr, accepted) = fake_member().await;
        let peers = Arc::new(Peers::new(Transports::default()));
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..50 {
            let (peers, addr) = (peers.clone(), addr.clone());
            calls.spawn(async move { peers.call(&addr, &hello(&format!("c{i}"))).await });
        }
        while let Some(r) = calls.join_next().await {
            assert!(is_member_7(r.unwrap()));
        }
        assert_eq!(accepted.load(Ordering::Acquire), 1);
    }

    #[tokio::test]
    async fn a_slow_call_does_not_hold_up_a_fast_one_to_the_same_peer() {
        let (addr, accepted) = fake_member().await;
        let peers = Arc::new(Peers::new(Transports::default()));
        let slow = {
            let (peers, addr) = (peers.clone(), addr.clone());
            tokio::spawn(async move { peers.call(&addr, &hello("slow")).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        assert!(is_member_7(peers.call(&addr, &hello("fast")).await));
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "the fast call waited {:?} behind the slow one",
            started.elapsed()
        );
        assert!(!slow.is_finished(), "the slow call is still out");
        assert!(is_member_7(slow.await.unwrap()));
        assert_eq!(accepted.load(Ordering::Acquire), 1);
    }

    #[tokio::test]
    async fn a_silent_peer_times_out_and_the_next_call_reconnects() {
        let (addr, accepted) = fake_member().await;
        let peers = Peers::with_timeout(Transports::default(), Duration::from_millis(300));
        let e = peers.call(&addr, &hello("never")).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::CONNECTION_FAILED);
        assert!(e.to_string().contains("no answer within"), "{e}");
        assert!(is_member_7(peers.call(&addr, &hello("fast")).await));
        assert_eq!(accepted.load(Ordering::Acquire), 2);
    }

    #[tokio::test]
    async fn a_connection_the_peer_closed_is_reopened_on_the_next_call() {
        let (addr, accepted) = fake_member().await;
        let peers = Peers::new(Transports::default());
        assert!(is_member_7(peers.call(&addr, &hello("bye")).await));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(is_member_7(peers.call(&addr, &hello("fast")).await));
        assert_eq!(accepted.load(Ordering::Acquire), 2);
    }

    #[tokio::test]
    async fn peer_calls_use_the_frame_limit_of_their_transports() {
        let (addr, _) = fake_member().await;
        // A request of about 10 KB: over a 8 KiB limit, under a 1 MiB one.
        let big = hello(&"x".repeat(10_000));
        let small = Peers::new(Transports::tcp(8192));
        let e = small.call(&addr, &big).await.unwrap_err();
        assert!(e.to_string().contains("maximum frame size of 8192"), "{e}");
        // The refused call did not spoil the connection for others.
        assert!(is_member_7(small.call(&addr, &hello("fast")).await));
        let large = Peers::new(Transports::tcp(1 << 20));
        assert!(is_member_7(large.call(&addr, &big).await));
    }
}
