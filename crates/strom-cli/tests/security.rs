//! Users, tokens and ACLs (docs/security.md), against a real `strom server
//! --auth`: the probes of the security review replayed as an anonymous
//! client and as a user without the permission (each refused, nothing
//! changed); what ACLs grant; expired, revoked, foreign and out-of-scope
//! tokens; the CLI's `token` and `acl` commands; and protected mode.

mod common;

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::auth::{cli, succeeded};
use common::raw::{connect, read_until_reply, request_frame, responses};
use common::{read_all, strom_bin, wait_for, ServerProcess};
use strom_auth::{Claims, TokenKey};
use strom_client::Transports;
use strom_client::{Driver, TopicSpec};
use strom_proto::{ErrorCode, Request, Response};
use strom_server::member_auth::{ClusterSecret, SECRET_FILE};

/// These tests are about clients that reach the server over the network:
/// without `--no-shm`, a client of the server's own user on its node takes
/// shm and is that uid, a super user (tls.rs tests that).
const AUTH: &[&str] = &["--auth", "--super-user", "User:admin", "--no-shm"];

fn key(s: &ServerProcess) -> TokenKey {
    ClusterSecret::read(&s.data_dir.join(SECRET_FILE))
        .expect("the server's cluster secret")
        .token_key()
}

/// A token for `sub`, valid an hour, limited to `topics` and `ops` if given.
fn token(s: &ServerProcess, sub: &str, topics: &[&str], ops: &[&str]) -> String {
    let mut c = Claims::new(sub, strom_server::now_secs(), 3600).unwrap();
    c.topics = topics.iter().map(|t| t.to_string()).collect();
    c.ops = ops.iter().map(|t| t.to_string()).collect();
    key(s).sign(&c).unwrap()
}

fn connect_as(s: &ServerProcess, token: Option<String>) -> strom_client::Result<Driver> {
    Driver::connect_as(&s.group_file, Transports::default(), token)
}

fn admin(s: &ServerProcess) -> Driver {
    connect_as(s, Some(token(s, "admin", &[], &[]))).expect("the admin connects")
}

fn code(r: strom_client::Result<impl std::fmt::Debug>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected a refusal, got {v:?}"),
        Err(e) => e.code(),
    }
}

fn push(d: &Driver, topic: &str, n: u64) -> strom_client::Result<()> {
    let t = d.open_topic(topic)?;
    let p = t.producer()?;
    let fs: Vec<_> = (0..n)
        .map(|i| p.push_with(format!("{{\"i\":{i}}}"), vec![7u8; 8], Some(0), &[]))
        .collect::<Result<_, _>>()?;
    p.flush()?;
    for f in fs {
        f.wait()?;
    }
    Ok(())
}

/// An open producer that keeps `topic`'s stream from ending while the
/// test's producers come and go.
fn keep_open(d: &Driver, topic: &str) -> strom_client::Producer {
    d.open_topic(topic).unwrap().producer().unwrap()
}

/// Sends `req` on a fresh anonymous raw connection; the answer.
fn ask_raw(addr: &str, req: &Request) -> Response {
    let mut s = connect(addr);
    s.write_all(&request_frame(9, req, b"")).expect("sending");
    let got = read_until_reply(&mut s, 9, "an anonymous request");
    match responses(&got).into_iter().find(|(id, _)| *id == 9) {
        Some((_, r)) => r,
        None => panic!("no answer to {req:?}"),
    }
}

fn assert_not_authorized(r: &Response, what: &str) {
    match r {
        Response::Error { code, message } if *code == ErrorCode::NOT_AUTHORIZED => {
            assert!(message.contains("ANONYMOUS"), "{what}: {message}");
        }
        other => {
            panic!("{what} from an anonymous connection: expected NOT_AUTHORIZED, got {other:?}")
        }
    }
}

