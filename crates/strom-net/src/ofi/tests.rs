//! The ofi transports end to end in one process (both ends share the
//! process's endpoint): frames with inline, RMA and 64 MiB bulk payloads,
//! the registration cache, addresses and errors. A provider that cannot
//! be opened fails the test.

use bytes::Bytes;
use strom_proto::{FrameKind, Request};

use crate::{Conn, OutFrame, Transports};

async fn pair(scheme: &str) -> (Conn, Conn, String) {
    let t = Transports::default();
    let mut listener = t
        .listen(&format!("{scheme}://auto"))
        .await
        .unwrap_or_else(|e| panic!("{scheme} must work on this machine: {e}"));
    let addr = listener.local_addr();
    assert!(addr.starts_with(&format!("{scheme}://")), "{addr}");
    let client = tokio::spawn({
        let addr = addr.clone();
        async move { t.connect(&addr).await }
    });
    let server = listener.accept().await.unwrap();
    let client = client.await.unwrap().unwrap();
    (client, server, addr)
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

async fn frames_and_bulk(scheme: &str) {
    let (mut c, mut s, _) = pair(scheme).await;
    assert!(!c.writer.bulk_is_inline() && !s.reader.bulk_is_inline());
    let sizes = [0usize, 100, 20_000, 300_000, 64 << 20];
    for (i, &len) in sizes.iter().enumerate() {
        let f = OutFrame::request(2, i as u64, &Request::Limits).with_bulk(vec![pattern(len, 1)]);
        c.writer.write(&f).await.unwrap();
    }
    c.writer.flush().await.unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        let (h, _) = s.reader.next().await.unwrap().expect("a frame");
        assert_eq!(
            (h.kind, h.id, h.bulk_len),
            (FrameKind::Request, i as u64, len as u64)
        );
        if i % 2 == 0 {
            let mut dst = vec![0u8; len];
            s.reader.read_bulk_into(&mut dst).await.unwrap();
            assert!(dst == pattern(len, 1), "read_into, {len} bytes");
        } else {
            let got: Vec<u8> = s.reader.read_bulk().await.unwrap().concat();
            assert!(got == pattern(len, 1), "read, {len} bytes");
        }
    }
    // The other way, several chunks per frame, one skipped.
    let chunks = vec![pattern(70_000, 2), pattern(10, 3), pattern(1 << 20, 4)];
    for id in 0..2 {
        let f = OutFrame::request(2, id, &Request::Limits).with_bulk(chunks.clone());
        s.writer.write(&f).await.unwrap();
    }
    s.writer.flush().await.unwrap();
    c.reader.next().await.unwrap().unwrap();
    c.reader.skip_bulk().await.unwrap();
    c.reader.next().await.unwrap().unwrap();
    assert_eq!(
        c.reader.read_bulk().await.unwrap().concat(),
        chunks.concat()
    );
    // Closing the writer ends the peer's stream.
    drop(c);
    assert!(s.reader.next().await.unwrap().is_none(), "end of stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_tcp_carries_frames_and_bulk() {
    frames_and_bulk("ofi+tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_shm_carries_frames_and_bulk() {
    frames_and_bulk("ofi+shm").await;
}

/// A server sends what it stores again and again: its registrations stay
/// cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resending_the_same_buffer_hits_the_registration_cache() {
    let (mut c, mut s, _) = pair("ofi+tcp").await;
    let hub = super::Hub::get(&strom_ofi::ProviderSpec::new("tcp;ofi_rxm")).unwrap();
    let payload = pattern(1 << 20, 9);
    for id in 0..3 {
        let f = OutFrame::request(2, id, &Request::Limits).with_bulk(vec![payload.clone()]);
        s.writer.write(&f).await.unwrap();
        s.writer.flush().await.unwrap();
        let before = hub.cache.stats();
        c.reader.next().await.unwrap().unwrap();
        assert_eq!(c.reader.read_bulk().await.unwrap().concat(), payload);
        if id > 0 {
            assert!(before.hits >= 1, "{before:?}");
        }
    }
}

/// Marks when the buffer it owns is dropped.
struct Lent(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicBool>);

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.1.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A client sends its user's buffers, which libstrom may only borrow
/// (lent data with a release callback): once the server read one, the
/// transport lets go of it, rather than keeping it registered in the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_sent_buffer_is_let_go_once_the_server_read_it() {
    let (mut c, mut s, _) = pair("ofi+tcp").await;
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let payload = Bytes::from_owner(Lent(pattern(1 << 20, 5).to_vec(), dropped.clone()));
    let f = OutFrame::request(2, 1, &Request::Limits).with_bulk(vec![payload]);
    c.writer.write(&f).await.unwrap();
    c.writer.flush().await.unwrap();
    drop(f);
    s.reader.next().await.unwrap().unwrap();
    assert_eq!(
        s.reader.read_bulk().await.unwrap().concat(),
        pattern(1 << 20, 5)
    );
    // The server's Release travels back on its own: a bounded wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !dropped.load(std::sync::atomic::Ordering::Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "the client still holds its sent buffer after the server read it"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_share_one_endpoint() {
    let (mut c1, mut s1, a1) = pair("ofi+shm").await;
    let (mut c2, mut s2, a2) = pair("ofi+shm").await;
    let name = |a: &str| a.rsplit_once('/').unwrap().0.to_string();
    assert_eq!(name(&a1), name(&a2), "one endpoint, two services");
    assert_ne!(a1, a2);
    for (c, id) in [(&mut c1, 1), (&mut c2, 2)] {
        c.writer
            .write(&OutFrame::request(2, id, &Request::Limits))
            .await
            .unwrap();
        c.writer.flush().await.unwrap();
    }
    assert_eq!(s2.reader.next().await.unwrap().unwrap().0.id, 2);
    assert_eq!(s1.reader.next().await.unwrap().unwrap().0.id, 1);
}

