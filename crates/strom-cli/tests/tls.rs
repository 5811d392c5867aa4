//! TLS and transport identities (docs/security.md), against a real
//! `strom server` on `tls://` with certificates made here (rcgen): the CLI
//! produces and consumes over TLS trusting the server's CA; a client that
//! does not trust it, and a plaintext client, are refused while the server
//! keeps serving; with mutual TLS a client certificate's common name is the
//! principal the ACLs decide for, and one from another CA is refused;
//! members that listen only on `tls://` replicate to each other over it; and
//! over `shm://` the kernel's uid of a same-node client is its principal
//! (the server's own uid: a super user, with no token at all).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::auth::{cli, succeeded};
use common::certs::{ca, issue};
use common::{strom_bin, wait_for, ServerProcess};

#[test]
fn the_cli_produces_and_consumes_over_tls_and_untrusting_or_plaintext_clients_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let server_ca = ca(d, "server");
    let (cert, key) = issue(d, &server_ca, "localhost", true);
    let s = ServerProcess::start_on(
        &d.join("s"),
        "tls://127.0.0.1:0",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
    );
    assert!(s.addr.starts_with("tls://"), "{}", s.addr);
    let trust = [("STROM_TLS_CA", server_ca.pem.as_os_str())];
    succeeded(
        &cli(&s, &["topic", "create", "secure"], &trust, ""),
        "topic create",
    );
    succeeded(
        &cli(&s, &["produce", "secure"], &trust, "{\"n\":1}\n{\"n\":2}\n"),
        "produce",
    );
    let got = succeeded(
        &cli(
            &s,
            &[
                "consume",
                "secure",
                "--name",
                "r",
                "--from",
                "beginning",
                "--max",
                "2",
            ],
            &trust,
            "",
        ),
        "consume",
    );
    assert!(got.contains("\"n\":1") && got.contains("\"n\":2"), "{got}");
    // A client trusting another CA is refused, and says why.
    let other = ca(d, "other");
    let o = cli(
        &s,
        &["topic", "list"],
        &[("STROM_TLS_CA", other.pem.as_os_str())],
        "",
    );
    assert!(!o.status.success(), "an untrusted server is refused");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("TLS") && err.to_lowercase().contains("certificate"),
        "{err}"
    );
    // A plaintext client on the TLS port gets nothing, and the server keeps serving.
    let plain = s.addr.trim_start_matches("tls://").to_string();
    let o = Command::new(strom_bin())
        .args(["--address", &plain, "topic", "list"])
        .env_remove("STROM_TLS_CA")
        .output()
        .unwrap();
    assert!(!o.status.success(), "plaintext on a TLS port fails");
    let listed = succeeded(&cli(&s, &["topic", "list"], &trust, ""), "topic list after");
    assert!(listed.contains("secure"), "{listed}");
}

#[test]
fn with_mutual_tls_the_certificates_common_name_is_the_principal() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let server_ca = ca(d, "server");
    let client_ca = ca(d, "clients");
    let (cert, key) = issue(d, &server_ca, "localhost", true);
    let s = ServerProcess::start_on(
        &d.join("s"),
        "tls://127.0.0.1:0",
        &[
            "--auth",
            "--super-user",
            "User:ops",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            client_ca.pem.to_str().unwrap(),
            "--tls-ca",
            server_ca.pem.to_str().unwrap(),
        ],
        &[],
    );
    let as_client = |c: &(PathBuf, PathBuf)| {
        vec![
            ("STROM_TLS_CA", server_ca.pem.clone()),
            ("STROM_TLS_CERT", c.0.clone()),
            ("STROM_TLS_KEY", c.1.clone()),
        ]
    };
    let run = |env: &Vec<(&str, PathBuf)>, args: &[&str], stdin: &str| {
        let env: Vec<(&str, &std::ffi::OsStr)> =
            env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        cli(&s, args, &env, stdin)
    };
    let ops = as_client(&issue(d, &client_ca, "ops", false));
    let dana = as_client(&issue(d, &client_ca, "dana", false));
    succeeded(
        &run(&ops, &["topic", "create", "certs"], ""),
        "ops creates a topic",
    );
    let o = run(&dana, &["produce", "certs"], "{\"x\":1}\n");
    assert!(!o.status.success(), "dana has no ACL yet");
    assert!(String::from_utf8_lossy(&o.stderr).contains("User:dana"));
    let acl = [
        "acl",
        "add",
        "--principal",
        "User:dana",
        "--topic",
        "certs",
        "--operation",
        "write",
    ];
    succeeded(&run(&ops, &acl, ""), "acl add");
    wait_for("dana's ACL to reach the server", || {
        run(&dana, &["produce", "certs"], "{\"x\":1}\n")
            .status
            .success()
    });
    // A certificate from another CA does not get in.
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let rogue_ca = ca(&elsewhere, "rogue");
    let rogue = as_client(&issue(&elsewhere, &rogue_ca, "ops", false));
    let o = run(&rogue, &["topic", "delete", "certs"], "");
    assert!(
        !o.status.success(),
        "a foreign client certificate is refused"
    );
    let listed = succeeded(&run(&ops, &["topic", "list"], ""), "topic list");
    assert!(
        listed.contains("certs"),
        "the topic is still there: {listed}"
    );
}