fn allow(d: &Driver, principal: &str, kind: &str, name: &str, op: &str) {
    let e = serde_json::json!([{
        "principal": principal,
        "resource": kind,
        "pattern": {"prefix": name.trim_end_matches('*')},
        "operation": op,
        "permission": "allow",
    }]);
    let e = match name.ends_with('*') {
        true => e,
        false => {
            let mut e = e;
            e[0]["pattern"] = serde_json::json!({"literal": name});
            e
        }
    };
    d.alter_acls(true, e.to_string()).expect("adding an ACL");
}

#[test]
fn anonymous_probes_are_refused_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let a = admin(&s);
    a.create_topic(TopicSpec::new("kept", 1)).unwrap();
    let _open = keep_open(&a, "kept");
    push(&a, "kept", 3).unwrap();
    let probes = [
        Request::DeleteTopic { name: "kept".into() },
        Request::CompleteTopic { name: "kept".into() },
        Request::CreateTopic { spec: TopicSpec::new("planted", 1), member: None },
        Request::Commit { topic: "kept".into(), partition: 0, consumer: "reader".into(), offset: 3 },
        Request::RegisterProducer { topic: "kept".into() },
        Request::Scrub { topic: "kept".into(), partition: 0 },
        Request::AlterAcls {
            add: true,
            json: r#"[{"principal":"*","resource":"topic","pattern":{"prefix":""},"operation":"all","permission":"allow"}]"#.into(),
        },
        Request::DrainMember { member: 0, dead: false },
        Request::ServerSnapshot,
    ];
    for p in &probes {
        assert_not_authorized(&ask_raw(&s.addr, p), &format!("{p:?}"));
    }
    // An anonymous client library gets the same answers.
    let anon = connect_as(&s, None).expect("an anonymous client connects");
    assert_eq!(code(anon.delete_topic("kept")), ErrorCode::NOT_AUTHORIZED);
    assert_eq!(code(push(&anon, "kept", 1)), ErrorCode::NOT_AUTHORIZED);
    assert!(
        anon.list_topics().unwrap().is_empty(),
        "anonymous sees no topic"
    );
    // Nothing changed.
    let got = read_all(&a, "kept", "reader", Duration::from_secs(10));
    assert_eq!(got.len(), 3, "the acknowledged events are all there");
    let info = a.describe("kept").unwrap();
    assert!(!info.state.ended, "the stream was not ended");
    let topics: Vec<String> = a
        .list_topics()
        .unwrap()
        .into_iter()
        .map(|t| t.spec.name)
        .collect();
    assert_eq!(
        topics,
        ["kept", common::audit::AUDIT],
        "no topic was planted"
    );
    assert!(a.security_table().unwrap().contains("\"acls\":[]"));
    // The audit log has who created the topic, and each refusal.
    let log = s.stderr();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("strom::audit")).collect();
    assert!(
        audit.iter().any(|l| l.contains("principal=User:admin")
            && l.contains("operation=create")
            && l.contains("topic 'kept'")),
        "{log}"
    );
    let refusals = audit
        .iter()
        .filter(|l| l.contains("refused") && l.contains("User:ANONYMOUS"))
        .count();
    assert!(
        refusals >= probes.len(),
        "{refusals} refusals logged:\n{log}"
    );
}

