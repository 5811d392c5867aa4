//! The Kafka port with `--auth` (docs/security.md): an anonymous Kafka
//! client may delete and write nothing (the review's probe deleted a topic
//! with one anonymous `DeleteTopics`), and kcat (librdkafka) authenticates
//! with a Strom token over SASL/PLAIN, then may do what the ACLs allow and
//! is refused the rest with Kafka's codes.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::kafka_raw::{connect, i16_at, record_batch, request, response, string};
use common::{read_all, wait_for, ServerProcess};

fn token(s: &ServerProcess, sub: &str) -> String {
    common::auth::token_for(s, sub, 3600)
}
use strom_client::{Driver, TopicSpec, Transports};

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

/// A server with `--auth` (admin a super user) and its Kafka listener over
/// TLS, with a certificate from a CA made here: the server, the Kafka
/// address and the CA.
fn start_tls(d: &std::path::Path) -> (ServerProcess, String, common::certs::Ca) {
    let server_ca = common::certs::ca(d, "server");
    let (cert, key) = common::certs::issue(d, &server_ca, "localhost", true);
    let args = [
        "--auth",
        "--super-user",
        "User:admin",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--kafka-tls",
    ];
    let (s, addr) = common::kafka::start_with_args(&d.join("s"), &args);
    (s, addr, server_ca)
}

fn start() -> (tempfile::TempDir, ServerProcess, String, Driver) {
    let tmp = tempfile::tempdir().unwrap();
    let (s, addr) =
        common::kafka::start_with_args(tmp.path(), &["--auth", "--super-user", "User:admin"]);
    let admin = Driver::connect_as(
        &s.group_file,
        Transports::default(),
        Some(token(&s, "admin")),
    )
    .expect("the admin connects");
    (tmp, s, addr, admin)
}

/// DeleteTopics v1 of `topic`, anonymously: the topic's error code.
fn delete_topics(addr: &str, topic: &str) -> i16 {
    let mut s = connect(addr);
    let mut b = 1i32.to_be_bytes().to_vec();
    string(&mut b, topic);
    b.extend_from_slice(&5_000i32.to_be_bytes());
    s.write_all(&request(20, 1, 7, &b)).unwrap();
    let r = response(&mut s).expect("a DeleteTopics answer");
    // corr, throttle, results(1), name, error
    i16_at(&r, 4 + 4 + 4 + 2 + topic.len())
}

#[test]
fn an_anonymous_kafka_client_can_delete_or_write_nothing() {
    let (_tmp, s, addr, admin) = start();
    admin.create_topic(TopicSpec::new("kept", 1)).unwrap();
    let t = admin.open_topic("kept").unwrap();
    let p = t.producer().unwrap();
    let fs: Vec<_> = (0..3)
        .map(|i| p.push(format!("{{\"i\":{i}}}"), vec![1u8; 4]).unwrap())
        .collect();
    p.flush().unwrap();
    for f in fs {
        f.wait().unwrap();
    }
    assert_eq!(delete_topics(&addr, "kept"), TOPIC_AUTHORIZATION_FAILED);
    let mut c = connect(&addr);
    let (code, _) =
        common::kafka_raw::produce(&mut c, 3, "kept", &record_batch(-1, -1, -1, &[b"planted"]));
    assert_eq!(code, TOPIC_AUTHORIZATION_FAILED);
    assert_eq!(
        read_all(&admin, "kept", "r", Duration::from_secs(10)).len(),
        3
    );
    assert!(admin.describe("kept").is_ok(), "the topic is still there");
    // Both refusals are in the audit topic, as the Kafka front end's.
    let refused = |rs: &[serde_json::Value], op: &str| {
        rs.iter().any(|r| {
            r["front_end"] == "kafka"
                && r["outcome"] == "refused"
                && r["principal"] == "User:ANONYMOUS"
                && r["operation"] == op
                && r["resource"] == "topic 'kept'"
                && r["peer"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("127.0.0.1:"))
        })
    };
    wait_for("the Kafka refusals in strom.audit", || {
        let rs = common::audit::records(&admin, "auditor").unwrap_or_default();
        refused(&rs, "delete") && refused(&rs, "write")
    });
    drop(s);
}