#[test]
fn over_shm_a_same_node_client_is_its_uid_with_no_token() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), &["--auth", "--also-listen", "shm://auto"]);
    // Over TCP the same process is anonymous.
    let o = Command::new(strom_bin())
        .args([
            "--group-file",
            s.group_file.to_str().unwrap(),
            "topic",
            "create",
            "t",
        ])
        .env("STROM_TRANSPORT", "tcp")
        .env_remove("STROM_TOKEN")
        .output()
        .unwrap();
    assert!(!o.status.success(), "anonymous over TCP");
    assert!(String::from_utf8_lossy(&o.stderr).contains("ANONYMOUS"));
    // Over shm the kernel says who it is: the server's own uid, a super user.
    let o = Command::new(strom_bin())
        .args([
            "--group-file",
            s.group_file.to_str().unwrap(),
            "topic",
            "create",
            "t",
        ])
        .env("STROM_TRANSPORT", "shm")
        .env_remove("STROM_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn members_that_listen_only_on_tls_replicate_to_each_other_over_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let group_ca = ca(d, "group");
    let (cert, key) = issue(d, &group_ca, "localhost", true);
    let tls_args = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-ca",
        group_ca.pem.to_str().unwrap(),
    ];
    let s = ServerProcess::start_on(&d.join("m0"), "tls://127.0.0.1:0", &tls_args, &[]);
    let member_log = std::fs::File::create(d.join("m1.log")).unwrap();
    let _member = common::JoinedMember(
        Command::new(strom_bin())
            .args(["server", "--listen", "tls://127.0.0.1:0"])
            .args(tls_args)
            .arg("--data-dir")
            .arg(d.join("m1"))
            .arg("--join")
            .arg(&s.group_file)
            .env_remove("STROM_GROUP_FILE")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(member_log)
            .spawn()
            .unwrap(),
    );
    let trust = [("STROM_TLS_CA", group_ca.pem.as_os_str())];
    wait_for("the member to join over TLS", || {
        let o = cli(&s, &["status", "--json"], &trust, "");
        serde_json::from_slice::<serde_json::Value>(&o.stdout).is_ok_and(|v| {
            v["members"]
                .as_array()
                .is_some_and(|m| m.iter().filter(|m| m["alive"] == true).count() == 2)
        })
    });
    succeeded(
        &cli(
            &s,
            &["topic", "create", "r", "--replication-factor", "2"],
            &trust,
            "",
        ),
        "topic create",
    );
    let lines: String = (0..20).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    succeeded(&cli(&s, &["produce", "r"], &trust, &lines), "produce");
    // An acks=all push needs both copies (the topic's min in sync is 2):
    // the produce above succeeded only because the follower fetched every
    // event over tls://. Status says both copies are in sync.
    let o = cli(&s, &["status", "--json"], &trust, "");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let why = v["survives"]["topics"]["r"]["why"].as_str().unwrap_or("");
    assert!(why.contains("2 in-sync copies"), "{v}");
    let got = succeeded(
        &cli(
            &s,
            &[
                "consume",
                "r",
                "--name",
                "c",
                "--from",
                "beginning",
                "--max",
                "20",
            ],
            &trust,
            "",
        ),
        "consume",
    );
    assert_eq!(got.lines().count(), 20, "{got}");
    let log = std::fs::read_to_string(d.join("m1.log")).unwrap();
    assert!(log.contains("listening on tls://"), "{log}");
}