#[test]
fn a_user_may_do_what_the_acls_allow_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let a = admin(&s);
    a.create_topic(TopicSpec::new("sim.a", 1)).unwrap();
    a.create_topic(TopicSpec::new("other", 1)).unwrap();
    let _open = [keep_open(&a, "sim.a"), keep_open(&a, "other")];
    let alice = connect_as(&s, Some(token(&s, "alice", &[], &[]))).unwrap();
    assert_eq!(code(push(&alice, "sim.a", 1)), ErrorCode::NOT_AUTHORIZED);
    allow(&a, "User:alice", "topic", "sim.*", "write");
    let mut written = 0;
    wait_for("alice's write ACL to reach the server", || {
        let ok = push(&alice, "sim.a", 2).is_ok();
        written += 2 * ok as usize;
        ok
    });
    assert_eq!(code(push(&alice, "other", 1)), ErrorCode::NOT_AUTHORIZED);
    assert_eq!(code(alice.delete_topic("sim.a")), ErrorCode::NOT_AUTHORIZED);
    let names: Vec<_> = alice
        .list_topics()
        .unwrap()
        .into_iter()
        .map(|t| t.spec.name)
        .collect();
    assert_eq!(
        names,
        vec!["sim.a".to_string()],
        "alice lists only what she may describe"
    );
    // A deny entry wins over the allow.
    let deny = r#"[{"principal":"User:alice","resource":"topic","pattern":{"literal":"sim.a"},"operation":"write","permission":"deny"}]"#;
    a.alter_acls(true, deny.into()).unwrap();
    wait_for("the deny to reach the server", || {
        let ok = push(&alice, "sim.a", 1).is_ok();
        written += ok as usize;
        !ok
    });
    assert_eq!(code(push(&alice, "sim.a", 1)), ErrorCode::NOT_AUTHORIZED);
    // Bob, with no ACL, may do nothing; all that was written is what
    // alice was allowed to write.
    let bob = connect_as(&s, Some(token(&s, "bob", &[], &[]))).unwrap();
    assert_eq!(code(bob.delete_topic("sim.a")), ErrorCode::NOT_AUTHORIZED);
    assert_eq!(code(push(&bob, "sim.a", 1)), ErrorCode::NOT_AUTHORIZED);
    assert_eq!(
        read_all(&a, "sim.a", "r", Duration::from_secs(10)).len(),
        written
    );
    assert_eq!(read_all(&a, "other", "r", Duration::from_secs(10)).len(), 0);
}

#[test]
fn expired_revoked_foreign_and_out_of_scope_tokens_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let a = admin(&s);
    a.create_topic(TopicSpec::new("sim.a", 1)).unwrap();
    let _open = keep_open(&a, "sim.a");
    allow(&a, "User:carol", "topic", "*", "all");
    // Expired.
    let mut c = Claims::new("carol", 1_000, 60).unwrap();
    c.iat = strom_server::now_secs() - 120;
    c.exp = strom_server::now_secs() - 60;
    let expired = key(&s).sign(&c).unwrap();
    let e = connect_as(&s, Some(expired))
        .err()
        .expect("an expired token is refused");
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED, "{e}");
    assert!(e.to_string().contains("expired"), "{e}");
    // Signed by another cluster's key.
    let foreign = TokenKey::from_secret(b"not this group's secret at all!!")
        .sign(&Claims::new("carol", strom_server::now_secs(), 60).unwrap())
        .unwrap();
    let e = connect_as(&s, Some(foreign))
        .err()
        .expect("a foreign token is refused");
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED);
    assert!(e.to_string().contains("signature"), "{e}");
    // Garbage.
    let e = connect_as(&s, Some("letmein".into())).err().unwrap();
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED);
    // Scoped to other topics: refused on this one, with the reason.
    let scoped = connect_as(&s, Some(token(&s, "carol", &["other.*"], &["produce"]))).unwrap();
    let e = push(&scoped, "sim.a", 1).err().unwrap();
    assert_eq!(e.code(), ErrorCode::NOT_AUTHORIZED);
    assert!(e.to_string().contains("scope"), "{e}");
    // Revoked: an open connection loses its rights, and a new one is refused.
    let mut claims = Claims::new("carol", strom_server::now_secs(), 3600).unwrap();
    claims.ops = vec![];
    let t = key(&s).sign(&claims).unwrap();
    let carol = connect_as(&s, Some(t.clone())).unwrap();
    wait_for("carol's ACL to reach the server", || {
        push(&carol, "sim.a", 1).is_ok()
    });
    a.revoke_token(&claims.jti).unwrap();
    wait_for("the revocation to reach the server", || {
        push(&carol, "sim.a", 1).is_err()
    });
    assert_eq!(code(push(&carol, "sim.a", 1)), ErrorCode::NOT_AUTHORIZED);
    let e = connect_as(&s, Some(t))
        .err()
        .expect("a revoked token is refused");
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED);
    assert!(e.to_string().contains("revoked"), "{e}");
}

