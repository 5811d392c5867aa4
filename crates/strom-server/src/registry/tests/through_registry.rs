//! Operations through a live [`Registry`] (member 0 hosting its own
//! partitions in a temporary directory), then reopened from its files.

use std::fs;

use strom_storage::sim::{Fault, FaultOp, SimFs};

use super::super::files::{LOG, OLD_JSON_MIGRATED, SNAPSHOT};
use super::super::Registry;
use super::*;
use crate::config::ServerConfig;
use crate::host::Host;
use crate::members::MemberLink;

const ADDR: &str = "127.0.0.1:7000";

pub(super) fn link(dir: &Path) -> Arc<MemberLink> {
    let config = ServerConfig {
        data_dir: dir.join("host"),
        ..Default::default()
    };
    let host = Arc::new(Host::open(&config).unwrap());
    let peers = crate::peers::Peers::new(strom_net::Transports::default());
    Arc::new(MemberLink::new(0, vec![ADDR.into()], host, peers))
}

async fn state(r: &Registry) -> RegistryState {
    r.inner.lock().await.state.clone()
}

async fn live_history(r: &Registry) {
    r.join(Some(3), "10.0.0.3:1".into(), vec![], true)
        .await
        .unwrap();
    r.join(None, "10.0.0.4:1".into(), vec![], true)
        .await
        .unwrap();
    r.heartbeat(3, "10.0.0.33:1".into(), vec![]).await.unwrap();
    r.create(TopicSpec::new("a", 2), Some(0)).await.unwrap();
    r.create(TopicSpec::new("b", 1), Some(0)).await.unwrap();
    r.create(TopicSpec::new("c", 3), Some(0)).await.unwrap();
    let p1 = r.register_producer("a").await.unwrap();
    let p2 = r.register_producer("a").await.unwrap();
    assert_eq!((p1, p2), (1, 2));
    r.close_producer("a", p1).await.unwrap();
    r.register_producer("b").await.unwrap();
    r.complete("b").await.unwrap();
    r.add_partitions("c", 2, Some(0)).await.unwrap();
    r.delete("a").await.unwrap();
    r.create(TopicSpec::new("a", 1), Some(0)).await.unwrap();
}

#[tokio::test]
async fn a_reopened_registry_has_the_state_of_the_live_one() {
    let tmp = tempfile::tempdir().unwrap();
    let link = link(tmp.path());
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    let group_id = r.group_id();
    assert_ne!(group_id, 0);
    live_history(&r).await;
    let live = state(&r).await;
    assert_eq!(live.next_topic_id, 4);
    assert_eq!(live.topics["c"].placement, vec![0; 5]);
    assert_eq!(live.members[&3], "10.0.0.33:1");
    assert_eq!(live.members[&4], "10.0.0.4:1");
    assert!(live.topics["b"].state().ended);
    drop(r);
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    assert_eq!(state(&r).await, live);
    assert_eq!(r.group_id(), group_id);
    // Ids go on where they stopped.
    assert_eq!(r.register_producer("a").await.unwrap(), 1);
    r.create(TopicSpec::new("d", 1), Some(0)).await.unwrap();
    assert_eq!(state(&r).await.topics["d"].id, 4);
    // The same errors as before.
    let e = r.register_producer("b").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TOPIC_CLOSED);
    let e = r.create(TopicSpec::new("d", 1), Some(0)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TOPIC_EXISTS);
    let e = r.close_producer("a", 99).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::PRODUCER_NOT_FOUND);
    let e = r.delete("zz").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TOPIC_NOT_FOUND);
}

/// A registry over the simulated disk `fs`, in `dir`.
fn open_sim(fs: &SimFs, dir: &'static std::path::Path, link: &Arc<MemberLink>) -> Registry {
    Registry::open_with(
        Arc::new(fs.clone()),
        dir,
        None,
        1,
        link.clone(),
        Limits::default(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_failed_append_changes_nothing_and_returns_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = SimFs::new();
    let dir = sim_dir(&fs);
    let link = link(tmp.path());
    let open = |fs: &SimFs| open_sim(fs, dir, &link);
    let r = open(&fs);
    r.create(TopicSpec::new("t", 1), Some(0)).await.unwrap();
    let before = state(&r).await;
    for op in [FaultOp::Write, FaultOp::Sync] {
        fs.inject(Fault {
            op,
            errno: 5,
            path_contains: LOG.into(),
            times: Some(1),
        });
        let e = r.register_producer("t").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::STORAGE_IO, "{op:?}: {e}");
        assert_eq!(state(&r).await, before, "{op:?}");
        fs.inject(Fault {
            op,
            errno: 5,
            path_contains: LOG.into(),
            times: Some(1),
        });
        let e = r.create(TopicSpec::new("u", 1), Some(0)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::STORAGE_IO, "{op:?}: {e}");
        assert_eq!(state(&r).await, before, "{op:?}");
    }
    // Nothing of the failed changes reached the disk.
    assert_eq!(r.register_producer("t").await.unwrap(), 1);
    let live = state(&r).await;
    drop(r);
    let image = fs.crash_image(&mut SimRng::new(1));
    assert_eq!(state(&open(&image)).await, live);
}

#[tokio::test]
async fn many_changes_compact_the_log_into_a_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = SimFs::new();
    let dir = sim_dir(&fs);
    let link = link(tmp.path());
    let open = || open_sim(&fs, dir, &link);
    let r = open();
    r.create(TopicSpec::new("t", 1), Some(0)).await.unwrap();
    for _ in 0..1_100 {
        r.register_producer("t").await.unwrap();
    }
    assert!(fs.exists(&dir.join(SNAPSHOT)).unwrap());
    let records = match &r.inner.lock().await.journal {
        super::super::Journal::Local(store) => store.log_records(),
        super::super::Journal::Quorum(_) => unreachable!("a registry opened on a data dir"),
    };
    assert!(records < 200, "{records} records in the log");
    let live = state(&r).await;
    assert_eq!(live.topics["t"].next_producer, 1_101);
    drop(r);
    assert_eq!(state(&open()).await, live);
}

