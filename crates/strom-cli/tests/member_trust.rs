//! What members trust (docs/safety.md): member-to-member requests are served
//! only on a connection that proved, with the group's cluster secret, that a
//! member opened it. Each test sends anonymous raw frames to a real
//! `strom server`, as anyone who can reach its port could, and checks that
//! the request is refused with `NOT_A_MEMBER` and changed nothing; and that
//! servers holding the secret still form groups, while one holding another
//! secret cannot join.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::raw::{connect, read_until_reply, request_frame, responses};
use common::{live_members, member_id, read_all, wait_for, ServerProcess};
use strom_client::{Driver, TopicSpec};
use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, GroupFile, Request, Response};

/// Sends `req` on a fresh anonymous connection and returns the answer.
fn ask(addr: &str, req: &Request) -> Response {
    let mut s = connect(addr);
    s.write_all(&request_frame(9, req, b"")).expect("sending");
    let got = read_until_reply(&mut s, 9, "an anonymous member request");
    match responses(&got).into_iter().find(|(id, _)| *id == 9) {
        Some((_, r)) => r,
        None => panic!("no answer to {req:?}"),
    }
}

fn assert_refused(r: &Response, what: &str) {
    match r {
        Response::Error { code, .. } if *code == ErrorCode::NOT_A_MEMBER => {}
        other => {
            panic!("{what} from an anonymous connection: expected NOT_A_MEMBER, got {other:?}")
        }
    }
}

fn push_acked(d: &Driver, topic: &str, n: u64) {
    let t = d.open_topic(topic).unwrap();
    let p = t.producer().unwrap();
    let futures: Vec<_> = (0..n)
        .map(|i| {
            p.push_with(format!("{{\"i\":{i}}}"), vec![1u8; 16], Some(0), &[])
                .unwrap()
        })
        .collect();
    p.flush().unwrap();
    for f in futures {
        f.wait().expect("acknowledged");
    }
}

#[test]
fn an_anonymous_drop_partitions_deletes_no_acknowledged_event() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start(tmp.path());
    let d = s.connect();
    d.create_topic(TopicSpec::new("kept", 1)).unwrap();
    push_acked(&d, "kept", 3);
    let r = ask(
        &s.addr,
        &Request::DropPartitions {
            topic: "kept".into(),
        },
    );
    assert_refused(&r, "DropPartitions");
    let got = read_all(&d, "kept", "reader", Duration::from_secs(10));
    assert_eq!(got.len(), 3, "the acknowledged events are still there");
    assert_eq!(d.describe("kept").unwrap().partitions[0].next_offset, 3);
}

#[test]
fn an_anonymous_join_neither_becomes_a_member_nor_replaces_one() {
    let tmp = tempfile::tempdir().unwrap();
    let zero = ServerProcess::start(&tmp.path().join("m0"));
    let dir1 = tmp.path().join("m1");
    let _m1 = zero.join_member(&dir1, &[], Stdio::null());
    wait_for("member 1's id", || member_id(&dir1).is_some());
    let d = zero.connect();
    wait_for("two live members", || live_members(&d) == 2);
    let addr1 = |d: &Driver| {
        d.members()
            .unwrap()
            .into_iter()
            .find(|m| m.id == 1)
            .map(|m| m.addr)
    };
    let real = addr1(&d).expect("member 1 is listed");
    // A new member, and a takeover of member 1's id and address.
    for member in [None, Some(1)] {
        let r = ask(
            &zero.addr,
            &Request::Join {
                member,
                addr: "127.0.0.1:9".into(),
                addrs: vec![],
                restarted: true,
            },
        );
        assert_refused(&r, "Join");
    }
    assert_eq!(d.members().unwrap().len(), 2, "no member was added");
    assert_eq!(
        addr1(&d).as_deref(),
        Some(real.as_str()),
        "member 1 keeps its address"
    );
    let g: GroupFile = serde_json::from_slice(&std::fs::read(&zero.group_file).unwrap()).unwrap();
    assert!(
        g.members.iter().all(|m| m.addr != "127.0.0.1:9"),
        "the group file names no forged address: {g:?}"
    );
    d.create_topic(TopicSpec::new("after", 2))
        .expect("topics are still created");
}

#[test]
fn every_member_request_is_refused_to_an_anonymous_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start(tmp.path());
    let d = s.connect();
    let mut spec = TopicSpec::new("t", 1);
    spec.replication_factor = 1;
    d.create_topic(spec.clone()).unwrap();
    push_acked(&d, "t", 2);
    let topic = || "t".to_string();
    let requests = vec![
        Request::HostPartitions {
            topic_id: 99,
            spec: TopicSpec::new("forged", 1),
            partitions: vec![0],
            sealed: false,
        },
        Request::SealPartitions { topic: topic() },
        Request::SetReplicaRoles {
            topic: topic(),
            roles: vec![],
        },
        Request::ReplicaFetch {
            topic: topic(),
            partition: 0,
            epoch: 1,
            follower: 1,
            from: 1 << 40,
            last_epoch: 1,
            max_bytes: 1 << 20,
        },
        Request::ReportIsr {
            topic: topic(),
            partition: 0,
            epoch: 1,
            isr: vec![0],
        },
        Request::ReleasePartitions {
            topic: topic(),
            topic_id: 1,
            partitions: vec![0],
        },
        Request::FenceGroupPartition {
            topic: topic(),
            partition: 0,
            group: "g".into(),
            consumer: 1,
            epoch: 1,
        },
        Request::DropConsumerGroup {
            topic: topic(),
            group: "g".into(),
        },
        Request::MetaRpc {
            rpc: Bytes::from_static(b"forged"),
        },
        Request::Heartbeat {
            member: 0,
            addr: "127.0.0.1:9".into(),
            addrs: vec![],
        },
        Request::KafkaGroupView {
            spec: ConsumerGroupSpec::new("kg", "t", ConsumerGroupMode::Kafka),
            generation: 1,
            consumers: vec![],
        },
        Request::DropPartitions { topic: topic() },
    ];
    for req in &requests {
        assert_refused(&ask(&s.addr, req), &format!("opcode {}", req.opcode()));
    }
    // Nothing they asked for happened.
    assert_eq!(
        read_all(&d, "t", "reader", Duration::from_secs(10)).len(),
        2
    );
    push_acked(&d, "t", 1);
    assert!(d.describe("forged").is_err(), "no forged topic appeared");
    assert!(
        d.list_groups().unwrap().iter().all(|g| g.spec.name != "kg"),
        "no forged Kafka group was recorded"
    );
}