/// kcat with `args` (SASL settings included); its exit status, stdout and stderr.
fn kcat(args: &[String], stdin: &[u8]) -> (bool, String, String) {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat (make setup-test installs it)");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sasl(addr: &str, user: &str, password: &str, rest: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec!["-b".into(), addr.into()];
    for x in [
        "security.protocol=SASL_PLAINTEXT".to_string(),
        "sasl.mechanisms=PLAIN".into(),
        format!("sasl.username={user}"),
        format!("sasl.password={password}"),
    ] {
        v.push("-X".into());
        v.push(x);
    }
    v.extend(rest.iter().map(|s| s.to_string()));
    v
}

#[test]
fn kcat_with_a_token_over_sasl_plain_may_do_what_the_acls_allow() {
    let (_tmp, s, addr, admin) = start();
    for t in ["k.a", "other"] {
        admin.create_topic(TopicSpec::new(t, 1)).unwrap();
    }
    let acl = |op: &str| {
        format!(
            r#"[{{"principal":"User:alice","resource":"topic","pattern":{{"prefix":"k."}},"operation":"{op}","permission":"allow"}}]"#
        )
    };
    admin.alter_acls(true, acl("write")).unwrap();
    admin.alter_acls(true, acl("read")).unwrap();
    let alice = token(&s, "alice");
    let produce = sasl(&addr, "alice", &alice, &["-P", "-t", "k.a"]);
    wait_for("alice's ACLs to reach the server", || {
        kcat(&produce, b"one\ntwo\n").0
    });
    let consume = sasl(
        &addr,
        "alice",
        &alice,
        &["-C", "-t", "k.a", "-o", "beginning", "-c", "2", "-e"],
    );
    let (ok, out, err) = kcat(&consume, b"");
    assert!(ok, "{err}");
    assert!(out.contains("one") && out.contains("two"), "{out}");
    // No ACL on `other`: refused with Kafka's topic authorization code.
    let (ok, _, err) = kcat(
        &sasl(&addr, "alice", &alice, &["-P", "-t", "other"]),
        b"x\n",
    );
    assert!(
        !ok && err.contains("uthoriz"),
        "a write to `other` is refused: {err}"
    );
    // A password that is no token of this group: authentication fails.
    let (ok, _, err) = kcat(&sasl(&addr, "alice", "letmein", &["-L"]), b"");
    assert!(!ok, "a bad token is refused: {err}");
    assert!(err.contains("uthentication"), "{err}");
    // The user name must be the token's subject.
    let (ok, _, err) = kcat(&sasl(&addr, "mallory", &alice, &["-L"]), b"");
    assert!(!ok && err.contains("uthentication"), "{err}");
    assert_eq!(
        read_all(&admin, "other", "r", Duration::from_secs(10)).len(),
        0
    );
}