#[test]
fn the_cli_creates_tokens_manages_acls_and_reads_its_token_from_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let dir = s.data_dir.to_str().unwrap();
    let mk = |sub: &str| {
        let o = cli(
            &s,
            &[
                "token",
                "create",
                "--subject",
                sub,
                "--ttl",
                "1h",
                "--data-dir",
                dir,
            ],
            &[],
            "",
        );
        succeeded(&o, "token create").trim().to_string()
    };
    let admin_token = mk("admin");
    let dave_token = mk("dave");
    let as_admin = [("STROM_TOKEN", OsStr::new(admin_token.as_str()))];
    succeeded(
        &cli(&s, &["topic", "create", "jobs"], &as_admin, ""),
        "topic create",
    );
    let acl = [
        "acl",
        "add",
        "--principal",
        "User:dave",
        "--topic",
        "jobs",
        "--operation",
        "write",
    ];
    succeeded(&cli(&s, &acl, &as_admin, ""), "acl add");
    let listed = succeeded(&cli(&s, &["acl", "list"], &as_admin, ""), "acl list");
    assert!(
        listed.contains("allow User:dave write on topic jobs"),
        "{listed}"
    );
    // Without a token, the CLI is refused and says why.
    let o = cli(&s, &["topic", "delete", "jobs"], &[], "");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("NOT_AUTHORIZED") && err.contains("ANONYMOUS"),
        "{err}"
    );
    // Dave's token from a file (--token-file), after the ACL reached the server.
    let file = tmp.path().join("dave.token");
    std::fs::write(&file, &dave_token).unwrap();
    let f = file.to_str().unwrap();
    wait_for("dave's ACL to reach the server", || {
        cli(
            &s,
            &["--token-file", f, "produce", "jobs"],
            &[],
            "{\"job\":1}\n",
        )
        .status
        .success()
    });
    let o = cli(&s, &["--token-file", f, "topic", "delete", "jobs"], &[], "");
    assert!(!o.status.success(), "dave may not delete");
    let read = succeeded(
        &cli(
            &s,
            &[
                "consume",
                "jobs",
                "--name",
                "r",
                "--from",
                "beginning",
                "--max",
                "1",
            ],
            &as_admin,
            "",
        ),
        "consume",
    );
    assert!(read.contains("\"job\":1"), "{read}");
    succeeded(
        &cli(
            &s,
            &[
                "acl",
                "remove",
                "--principal",
                "User:dave",
                "--topic",
                "jobs",
                "--operation",
                "write",
            ],
            &as_admin,
            "",
        ),
        "acl remove",
    );
    let listed = succeeded(&cli(&s, &["acl", "list"], &as_admin, ""), "acl list");
    assert!(!listed.contains("User:dave"), "{listed}");
}

