//! Producer leases through a live [`Registry`]: expiry counts as a close for
//! the end of stream, is recorded in the log, and deadlines restart with a
//! full lease after a reopen.

use std::time::{Duration, Instant};

use super::super::Registry;
use super::through_registry::link;
use super::*;

/// Makes the lease of `producer` of `topic` due now, as if it was not
/// renewed in time.
async fn make_due(r: &Registry, topic: &str, producer: u64) {
    let mut inner = r.inner.lock().await;
    let d = inner
        .lease_deadline
        .get_mut(&(topic.to_string(), producer))
        .expect("the producer holds a lease deadline");
    *d = Instant::now() - Duration::from_millis(1);
}

#[tokio::test]
async fn expired_producer_counts_as_closed_and_survives_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let link = link(tmp.path());
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    r.create(TopicSpec::new("t", 2), Some(0)).await.unwrap();
    let (leased, granted) = r.open_producer("t", 1).await.unwrap();
    assert_eq!(granted, 1000, "a request below the range is clamped up");
    let plain = r.register_producer("t").await.unwrap();
    r.close_producer("t", plain).await.unwrap();
    assert!(
        !r.describe("t", false).await.unwrap().state.ended,
        "the leased producer still holds the stream open"
    );
    assert_eq!(r.expire_due().await, 0, "a fresh lease is not due");

    make_due(&r, "t", leased).await;
    assert_eq!(r.expire_due().await, 1);
    let st = r.describe("t", false).await.unwrap().state;
    assert!(st.ended, "an expired producer counts as finished: {st:?}");
    assert_eq!(
        (st.open_producers, st.closed_producers, st.expired_producers),
        (0, 1, 1)
    );
    assert_eq!(
        r.renew(vec![("t".into(), leased), ("t".into(), 77)]).await,
        vec![("t".into(), leased), ("t".into(), 77)],
        "expired and unknown producers are reported lost"
    );
    let e = r.close_producer("t", leased).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::PRODUCER_EXPIRED);
    let live = r.inner.lock().await.state.clone();
    drop(r);

    let r = Registry::open(tmp.path(), None, 1, link).unwrap();
    assert_eq!(
        r.inner.lock().await.state,
        live,
        "the log replays the expiry"
    );
    let st = r.describe("t", false).await.unwrap().state;
    assert!(st.ended);
    assert_eq!((st.closed_producers, st.expired_producers), (1, 1));
    assert!(r.inner.lock().await.lease_deadline.is_empty());
    let e = r.close_producer("t", leased).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::PRODUCER_EXPIRED);
}

#[tokio::test]
async fn leases_get_a_full_grace_after_master_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let link = link(tmp.path());
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    r.create(TopicSpec::new("t", 1), Some(0)).await.unwrap();
    let (p, granted) = r.open_producer("t", 60_000).await.unwrap();
    assert_eq!(granted, 60_000);
    make_due(&r, "t", p).await;
    drop(r);

    let before = Instant::now();
    let r = Registry::open(tmp.path(), None, 1, link).unwrap();
    assert_eq!(r.expire_due().await, 0, "a reopened master grants grace");
    let deadline = r.inner.lock().await.lease_deadline[&("t".to_string(), p)];
    assert!(deadline >= before + Duration::from_millis(60_000));
    assert!(r.renew(vec![("t".into(), p)]).await.is_empty());
    let st = r.describe("t", false).await.unwrap().state;
    assert_eq!((st.open_producers, st.ended), (1, false));
    // A closed producer no longer holds a lease.
    r.close_producer("t", p).await.unwrap();
    assert_eq!(r.renew(vec![("t".into(), p)]).await, vec![("t".into(), p)]);
    assert_eq!(r.expire_due().await, 0);
    let st = r.describe("t", false).await.unwrap().state;
    assert_eq!((st.closed_producers, st.expired_producers), (1, 0));
}