#[test]
fn kcat_over_sasl_ssl_trusts_the_servers_ca_and_authenticates_with_a_token() {
    use common::certs::ca;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (s, addr, server_ca) = start_tls(d);
    let admin = Driver::connect_as(
        &s.group_file,
        Transports::default(),
        Some(token(&s, "admin")),
    )
    .unwrap();
    admin.create_topic(TopicSpec::new("enc", 1)).unwrap();
    let t = token(&s, "admin");
    let ssl = |ca_file: &std::path::Path, rest: &[&str]| {
        let mut v: Vec<String> = sasl(&addr, "admin", &t, rest)
            .into_iter()
            .map(|a| a.replace("SASL_PLAINTEXT", "SASL_SSL"))
            .collect();
        v.insert(0, format!("ssl.ca.location={}", ca_file.display()));
        v.insert(0, "-X".into());
        v
    };
    let (ok, _, err) = kcat(&ssl(&server_ca.pem, &["-P", "-t", "enc"]), b"secret\n");
    assert!(ok, "{err}");
    let (ok, out, err) = kcat(
        &ssl(
            &server_ca.pem,
            &["-C", "-t", "enc", "-o", "beginning", "-c", "1", "-e"],
        ),
        b"",
    );
    assert!(ok && out.contains("secret"), "{out} {err}");
    // A client that does not trust the server's CA does not connect.
    let other = ca(d, "other");
    let (ok, _, err) = kcat(&ssl(&other.pem, &["-L"]), b"");
    assert!(!ok, "{err}");
    // Plaintext SASL on the TLS port fails too.
    let (ok, _, _) = kcat(&sasl(&addr, "admin", &t, &["-L"]), b"");
    assert!(!ok);
}

#[test]
fn kcat_with_scram_users_over_sasl_ssl_and_the_keys_stay_with_members() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (s, addr, server_ca) = start_tls(d);
    let admin_token = token(&s, "admin");
    let admin = Driver::connect_as(
        &s.group_file,
        Transports::default(),
        Some(admin_token.clone()),
    )
    .unwrap();
    admin.create_topic(TopicSpec::new("sc", 1)).unwrap();
    let pw = d.join("erin.pw");
    std::fs::write(&pw, "correct horse\n").unwrap();
    let strom = |args: &[&str]| {
        Command::new(common::strom_bin())
            .arg("--group-file")
            .arg(&s.group_file)
            .args(args)
            .env("STROM_TOKEN", &admin_token)
            .output()
            .unwrap()
    };
    let o = strom(&[
        "user",
        "set",
        "erin",
        "--password-file",
        pw.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = strom(&[
        "acl",
        "add",
        "--principal",
        "User:erin",
        "--topic",
        "sc",
        "--operation",
        "all",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The ACL listing does not hand out SCRAM keys.
    let listed = admin.security_table().unwrap();
    assert!(!listed.contains("stored_key"), "{listed}");
    let scram = |mech: &str, password: &str, rest: &[&str]| {
        let mut v: Vec<String> = vec!["-b".into(), addr.clone()];
        for x in [
            "security.protocol=SASL_SSL".to_string(),
            format!("ssl.ca.location={}", server_ca.pem.display()),
            format!("sasl.mechanisms={mech}"),
            "sasl.username=erin".into(),
            format!("sasl.password={password}"),
        ] {
            v.push("-X".into());
            v.push(x);
        }
        v.extend(rest.iter().map(|r| r.to_string()));
        v
    };
    wait_for("erin's ACL to reach the server", || {
        kcat(
            &scram("SCRAM-SHA-256", "correct horse", &["-P", "-t", "sc"]),
            b"a\n",
        )
        .0
    });
    let (ok, _, err) = kcat(
        &scram("SCRAM-SHA-512", "correct horse", &["-P", "-t", "sc"]),
        b"b\n",
    );
    assert!(ok, "{err}");
    let (ok, out, err) = kcat(
        &scram(
            "SCRAM-SHA-512",
            "correct horse",
            &["-C", "-t", "sc", "-o", "beginning", "-c", "2", "-e"],
        ),
        b"",
    );
    assert!(ok && out.contains('a') && out.contains('b'), "{out} {err}");
    let (ok, _, err) = kcat(&scram("SCRAM-SHA-256", "wrong horse", &["-L"]), b"");
    assert!(
        !ok && err.contains("uthentication"),
        "a wrong password is refused: {err}"
    );
    let o = strom(&["user", "remove", "erin"]);
    assert!(o.status.success());
    wait_for("the removal to reach the server", || {
        !kcat(&scram("SCRAM-SHA-256", "correct horse", &["-L"]), b"").0
    });
}