async fn connect_err(url: &str) -> String {
    match Transports::default().connect(url).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{url} must not connect"),
    }
}

#[tokio::test]
async fn bad_addresses_are_errors() {
    for url in [
        "ofi+tcp://nothex/1",
        "ofi+tcp://abc/1",
        "ofi+tcp://0a0b",
        "ofi+shm://0a0b/x",
    ] {
        let e = connect_err(url).await;
        assert!(e.contains(url), "{e}");
    }
    // A well-formed address where nothing listens: our own endpoint, a
    // service nobody opened.
    let t = Transports::default();
    let l = t.listen("ofi+tcp://auto").await.unwrap();
    let addr = l.local_addr();
    let (name, _) = addr.rsplit_once('/').unwrap();
    let e = connect_err(&format!("{name}/999999")).await;
    assert!(e.contains("timed out") || e.contains("TimedOut"), "{e}");
    let e = match t.listen("ofi+tcp://10.0.0.1:7000").await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("ofi listens on auto only"),
    };
    assert!(e.contains("auto"), "{e}");
}

struct NoBulk;

impl crate::BulkSender for NoBulk {
    fn send<'a>(&'a self, _: &'a [Bytes]) -> crate::BoxFuture<'a, Result<(), crate::NetError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A frame's header and body only (its bulk is announced, not sent).
async fn frame_bytes(bulk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = crate::FrameWriter::with_bulk(&mut out, u32::MAX, std::sync::Arc::new(NoBulk));
    let f = OutFrame::request(2, 1, &Request::Limits).with_bulk(vec![Bytes::from(vec![0u8; bulk])]);
    w.write(&f).await.unwrap();
    w.flush().await.unwrap();
    drop(w);
    out
}

/// A hostile peer (a raw endpoint of its own) connects, then sends a
/// `Desc` for memory that is not there (claiming a huge region): the
/// server's reader gets an error, without a panic, a hang or a huge
/// allocation, and the server's endpoint keeps serving others.
async fn a_bogus_bulk_region_is_an_error(scheme: &str, provider: &str) {
    use super::wire;
    use strom_ofi::{Endpoint, EndpointConfig, ProviderSpec};
    let t = Transports::default();
    let mut listener = t.listen(&format!("{scheme}://auto")).await.unwrap();
    let hub = super::Hub::get(&ProviderSpec::new(provider)).unwrap();
    if provider == "shm" {
        // shm never completes such a read: the receiver gives up after this.
        hub.set_rma_timeout(std::time::Duration::from_secs(2));
    }
    let service: u32 = listener
        .local_addr()
        .rsplit_once('/')
        .unwrap()
        .1
        .parse()
        .unwrap();
    for (len, into) in [(1 << 20, true), (3 << 20, false)] {
        let (tx, mut inbox) = tokio::sync::mpsc::unbounded_channel();
        let cfg = EndpointConfig::new(ProviderSpec::new(provider));
        let on_recv = Box::new(move |m: &[u8]| drop(tx.send(m.to_vec())));
        let hostile = Endpoint::open(&cfg, on_recv).unwrap();
        let server_ep = hostile.insert_peer(hub.ep.name()).unwrap();
        let connect = wire::connect(service, 1, hostile.name());
        hostile.send(server_ep, &connect).await.unwrap();
        let mut server = listener.accept().await.unwrap();
        let server_id = match wire::decode(&inbox.recv().await.unwrap()) {
            Ok(wire::Msg::Accept { to: 1, server }) => server,
            other => panic!("expected an accept, got {other:?}"),
        };
        let bogus = strom_ofi::RemoteRegion {
            addr: 0,
            key: 0xbad,
            len: u64::MAX / 2,
        };
        hostile
            .send(server_ep, &wire::desc(server_id, 0, 1, &[bogus]))
            .await
            .unwrap();
        let frame = wire::data(server_id, 1, &frame_bytes(len).await);
        hostile.send(server_ep, &frame).await.unwrap();
        let (h, _) = server.reader.next().await.unwrap().unwrap();
        assert_eq!(h.bulk_len, len as u64);
        let r = if into {
            let mut dst = vec![0u8; len];
            server.reader.read_bulk_into(&mut dst).await.map(drop)
        } else {
            server.reader.read_bulk().await.map(drop)
        };
        let e = r.expect_err("a bogus region is an error");
        assert!(e.to_string().contains("bulk"), "{e}");
    }
    // The server's endpoint still serves well-behaved peers.
    drop(listener);
    frames_and_bulk_small(scheme).await;
}

async fn frames_and_bulk_small(scheme: &str) {
    let (mut c, mut s, _) = pair(scheme).await;
    let f = OutFrame::request(2, 5, &Request::Limits).with_bulk(vec![pattern(100_000, 7)]);
    c.writer.write(&f).await.unwrap();
    c.writer.flush().await.unwrap();
    s.reader.next().await.unwrap().unwrap();
    assert_eq!(
        s.reader.read_bulk().await.unwrap().concat(),
        pattern(100_000, 7)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_tcp_bogus_bulk_region() {
    a_bogus_bulk_region_is_an_error("ofi+tcp", "tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_shm_bogus_bulk_region() {
    a_bogus_bulk_region_is_an_error("ofi+shm", "shm").await;
}

const CHILD: &str = "STROM_NET_OFI_TEST_CHILD";

/// The client half of [`across_processes`], run in a child process.
async fn child_client(addr: &str) {
    if let Some(addr) = addr.strip_prefix("die:") {
        let mut c = Transports::default().connect(addr).await.unwrap();
        c.writer
            .write(&OutFrame::request(2, 1, &Request::Limits))
            .await
            .unwrap();
        c.writer.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        std::process::exit(0); // no goodbye: the process just ends
    }
    let mut c = Transports::default().connect(addr).await.unwrap();
    let f = OutFrame::request(2, 1, &Request::Limits).with_bulk(vec![pattern(8 << 20, 5)]);
    c.writer.write(&f).await.unwrap();
    c.writer.flush().await.unwrap();
    let (h, _) = c.reader.next().await.unwrap().expect("the server's answer");
    assert_eq!(h.id, 2);
    let mut got = vec![0u8; h.bulk_len as usize];
    c.reader.read_bulk_into(&mut got).await.unwrap();
    assert!(got == pattern(5 << 20, 6), "the server's payload");
}

/// A server here, its client in another process (this test binary run
/// again): bulk payloads both ways across processes.
async fn across_processes(scheme: &str, test: &str) {
    if let Ok(addr) = std::env::var(CHILD) {
        return child_client(&addr).await;
    }
    let mut listener = Transports::default()
        .listen(&format!("{scheme}://auto"))
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let (addr, test) = (listener.local_addr(), test.to_string());
    let child = tokio::task::spawn_blocking(move || {
        std::process::Command::new(exe)
            .args([test.as_str(), "--exact", "--nocapture"])
            .env(CHILD, addr)
            .status()
    });
    let mut s = listener.accept().await.unwrap();
    let (h, _) = s.reader.next().await.unwrap().unwrap();
    assert_eq!(h.bulk_len, 8 << 20);
    assert_eq!(
        s.reader.read_bulk().await.unwrap().concat(),
        pattern(8 << 20, 5)
    );
    let f = OutFrame::request(2, 2, &Request::Limits).with_bulk(vec![pattern(5 << 20, 6)]);
    s.writer.write(&f).await.unwrap();
    s.writer.flush().await.unwrap();
    assert!(
        child.await.unwrap().unwrap().success(),
        "the client process passed"
    );
    assert!(s.reader.next().await.unwrap().is_none(), "end of stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_tcp_across_processes() {
    across_processes("ofi+tcp", "ofi::tests::ofi_tcp_across_processes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_shm_across_processes() {
    across_processes("ofi+shm", "ofi::tests::ofi_shm_across_processes").await;
}

/// The client process dies without closing: the server's sends fail, and
/// then its reader sees the end instead of waiting forever (tcp only: shm
/// cannot tell that a peer process is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ofi_tcp_notices_a_dead_peer_when_sending() {
    if let Ok(addr) = std::env::var(CHILD) {
        return child_client(&addr).await;
    }
    let mut listener = Transports::default()
        .listen("ofi+tcp://auto")
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let addr = format!("die:{}", listener.local_addr());
    let test = "ofi::tests::ofi_tcp_notices_a_dead_peer_when_sending";
    let child = tokio::task::spawn_blocking(move || {
        std::process::Command::new(exe)
            .args([test, "--exact", "--nocapture"])
            .env(CHILD, addr)
            .status()
    });
    let mut s = listener.accept().await.unwrap();
    s.reader.next().await.unwrap().unwrap();
    assert!(child.await.unwrap().unwrap().success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut failed = false;
    while std::time::Instant::now() < deadline && !failed {
        let f = OutFrame::request(2, 9, &Request::Limits).with_bulk(vec![pattern(100, 1)]);
        failed = s.writer.write(&f).await.is_err() || s.writer.flush().await.is_err();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(failed, "writing to a dead peer fails");
    let end = tokio::time::timeout(std::time::Duration::from_secs(5), s.reader.next()).await;
    assert!(
        matches!(end, Ok(Ok(None)) | Ok(Err(_))),
        "the reader sees the end"
    );
}
