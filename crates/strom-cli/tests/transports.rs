//! Choosing a transport, on real processes: a server listening on TCP and
//! shared memory publishes both in its group file; a client on its node
//! picks shm and moves data parts by cross-memory attach; a client of
//! another user, which may not read the server's memory, still uses shm,
//! with its data parts through the socket and a log line saying why.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::ServerProcess;
use strom_client::{ConsumerOptions, Driver, Next, Selection, StartPos, TopicSpec, Transports};

fn addrs_in_group_file(group_file: &Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(group_file).unwrap()).unwrap();
    v["members"][0]["addrs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn data(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u64).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect()
}

/// Pushes `n` events of `len` bytes and reads them back, whole and as a
/// range, checking every byte.
fn round_trip(d: &Driver, topic: &str, n: u64, len: usize) {
    let t = d.create_topic(TopicSpec::new(topic, 1)).unwrap();
    let p = t.producer().unwrap();
    let futs: Vec<_> = (0..n)
        .map(|i| p.push(serde_json::json!({ "i": i }), data(i, len)).unwrap())
        .collect();
    for f in futs {
        f.wait().unwrap();
    }
    p.close().unwrap();
    for (name, sel) in [
        ("all", Selection::All),
        (
            "range",
            Selection::Range {
                offset: len as u64 / 4,
                len: len as u64 / 2,
            },
        ),
    ] {
        let c = t
            .consumer_with(
                name,
                ConsumerOptions {
                    selector: Arc::new(sel.clone()),
                    start: StartPos::Beginning,
                    ..Default::default()
                },
            )
            .unwrap();
        for i in 0..n {
            let e = match c.pull_timeout(Duration::from_secs(20)).unwrap() {
                Next::Event(e) => e,
                Next::EndOfStream => panic!("end of stream after {i} events"),
            };
            let want = data(e.offset, len);
            let want = match sel {
                Selection::Range { offset, len } => {
                    want[offset as usize..(offset + len) as usize].to_vec()
                }
                _ => want,
            };
            assert!(e.data_vec() == want, "event {i} ({name}): bytes differ");
        }
    }
}

#[test]
fn a_client_on_the_servers_node_picks_shm_and_every_byte_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_env(
        dir.path(),
        &["--also-listen", "shm://auto"],
        &[("STROM_LOG", "strom_net=debug,info")],
    );
    let addrs = addrs_in_group_file(&server.group_file);
    assert_eq!(
        addrs.len(),
        2,
        "the group file lists both addresses: {addrs:?}"
    );
    assert_eq!(addrs[0], server.addr, "the TCP address comes first");
    assert!(addrs[1].starts_with("shm://"), "{addrs:?}");

    let d = Driver::connect(&server.group_file).unwrap();
    let via = d.connected_via(&server.addr).unwrap();
    assert_eq!(via, addrs[1], "a same-node client picks shm");
    round_trip(&d, "big", 12, 300_000);
    assert!(
        server.stderr().contains("we_pull=true peer_pulls=true"),
        "both directions pull across processes:\n{}",
        server.stderr()
    );

    // Told only TCP, the same group file gives a TCP connection.
    let tcp = Driver::connect_with(&server.group_file, Transports::tcp(64 << 20)).unwrap();
    assert_eq!(
        tcp.connected_via(&server.addr).as_deref(),
        Some(server.addr.as_str())
    );
    // Given the TCP address only, the client learns the shm address from
    // the server's greeting and moves over to it.
    let upgraded = Driver::connect_addr(&server.addr).unwrap();
    assert_eq!(upgraded.connected_via(&server.addr), Some(addrs[1].clone()));
    round_trip(&upgraded, "small", 50, 2000);
}

/// Without being told, a server also serves its node over shared memory,
/// and a client given its group file takes it; `--no-shm` turns it off.
#[test]
fn a_server_serves_its_node_over_shm_by_default_and_not_with_no_shm() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let addrs = addrs_in_group_file(&server.group_file);
    assert_eq!(addrs.len(), 2, "TCP and shm: {addrs:?}");
    assert!(addrs[1].starts_with("shm://"), "{addrs:?}");
    let d = Driver::connect(&server.group_file).unwrap();
    assert_eq!(d.connected_via(&server.addr), Some(addrs[1].clone()));
    round_trip(&d, "default", 20, 100_000);

    let plain_dir = tempfile::tempdir().unwrap();
    let plain = ServerProcess::start_with_env(plain_dir.path(), &["--no-shm"], &[]);
    let addrs = addrs_in_group_file(&plain.group_file);
    assert!(!addrs.iter().any(|a| a.starts_with("shm://")), "{addrs:?}");
    let d = Driver::connect(&plain.group_file).unwrap();
    assert_eq!(
        d.connected_via(&plain.addr).as_deref(),
        Some(plain.addr.as_str())
    );
    round_trip(&d, "tcp", 20, 1000);
}

#[test]
fn a_client_of_another_user_uses_shm_with_data_through_the_socket_and_says_why() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test runs a client as user nobody, so it needs root (as `make test` is run)"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("shm.sock");
    let listen = format!("shm://{}", sock.display());
    let server = ServerProcess::start_with_env(
        dir.path(),
        &["--also-listen", &listen],
        &[("STROM_LOG", "strom_net=debug,info")],
    );
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&server.group_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    // nobody runs its own copy of the binary (the build tree may be private).
    let bin = dir.path().join("strom");
    std::fs::copy(common::strom_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let payload = data(7, 100_000);
    let data_file = dir.path().join("payload.bin");
    std::fs::write(&data_file, &payload).unwrap();
    std::fs::set_permissions(&data_file, std::fs::Permissions::from_mode(0o644)).unwrap();

    let d = Driver::connect(&server.group_file).unwrap();
    d.create_topic(TopicSpec::new("t", 1)).unwrap();
    let as_nobody = |args: &[&str], stdin: &str| {
        let mut child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .arg("--group-file")
            .arg(&server.group_file)
            .env("STROM_LOG", "strom_net=info")
            .env_remove("STROM_ADDRESS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running setpriv (util-linux)");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "strom {args:?} as nobody failed:\n{err}"
        );
        (String::from_utf8_lossy(&out.stdout).to_string(), err)
    };
    let lines: String = (0..5).map(|i| format!("{{\"i\": {i}}}\n")).collect();
    let (_, err) = as_nobody(
        &["produce", "t", "--data-file", data_file.to_str().unwrap()],
        &lines,
    );
    assert!(
        err.contains("data parts from this peer come through the socket")
            && err.contains("not permitted"),
        "the client says why it cannot pull:\n{err}"
    );
    let (out, _) = as_nobody(
        &[
            "consume",
            "t",
            "--name",
            "n",
            "--from",
            "beginning",
            "--max",
            "5",
            "--data",
        ],
        "",
    );
    assert_eq!(out.lines().filter(|l| !l.is_empty()).count(), 5, "{out}");
    // The server (root) could pull the producer's pages; nobody could not
    // pull the server's: one line per direction in the server's log.
    assert!(
        server.stderr().contains("we_pull=true peer_pulls=false"),
        "{}",
        server.stderr()
    );
    // Every byte is stored as sent.
    let t = d.open_topic("t").unwrap();
    let c = t
        .consumer_with(
            "check",
            ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    for _ in 0..5 {
        match c.pull_timeout(Duration::from_secs(20)).unwrap() {
            Next::Event(e) => assert!(e.data_vec() == payload),
            Next::EndOfStream => panic!("too few events"),
        }
    }
}
