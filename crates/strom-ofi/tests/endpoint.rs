//! Two endpoints of the same provider in one process: messages, RMA reads
//! and writes, the registration cache. Each test runs over `tcp;ofi_rxm`
//! and `shm`; a provider that cannot be opened fails the test.

use std::sync::Arc;

use strom_ofi::{Access, Endpoint, EndpointConfig, MrCache, OfiError, ProviderSpec};
use tokio::sync::mpsc;

type Inbox = mpsc::UnboundedReceiver<Vec<u8>>;

fn open(provider: &str) -> (Endpoint, Inbox) {
    open_with(provider, false)
}

fn open_with(provider: &str, force_mr_local: bool) -> (Endpoint, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut cfg = EndpointConfig::new(ProviderSpec::new(provider));
    cfg.force_mr_local = force_mr_local;
    let ep = Endpoint::open(&cfg, Box::new(move |m: &[u8]| drop(tx.send(m.to_vec()))))
        .unwrap_or_else(|e| panic!("provider {provider} must be available here: {e}"));
    (ep, rx)
}

async fn messages_both_ways(provider: &str) {
    let (a, mut a_in) = open(provider);
    let (b, mut b_in) = open(provider);
    assert_eq!(a.traits().provider, b.traits().provider);
    let b_at_a = a.insert_peer(b.name()).unwrap();
    let a_at_b = b.insert_peer(a.name()).unwrap();
    for i in 0..100u32 {
        a.send(b_at_a, &i.to_le_bytes()).await.unwrap();
    }
    for i in 0..100u32 {
        assert_eq!(b_in.recv().await.unwrap(), i.to_le_bytes(), "in order");
    }
    let big = vec![9u8; a.msg_size()];
    b.send(a_at_b, &big).await.unwrap().await.unwrap();
    assert_eq!(a_in.recv().await.unwrap(), big);
    let too_big = vec![0u8; a.msg_size() + 1];
    assert!(matches!(
        b.send(a_at_b, &too_big).await,
        Err(OfiError::Invalid(_))
    ));
}

async fn rma_read_and_write(provider: &str) {
    let (a, _a_in) = open(provider);
    let (b, _b_in) = open(provider);
    let b_at_a = a.insert_peer(b.name()).unwrap();
    // b exposes a region; a reads it, then overwrites half of it.
    let src: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let region = b.register(src.clone(), Access::RemoteReadWrite).unwrap();
    let mut dst = vec![0u8; src.len()];
    a.read(b_at_a, &mut dst, region.remote()).await.unwrap();
    assert!(dst == src, "read brings the peer's bytes");
    let mut part = vec![0u8; 1000];
    let at = region.remote().offset(5000).unwrap();
    a.read(b_at_a, &mut part, at).await.unwrap();
    assert_eq!(part, src[5000..6000]);
    let ones = vec![1u8; 150_000];
    a.write(b_at_a, &ones, region.remote()).await.unwrap();
    assert!(region.as_slice()[..150_000].iter().all(|&x| x == 1));
    assert_eq!(region.as_slice()[150_000..], src[150_000..]);
    // Longer than the region: refused before anything is posted.
    let mut huge = vec![0u8; src.len() + 1];
    let e = a
        .read(b_at_a, &mut huge, region.remote())
        .await
        .unwrap_err();
    assert!(matches!(e, OfiError::Invalid(_)), "{e}");
}

async fn mr_cache_hits_on_reuse(provider: &str) {
    let (a, _a_in) = open(provider);
    let cache = MrCache::new(a.clone(), Access::RemoteRead, 2, 1 << 30);
    let buf: Arc<Vec<u8>> = Arc::new(vec![3u8; 4096]);
    let other: Arc<Vec<u8>> = Arc::new(vec![4u8; 4096]);
    let first = cache.get(ArcBytes(buf.clone())).unwrap();
    let again = cache.get(ArcBytes(buf.clone())).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the same registration");
    assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
    drop((first, again));
    let _o = cache.get(ArcBytes(other.clone())).unwrap();
    let third: Arc<Vec<u8>> = Arc::new(vec![5u8; 100]);
    let _t = cache.get(ArcBytes(third)).unwrap();
    let s = cache.stats();
    assert_eq!(
        (s.misses, s.entries),
        (3, 2),
        "the idle oldest entry was evicted"
    );
    let _b = cache.get(ArcBytes(buf)).unwrap();
    assert_eq!(cache.stats().misses, 4, "evicted entries register again");
}

struct ArcBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