/// The probe of issue 33: with the only follower paused, `ReplicaFetch
/// {follower, from: 2^40}` from anyone put it back in the ISR, and the
/// `acks=all` pushes acknowledged then were lost with the leader.
#[test]
fn a_forged_replica_fetch_does_not_put_a_paused_follower_back_in_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let zero = ServerProcess::start(&tmp.path().join("m0"));
    let dir1 = tmp.path().join("m1");
    let mut m1 = zero.join_member(&dir1, &[], Stdio::null());
    wait_for("member 1's id", || member_id(&dir1).is_some());
    let d = zero.connect();
    wait_for("two live members", || live_members(&d) == 2);
    let spec = TopicSpec {
        replication_factor: 2,
        min_in_sync: 2,
        ..TopicSpec::new("r", 2)
    };
    d.create_topic(spec).unwrap();
    let led_by_zero = |d: &Driver| {
        let info = d.describe("r").unwrap();
        info.partitions
            .iter()
            .find(|p| p.member == 0)
            .map(|p| (p.id, p.epoch, p.isr.clone()))
    };
    let (p, epoch, _) = led_by_zero(&d).expect("member 0 leads a partition");
    wait_for("both replicas in sync", || {
        led_by_zero(&d).is_some_and(|(_, _, isr)| isr.len() == 2)
    });
    common::faults::signal(m1.0.id() as i32, libc::SIGSTOP);
    wait_for("the paused follower out of the ISR", || {
        led_by_zero(&d).is_some_and(|(_, _, isr)| isr == vec![0])
    });
    let forged = Request::ReplicaFetch {
        topic: "r".into(),
        partition: p,
        epoch,
        follower: 1,
        from: 1 << 40,
        last_epoch: epoch,
        max_bytes: 1 << 20,
    };
    // Forge as the probe did, every 300 ms: a leader that took the
    // follower id from the request would put the paused follower back in
    // the ISR, admit the push and acknowledge it on one copy.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(ask(&zero.addr, &forged));
        std::thread::sleep(Duration::from_millis(300));
    }
    let t = d.open_topic("r").unwrap();
    let producer = t.producer().unwrap();
    let push = producer
        .push_with("{\"i\":1}", vec![2u8; 16], Some(p), &[])
        .unwrap();
    let _ = producer.flush();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until && !push.is_done() {
        answers.push(ask(&zero.addr, &forged));
        std::thread::sleep(Duration::from_millis(300));
    }
    let acked = push.wait_timeout(Some(Duration::from_millis(10)));
    assert!(
        acked.is_err(),
        "an acks=all push was acknowledged while its only follower was paused: {acked:?}"
    );
    assert_eq!(led_by_zero(&d).map(|(_, _, isr)| isr), Some(vec![0]));
    for r in &answers {
        assert_refused(r, "a forged ReplicaFetch");
    }
    common::faults::signal(m1.0.id() as i32, libc::SIGCONT);
    let _ = m1.0.kill();
}

/// A joining server's secret file, written by hand.
fn secret_file(dir: &Path, bytes: &[u8]) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join("given.secret");
    std::fs::write(&f, bytes).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f
}

fn join_with_secret(zero: &ServerProcess, data: &Path, secret: &Path) -> common::JoinedMember {
    let child = Command::new(common::strom_bin())
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .arg("--join")
        .arg(&zero.group_file)
        .arg("--cluster-secret-file")
        .arg(secret)
        .env_remove("STROM_GROUP_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning the member");
    common::JoinedMember(child)
}

#[test]
fn a_server_with_another_secret_cannot_join_and_one_with_the_secret_can() {
    let tmp = tempfile::tempdir().unwrap();
    let zero = ServerProcess::start(&tmp.path().join("m0"));
    let d = zero.connect();
    // Member 0 keeps the secret in its data dir and beside the group file,
    // both readable by its user only.
    let kept = zero.data_dir.join("cluster.secret");
    let mut beside = zero.group_file.clone().into_os_string();
    beside.push(".secret");
    for f in [kept.as_path(), Path::new(&beside)] {
        let mode = std::fs::metadata(f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{}", f.display());
    }
    let wrong = secret_file(&tmp.path().join("w"), &[7u8; 32]);
    let wrong_dir = tmp.path().join("wrong");
    let mut intruder = join_with_secret(&zero, &wrong_dir, &wrong);
    let right_dir = tmp.path().join("right");
    let _member = join_with_secret(&zero, &right_dir, &kept);
    wait_for("the member with the secret joins", || {
        member_id(&right_dir).is_some() && live_members(&d) == 2
    });
    // The intruder keeps trying (its heartbeat period is short) and stays out.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        intruder.0.try_wait().unwrap().is_none(),
        "the server with the wrong secret is still running (and retrying)"
    );
    assert_eq!(member_id(&wrong_dir), None, "it was given no member id");
    assert_eq!(
        d.members().unwrap().len(),
        2,
        "only the member with the secret joined"
    );
}