#[test]
fn without_auth_a_server_refuses_a_network_address_unless_insecure() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], dir: &Path| {
        Command::new(strom_bin())
            .args([
                "server",
                "--data-dir",
                dir.to_str().unwrap(),
                "--listen",
                "0.0.0.0:0",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = run(&[], &tmp.path().join("a")).wait_with_output().unwrap();
    assert!(!out.status.success(), "refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to serve 0.0.0.0:0 without authentication")
            && err.contains("--insecure"),
        "{err}"
    );
    let s = ServerProcess::start_with(
        &tmp.path().join("b"),
        &["--insecure", "--also-listen", "0.0.0.0:0"],
    );
    let o = Command::new(strom_bin())
        .args([
            "--group-file",
            s.group_file.to_str().unwrap(),
            "status",
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["security"], "insecure", "{v}");
    wait_for("the insecure warning", || {
        s.stderr().contains("without authentication")
    });
}

#[test]
fn cluster_up_with_auth_writes_a_private_token_for_the_launching_user() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let up = Command::new(strom_bin())
        .args(["cluster", "up", "--servers", "1", "--auth", "--data-dir"])
        .arg(&dir)
        .env("USER", "launcher")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&up.stderr);
    assert!(up.status.success(), "{err}");
    let group = String::from_utf8_lossy(&up.stdout).trim().to_string();
    let token = dir.join("token");
    assert!(
        err.contains(&format!("STROM_TOKEN_FILE={}", token.display())),
        "{err}"
    );
    let mode = std::fs::metadata(&token).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is the user's alone");
    // Over TCP, as a client on another node: the shm address of a member
    // would make a client of the launching user that uid, a super user.
    let run_via = |args: &[&str], with_token: bool, transport: &str| {
        let mut c = Command::new(strom_bin());
        c.args(["--group-file", &group]).args(args);
        c.env_remove("STROM_TOKEN").env_remove("STROM_TOKEN_FILE");
        c.env("STROM_TRANSPORT", transport);
        if with_token {
            c.env("STROM_TOKEN_FILE", &token);
        }
        c.output().unwrap()
    };
    let run = |args: &[&str], with_token: bool| run_via(args, with_token, "tcp");
    let o = run(&["topic", "create", "t"], false);
    assert!(!o.status.success(), "refused without the token");
    assert!(String::from_utf8_lossy(&o.stderr).contains("NOT_AUTHORIZED"));
    let o = run(&["topic", "create", "t"], true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // On the node, over the servers' default shm address, the launching
    // user needs no token: the kernel says who it is.
    let o = run_via(&["topic", "create", "on-node"], false, "shm,tcp");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["status", "--json"], true);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["security"], "auth", "{v}");
    let down = Command::new(strom_bin())
        .args(["cluster", "down", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
}

#[test]
fn mpirun_with_auth_writes_a_private_token_for_the_launching_user_beside_the_group_file() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let gf = tmp.path().join("group.json");
    let mpirun = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(strom_bin())
        .args(["server", "--listen", "127.0.0.1:0", "--auth", "--data-dir"])
        .arg(tmp.path().join("data"))
        .arg("--group-file")
        .arg(&gf)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("USER", "mpiuser")
        .env_remove("STROM_RANK")
        .env_remove("STROM_SIZE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun must be installed (make test installs openmpi-bin)");
    let token = tmp.path().join("group.json.token");
    wait_for("rank 0's token for the launching user", || {
        std::fs::read_to_string(&token).is_ok_and(|t| t.ends_with('\n'))
    });
    let mode = std::fs::metadata(&token).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is the user's alone");
    wait_for("the group file", || gf.exists());
    // Over TCP, as a client on another node (see cluster up's test).
    let run = |args: &[&str], with_token: bool| {
        let mut c = Command::new(strom_bin());
        c.arg("--group-file").arg(&gf).args(args);
        c.env_remove("STROM_TOKEN").env_remove("STROM_TOKEN_FILE");
        c.env("STROM_TRANSPORT", "tcp");
        if with_token {
            c.env("STROM_TOKEN_FILE", &token);
        }
        c.output().unwrap()
    };
    let o = run(&["topic", "create", "t", "--partitions", "2"], false);
    assert!(!o.status.success(), "refused without the token");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("NOT_AUTHORIZED"), "{err}");
    // The launching user is a super user on every rank: the topic's two
    // partitions, one per rank, take its events.
    let o = run(&["topic", "create", "t", "--partitions", "2"], true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["produce", "t"], true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = Command::new("kill")
        .args(["-TERM", &mpirun.id().to_string()])
        .status();
    let out = mpirun.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("STROM_TOKEN_FILE={}", token.display()))
            && err.contains("User:mpiuser"),
        "rank 0 says where the token is:\n{err}"
    );
}