fn bad_names_are_errors(provider: &str) {
    let (a, _in) = open(provider);
    assert!(a.insert_peer(b"").is_err());
    assert!(a.insert_peer(&[0u8; 4096]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_messages() {
    messages_both_ways("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_messages() {
    messages_both_ways("shm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_rma() {
    rma_read_and_write("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_rma() {
    rma_read_and_write("shm").await;
}

#[tokio::test]
async fn tcp_mr_cache() {
    mr_cache_hits_on_reuse("tcp;ofi_rxm").await;
}

#[tokio::test]
async fn shm_mr_cache() {
    mr_cache_hits_on_reuse("shm").await;
}

#[test]
fn bad_names() {
    bad_names_are_errors("tcp;ofi_rxm");
    bad_names_are_errors("shm");
}

#[test]
fn an_unknown_provider_is_a_named_error() {
    let cfg = EndpointConfig::new(ProviderSpec::new("no-such-provider"));
    let e = Endpoint::open(&cfg, Box::new(|_: &[u8]| {}))
        .err()
        .expect("no such provider");
    assert!(e.to_string().contains("no-such-provider"), "{e}");
}

async fn to_itself(provider: &str) {
    let (a, mut a_in) = open(provider);
    eprintln!("{provider}: {:?}", a.traits());
    let me = a.insert_peer(a.name()).unwrap();
    a.send(me, b"hello me").await.unwrap();
    assert_eq!(a_in.recv().await.unwrap(), b"hello me");
    let region = a.register(vec![7u8; 10_000], Access::RemoteRead).unwrap();
    let mut dst = vec![0u8; 10_000];
    a.read(me, &mut dst, region.remote()).await.unwrap();
    assert!(dst.iter().all(|&x| x == 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_to_itself() {
    to_itself("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_to_itself() {
    to_itself("shm").await;
}

/// A region that does not exist (a hostile or confused peer): on tcp the
/// read fails with an error completion; shm 1.17 never completes a read
/// of an unmapped address, so only a read that owns its buffer can give up.
async fn a_read_of_a_bogus_region_fails(provider: &str) {
    let (a, _a_in) = open(provider);
    let (b, _b_in) = open(provider);
    let b_at_a = a.insert_peer(b.name()).unwrap();
    let _b_region = b.register(vec![1u8; 4096], Access::RemoteRead).unwrap();
    let bogus = strom_ofi::RemoteRegion {
        addr: 0,
        key: 0xdead_beef,
        len: 4096,
    };
    let limit = std::time::Duration::from_secs(2);
    let r = a.read_owned(b_at_a, vec![0u8; 4096], bogus, limit).await;
    assert!(r.is_err(), "{provider}: a read of a bogus region must fail");
    if provider.starts_with("tcp") {
        let mut dst = vec![0u8; 4096];
        let e = a.read(b_at_a, &mut dst, bogus).await.unwrap_err();
        assert!(matches!(e, OfiError::Completion { .. }), "{e}");
    }
    // The endpoint still works afterwards, with another peer (on tcp, the
    // access error ended the connection between a and b).
    let (c, _c_in) = open(provider);
    let c_at_a = a.insert_peer(c.name()).unwrap();
    let region = c.register(vec![2u8; 4096], Access::RemoteRead).unwrap();
    let got = a
        .read_owned(c_at_a, vec![0u8; 4096], region.remote(), limit)
        .await
        .unwrap();
    assert!(got.iter().all(|&x| x == 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_bogus_region() {
    a_read_of_a_bogus_region_fails("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_bogus_region() {
    a_read_of_a_bogus_region_fails("shm").await;
}

/// The `FI_MR_LOCAL` path (registered send and receive buffers, RMA
/// destinations registered per transfer), forced on providers that do not
/// need it.
async fn with_local_registrations(provider: &str) {
    let (a, mut a_in) = open_with(provider, true);
    let (b, _b_in) = open_with(provider, true);
    assert!(a.traits().mr_local);
    let b_at_a = a.insert_peer(b.name()).unwrap();
    let a_at_b = b.insert_peer(a.name()).unwrap();
    for i in 0..200u32 {
        b.send(a_at_b, &i.to_le_bytes()).await.unwrap();
    }
    for i in 0..200u32 {
        assert_eq!(a_in.recv().await.unwrap(), i.to_le_bytes());
    }
    let region = b
        .register(vec![6u8; 100_000], Access::RemoteReadWrite)
        .unwrap();
    let mut dst = vec![0u8; 100_000];
    a.read(b_at_a, &mut dst, region.remote()).await.unwrap();
    assert!(dst.iter().all(|&x| x == 6));
    a.write(b_at_a, &[9u8; 5000], region.remote())
        .await
        .unwrap();
    assert!(region.as_slice()[..5000].iter().all(|&x| x == 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_with_local_registrations() {
    with_local_registrations("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_with_local_registrations() {
    with_local_registrations("shm").await;
}
