//! The audit topic (docs/security.md, "Audit"): on a 2-member group with
//! `--auth`, each member appends the changes and refusals it decided to
//! its own partition of `strom.audit`, from the native port and the HTTP
//! endpoint; only super users (or an ACL) read it, and nobody but the
//! servers writes it.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::auth::token_for;
use common::http::http_addr;
use common::{live_members, wait_for, ServerProcess};
use strom_client::{ConsumerOptions, Driver, Next, TopicSpec, Transports};
use strom_proto::ErrorCode;

const AUTH: &[&str] = &["--auth", "--super-user", "User:admin"];
use common::audit::AUDIT;

fn connect_as(s: &ServerProcess, sub: &str) -> Driver {
    Driver::connect_as(
        &s.group_file,
        Transports::default(),
        Some(token_for(s, sub, 3600)),
    )
    .expect("connecting")
}

/// Pushes one event to `partition` of `topic`, waiting for its answer.
fn push_to(d: &Driver, topic: &str, partition: u32) -> strom_client::Result<()> {
    let t = d.open_topic(topic)?;
    let p = t.producer()?;
    let f = p.push_with("{\"x\":1}", vec![1u8; 4], Some(partition), &[])?;
    p.flush()?;
    f.wait().map(drop)
}

/// Reads one event of `partition` of `topic` (its owner answers).
fn read_one(d: &Driver, topic: &str, partition: u32) -> strom_client::Result<()> {
    let t = d.open_topic(topic)?;
    let opts = ConsumerOptions {
        partitions: Some(vec![partition]),
        ..Default::default()
    };
    let c = t.consumer_with("bob", opts)?;
    match c.pull_timeout(Duration::from_secs(10))? {
        Next::Event(_) | Next::EndOfStream => Ok(()),
    }
}

/// Lets `principal` describe topic `topic` (and nothing else).
fn allow_describe(d: &Driver, principal: &str, topic: &str) {
    let e = serde_json::json!([{
        "principal": principal,
        "resource": "topic",
        "pattern": {"literal": topic},
        "operation": "describe",
        "permission": "allow",
    }]);
    d.alter_acls(true, e.to_string()).expect("adding an ACL");
}

fn lines(rs: &[serde_json::Value]) -> String {
    rs.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn has(rs: &[serde_json::Value], f: impl Fn(&serde_json::Value) -> bool) -> bool {
    rs.iter().any(f)
}

#[test]
fn each_member_audits_changes_and_refusals_to_its_own_partition_that_only_admins_read() {
    let tmp = tempfile::tempdir().unwrap();
    let mut extra = AUTH.to_vec();
    extra.extend(["--http-listen", "127.0.0.1:0"]);
    let s = ServerProcess::start_with(tmp.path(), &extra);
    let m1_log = tmp.path().join("m1.log");
    let log = std::fs::File::create(&m1_log).unwrap();
    let _m1 = s.join_member(&tmp.path().join("m1"), AUTH, Stdio::from(log));
    let admin = connect_as(&s, "admin");
    wait_for("the second member to join", || live_members(&admin) == 2);
    // Two partitions, one on each member.
    admin.create_topic(TopicSpec::new("jobs", 2)).unwrap();
    let info = admin.describe("jobs").unwrap();
    let owners: std::collections::BTreeSet<u32> =
        info.partitions.iter().map(|p| p.member).collect();
    assert_eq!(owners.len(), 2, "one partition per member: {info:?}");
    // bob may describe the topic and nothing else: his reads are refused
    // by each partition's owner, his write and deletion by the registry's
    // member.
    let bob = connect_as(&s, "bob");
    allow_describe(&admin, "User:bob", "jobs");
    wait_for("bob's describe ACL to reach the registry", || {
        bob.describe("jobs").is_ok()
    });
    for p in 0..2 {
        let e = read_one(&bob, "jobs", p).expect_err("bob may not read");
        assert_eq!(e.code(), ErrorCode::NOT_AUTHORIZED, "{e}");
    }
    let e = push_to(&bob, "jobs", 0).expect_err("bob may not write");
    assert_eq!(e.code(), ErrorCode::NOT_AUTHORIZED, "{e}");
    assert_eq!(
        bob.delete_topic("jobs").unwrap_err().code(),
        ErrorCode::NOT_AUTHORIZED
    );
    // An HTTP request for the dashboard's data without a token.
    let (status, ..) = common::http::get(&http_addr(&s), "/api/snapshot", "application/json");
    assert_eq!(status, 401);

    // Each member wrote to its own partition; every record names who,
    // what, on what, and how it ended.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    let mut complete = || {
        seen = match common::audit::records(&admin, "auditor") {
            Ok(rs) => rs,
            Err(e) => {
                last = e.to_string();
                return false;
            }
        };
        let refused_on = |m: u32| {
            has(&seen, |r| {
                r["member"] == m
                    && r["outcome"] == "refused"
                    && r["principal"] == "User:bob"
                    && r["front_end"] == "native"
                    && r["resource"].as_str().is_some_and(|x| x.contains("jobs"))
            })
        };
        owners.iter().all(|m| refused_on(*m))
            && has(&seen, |r| {
                r["outcome"] == "done"
                    && r["principal"] == "User:admin"
                    && r["operation"] == "create"
                    && r["resource"] == "topic 'jobs'"
            })
            && has(&seen, |r| {
                r["front_end"] == "http"
                    && r["outcome"] == "refused"
                    && r["resource"] == "http:/api"
            })
    };
    while !complete() {
        assert!(
            Instant::now() < deadline,
            "the audit records of both members did not come:\n{}\n{last}\n{}\nmember 1:\n{}",
            lines(&seen),
            s.stderr(),
            std::fs::read_to_string(&m1_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A joined member's own transform host authenticates as the member:
    // it never connects anonymously (it waits for the group's secret).
    assert!(
        !has(&seen, |r| r["principal"] == "User:ANONYMOUS"
            && r["front_end"] == "native"),
        "{}",
        lines(&seen)
    );
    assert!(seen
        .iter()
        .all(|r| r["time_ms"].as_u64().is_some_and(|t| t > 0)
            && r["peer"].as_str().is_some_and(|p| !p.is_empty())));
    let audit = admin.describe(AUDIT).unwrap();
    let placed: std::collections::BTreeSet<u32> =
        audit.partitions.iter().map(|p| p.member).collect();
    assert_eq!(
        placed, owners,
        "one audit partition on each member: {audit:?}"
    );
    for p in &audit.partitions {
        let mine = seen.iter().filter(|r| r["member"] == p.member).count() as u64;
        assert!(mine > 0 && p.next_offset > 0, "{p:?}");
    }
    for r in &seen {
        let on = audit
            .partitions
            .iter()
            .find(|p| u64::from(p.member) == r["member"].as_u64().unwrap());
        assert!(
            on.is_some(),
            "a record of a member without a partition: {r}"
        );
    }

    // bob may not read the audit topic; nobody may write it, not even a
    // super user.
    let e = common::audit::records(&bob, "bob").expect_err("bob may not read the audit");
    assert_eq!(e.code(), ErrorCode::NOT_AUTHORIZED, "{e}");
    let e = push_to(&admin, AUDIT, 0).expect_err("nobody writes the audit topic");
    assert_eq!(e.code(), ErrorCode::NOT_AUTHORIZED, "{e}");
    assert!(e.to_string().contains("only by the servers"), "{e}");
}
