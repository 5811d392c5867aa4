//! One endpoint per process and provider, shared by every connection and
//! listener over it: the [`Hub`]. Its receive callback (on the endpoint's
//! progress thread) decodes each message and routes it by receiver id to
//! a listener, a connect waiting for its answer, or a connection's inbound
//! channels, in the order the peer sent them (see `wire`). Messages for
//! unknown ids, and malformed ones, are dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strom_ofi::{
    Access, Endpoint, EndpointConfig, MemoryRegion, MrCache, OfiError, Peer, ProviderSpec,
    RemoteRegion,
};
use tokio::sync::{mpsc, oneshot};

use super::wire::{self, ConnMsg, Msg};

/// Idle registrations the bulk sender's cache keeps.
const CACHE_ENTRIES: usize = 256;
const CACHE_BYTES: usize = 64 << 20;
/// Default for [`Hub::rma_timeout`].
const RMA_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection request a listener has not accepted yet.
pub(crate) struct Incoming {
    pub(crate) from: u32,
    pub(crate) name: Bytes,
}

/// What a connection's bulk receiver gets.
pub(crate) enum BulkMsg {
    Inline(Bytes),
    Desc { id: u64, regions: Vec<RemoteRegion> },
}

/// Registrations a bulk sender keeps until the peer releases them.
pub(crate) type Held = Arc<Mutex<HashMap<u64, Vec<Arc<MemoryRegion>>>>>;

/// Where a connection's inbound messages go.
pub(crate) struct Route {
    /// Frame bytes (None once the peer closed).
    pub(crate) data: Option<mpsc::UnboundedSender<Bytes>>,
    pub(crate) bulk: Option<mpsc::UnboundedSender<BulkMsg>>,
    pub(crate) held: Held,
    /// The sequence number of the peer's next message, and the messages
    /// that came before their turn.
    next: u32,
    early: BTreeMap<u32, ConnMsg>,
}

#[derive(Default)]
struct Routes {
    conns: HashMap<u32, Route>,
    listeners: HashMap<u32, mpsc::UnboundedSender<Incoming>>,
    connecting: HashMap<u32, oneshot::Sender<u32>>,
}

/// An endpoint and the routes of everything using it.
pub(crate) struct Hub {
    pub(crate) ep: Endpoint,
    pub(crate) cache: MrCache,
    routes: Arc<Mutex<Routes>>,
    next_id: AtomicU32,
    /// How long a read into a buffer we own may take (milliseconds).
    rma_timeout_ms: AtomicU64,
}

type Registry = Mutex<HashMap<ProviderSpec, Arc<Hub>>>;

fn registry() -> &'static Registry {
    static HUBS: OnceLock<Registry> = OnceLock::new();
    HUBS.get_or_init(Registry::default)
}

impl Hub {
    /// The process's hub for `spec`, opened on first use.
    pub(crate) fn get(spec: &ProviderSpec) -> Result<Arc<Hub>, OfiError> {
        let mut hubs = registry().lock();
        if let Some(h) = hubs.get(spec) {
            return Ok(h.clone());
        }
        let hub = Arc::new(Hub::open(spec)?);
        hubs.insert(spec.clone(), hub.clone());
        Ok(hub)
    }

    fn open(spec: &ProviderSpec) -> Result<Hub, OfiError> {
        let routes = Arc::new(Mutex::new(Routes::default()));
        let r = routes.clone();
        let on_recv = Box::new(move |m: &[u8]| route(&r, m));
        let ep = Endpoint::open(&EndpointConfig::new(spec.clone()), on_recv)?;
        let cache = MrCache::new(ep.clone(), Access::RemoteRead, CACHE_ENTRIES, CACHE_BYTES);
        Ok(Hub {
            ep,
            cache,
            routes,
            next_id: AtomicU32::new(1),
            rma_timeout_ms: AtomicU64::new(RMA_TIMEOUT.as_millis() as u64),
        })
    }

    /// How long a bulk read into a buffer we own may take before the
    /// receiver gives up on it (a peer that announced memory it lacks).
    pub(crate) fn rma_timeout(&self) -> Duration {
        Duration::from_millis(self.rma_timeout_ms.load(Ordering::Relaxed))
    }

    #[cfg(test)]
    pub(crate) fn set_rma_timeout(&self, t: Duration) {
        self.rma_timeout_ms
            .store(t.as_millis() as u64, Ordering::Relaxed);
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Bytes of frame stream one `Data` message carries.
    pub(crate) fn max_data(&self) -> usize {
        self.ep.msg_size() - wire::CONN_HEADER
    }

    pub(crate) fn add_listener(&self, service: u32) -> mpsc::UnboundedReceiver<Incoming> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.lock().listeners.insert(service, tx);
        rx
    }

    pub(crate) fn remove_listener(&self, service: u32) {
        self.routes.lock().listeners.remove(&service);
    }

    /// Expects the server's answer to connect request `id`.
    pub(crate) fn await_accept(&self, id: u32) -> oneshot::Receiver<u32> {
        let (tx, rx) = oneshot::channel();
        self.routes.lock().connecting.insert(id, tx);
        rx
    }

    pub(crate) fn forget_connect(&self, id: u32) {
        self.routes.lock().connecting.remove(&id);
    }

    /// Routes connection `id`'s inbound messages to the returned channels.
    pub(crate) fn add_conn(&self, id: u32) -> super::Routes {
        let (data, data_rx) = mpsc::unbounded_channel();
        let (bulk, bulk_rx) = mpsc::unbounded_channel();
        let held = Held::default();
        let route = Route {
            data: Some(data),
            bulk: Some(bulk),
            held: held.clone(),
            next: 0,
            early: BTreeMap::new(),
        };
        self.routes.lock().conns.insert(id, route);
        (data_rx, bulk_rx, held)
    }