#[tokio::test]
async fn an_old_registry_json_is_migrated_once() {
    let tmp = tempfile::tempdir().unwrap();
    let old = r#"{
      "group_id": 12345,
      "next_topic_id": 7,
      "topics": [{
        "id": 6,
        "spec": {"name": "legacy", "partitions": 2, "partition_type": "File",
                 "durability": "Always", "validator": "none", "schema": null,
                 "selector": "round-robin", "serializer": "json",
                 "retention_bytes": null, "retention_ms": null, "segment_bytes": null},
        "placement": [0, 1],
        "producers": {"1": true, "2": false},
        "next_producer": 3,
        "completed": false
      }],
      "members": [{"id": 0, "addr": "127.0.0.1:1"}, {"id": 1, "addr": "10.0.0.1:1"}]
    }"#;
    fs::write(tmp.path().join("registry.json"), old).unwrap();
    let link = link(tmp.path());
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    assert!(!tmp.path().join("registry.json").exists());
    assert!(tmp.path().join(OLD_JSON_MIGRATED).exists());
    assert!(tmp.path().join(SNAPSHOT).exists());
    assert_eq!(r.group_id(), 12345);
    let info = r.describe("legacy", false).await.unwrap();
    assert_eq!(info.spec.partitions, 2);
    assert_eq!(info.partitions[1].member, 1);
    assert_eq!(info.partitions[1].addr, "10.0.0.1:1");
    assert_eq!(
        (info.state.open_producers, info.state.closed_producers),
        (1, 1)
    );
    assert_eq!(r.register_producer("legacy").await.unwrap(), 3);
    let live = state(&r).await;
    // The master's own address is recorded through the log.
    assert_eq!(live.members[&0], ADDR);
    drop(r);
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    assert_eq!(state(&r).await, live);
    drop(r);

    // An old file from before group ids gets one, kept across restarts.
    let tmp = tempfile::tempdir().unwrap();
    let old = r#"{"next_topic_id": 0, "topics": [], "members": []}"#;
    fs::write(tmp.path().join("registry.json"), old).unwrap();
    let r = Registry::open(tmp.path(), None, 1, link.clone()).unwrap();
    let id = r.group_id();
    assert_ne!(id, 0);
    drop(r);
    assert_eq!(
        Registry::open(tmp.path(), None, 1, link)
            .unwrap()
            .group_id(),
        id
    );
}

#[tokio::test]
async fn every_address_of_a_member_reaches_the_group_file() {
    let tmp = tempfile::tempdir().unwrap();
    let group_file = tmp.path().join("group.json");
    let r = Registry::open(tmp.path(), Some(group_file.clone()), 1, link(tmp.path())).unwrap();
    let shm = |s: &str| format!("shm:///run/{s}.sock");
    let both = |a: &str, s: &str| vec![a.to_string(), shm(s)];
    r.join(
        Some(1),
        "10.0.0.1:1".into(),
        both("10.0.0.1:1", "one"),
        true,
    )
    .await
    .unwrap();
    r.join(Some(2), "10.0.0.2:1".into(), vec![], true)
        .await
        .unwrap();
    let read = || -> strom_proto::GroupFile {
        serde_json::from_slice(&std::fs::read(&group_file).unwrap()).unwrap()
    };
    let g = read();
    let addrs = |g: &strom_proto::GroupFile, id: u32| {
        g.members.iter().find(|m| m.id == id).unwrap().addrs.clone()
    };
    assert_eq!(addrs(&g, 1), both("10.0.0.1:1", "one"));
    assert!(
        addrs(&g, 2).is_empty(),
        "a TCP-only member lists no extra addresses"
    );
    // A member that restarts with another socket path says so in its
    // heartbeat, and the group file follows.
    r.heartbeat(1, "10.0.0.1:1".into(), both("10.0.0.1:1", "two"))
        .await
        .unwrap();
    assert_eq!(addrs(&read(), 1), both("10.0.0.1:1", "two"));
    assert_eq!(r.group_members().await.len(), 3);
}

/// A full disk under the registry is `DISK_FULL` (what the operator must
/// fix), not a generic `STORAGE_IO`, and it changes nothing.
#[tokio::test]
async fn a_full_disk_under_the_registry_is_disk_full() {
    const ENOSPC: i32 = 28;
    let tmp = tempfile::tempdir().unwrap();
    let fs = SimFs::new();
    let dir = sim_dir(&fs);
    let link = link(tmp.path());
    let r = open_sim(&fs, dir, &link);
    r.create(TopicSpec::new("t", 1), Some(0)).await.unwrap();
    let before = state(&r).await;
    for op in [FaultOp::Write, FaultOp::Sync] {
        fs.inject(Fault {
            op,
            errno: ENOSPC,
            path_contains: LOG.into(),
            times: Some(1),
        });
        let e = r.open_producer("t", 10_000).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::DISK_FULL, "{op:?}: {e}");
        assert_eq!(state(&r).await, before, "{op:?}");
    }
    assert!(r.open_producer("t", 10_000).await.is_ok());
}