    /// Ends connection `id`'s inbound streams (its peer is gone).
    pub(crate) fn fail_conn(&self, id: u32) {
        if let Some(c) = self.routes.lock().conns.get_mut(&id) {
            c.data = None;
            c.bulk = None;
        }
    }

    /// Forgets connection `id` (its held registrations are dropped).
    pub(crate) fn remove_conn(&self, id: u32) {
        let route = self.routes.lock().conns.remove(&id);
        drop(route);
    }

    /// Sends `msg` to `peer` once posted (the send finishes on its own).
    pub(crate) async fn send(&self, peer: Peer, msg: &[u8]) -> Result<(), OfiError> {
        self.ep.send(peer, msg).await.map(drop)
    }
}

/// Routes one received message (on the progress thread).
fn route(routes: &Mutex<Routes>, m: &[u8]) {
    let msg = match wire::decode(m) {
        Ok(msg) => msg,
        Err(e) => {
            tracing::debug!(error = %e, "dropping a malformed ofi message");
            return;
        }
    };
    let mut released = Vec::new();
    let mut r = routes.lock();
    match msg {
        Msg::Connect {
            service,
            from,
            name,
        } => {
            if let Some(l) = r.listeners.get(&service) {
                let _ = l.send(Incoming { from, name });
            }
        }
        Msg::Accept { to, server } => {
            if let Some(tx) = r.connecting.remove(&to) {
                let _ = tx.send(server);
            }
        }
        Msg::Conn { to, seq, msg } => {
            if let Some(c) = r.conns.get_mut(&to) {
                c.receive(seq, msg, &mut released);
            }
        }
    }
    drop(r);
    // Registrations are closed (if the cache let go of them) outside the lock.
    drop(released);
}

/// Messages a connection holds until the ones before them arrive.
const MAX_EARLY: usize = 256;

impl Route {
    /// Takes message `seq`, applying it and any held ones that follow in
    /// order.
    fn receive(&mut self, seq: u32, msg: ConnMsg, released: &mut Vec<Vec<Arc<MemoryRegion>>>) {
        let ahead = seq.wrapping_sub(self.next);
        if ahead != 0 {
            if ahead >= 1 << 31 {
                return; // a duplicate or a very late message
            }
            if self.early.len() >= MAX_EARLY {
                tracing::debug!("an ofi connection is too far out of order; closing it");
                self.data = None;
                self.bulk = None;
                return;
            }
            self.early.insert(seq, msg);
            return;
        }
        self.apply(msg, released);
        self.next = self.next.wrapping_add(1);
        while let Some(msg) = self.early.remove(&self.next) {
            self.apply(msg, released);
            self.next = self.next.wrapping_add(1);
        }
    }

    fn apply(&mut self, msg: ConnMsg, released: &mut Vec<Vec<Arc<MemoryRegion>>>) {
        match msg {
            ConnMsg::Data(bytes) => {
                if let Some(tx) = &self.data {
                    let _ = tx.send(bytes);
                }
            }
            ConnMsg::Inline(bytes) => self.bulk(BulkMsg::Inline(bytes)),
            ConnMsg::Desc { id, regions } => self.bulk(BulkMsg::Desc { id, regions }),
            ConnMsg::Release { id } => released.extend(self.held.lock().remove(&id)),
            ConnMsg::Close => {
                self.data = None;
                self.bulk = None;
            }
        }
    }

    fn bulk(&self, m: BulkMsg) {
        if let Some(tx) = &self.bulk {
            let _ = tx.send(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> (Route, mpsc::UnboundedReceiver<Bytes>) {
        let (data, rx) = mpsc::unbounded_channel();
        let (bulk, _) = mpsc::unbounded_channel();
        let route = Route {
            data: Some(data),
            bulk: Some(bulk),
            held: Held::default(),
            next: 0,
            early: BTreeMap::new(),
        };
        (route, rx)
    }

    fn data(n: u8) -> ConnMsg {
        ConnMsg::Data(Bytes::from(vec![n]))
    }

    #[test]
    fn messages_are_delivered_in_sequence_order() {
        let (mut r, mut rx) = route();
        let mut released = Vec::new();
        for seq in [2u32, 0, 3, 1, 1, 5] {
            r.receive(seq, data(seq as u8), &mut released);
        }
        let got: Vec<u8> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|b| b[0])
            .collect();
        assert_eq!(got, [0, 1, 2, 3], "in order, the duplicate dropped, 5 held");
        r.receive(4, data(4), &mut released);
        assert_eq!(rx.try_recv().unwrap()[0], 4);
        assert_eq!(rx.try_recv().unwrap()[0], 5);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let (mut r, mut rx) = route();
        r.next = u32::MAX;
        let mut released = Vec::new();
        r.receive(0, data(1), &mut released);
        r.receive(u32::MAX, data(0), &mut released);
        assert_eq!(rx.try_recv().unwrap()[0], 0);
        assert_eq!(rx.try_recv().unwrap()[0], 1);
    }

    #[test]
    fn a_peer_too_far_out_of_order_loses_the_connection() {
        let (mut r, mut rx) = route();
        let mut released = Vec::new();
        for seq in 1..=(MAX_EARLY as u32 + 1) {
            r.receive(seq, data(0), &mut released);
        }
        assert!(r.data.is_none() && rx.try_recv().is_err());
    }
}
