//! One owner per data directory and per group file: a second server on a
//! running server's data directory fails at once naming the holder, a lock
//! left by `kill -9` does not block a restart, and a live group's file is
//! never overwritten by a server of another group.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{run_cli, ServerProcess};

const CLI_TIMEOUT: Duration = Duration::from_secs(30);

fn produce_one(group_file: &Path, topic: &str) {
    let g = group_file.to_str().unwrap();
    let out = run_cli(
        &[
            "--group-file",
            g,
            "topic",
            "create",
            topic,
            "--partitions",
            "1",
        ],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(out.status.success(), "topic create: {}", out.stderr);
    let out = run_cli(
        &["--group-file", g, "produce", topic],
        "{\"n\":1}\n",
        &[],
        CLI_TIMEOUT,
    );
    assert!(out.status.success(), "produce: {}", out.stderr);
}

fn group_addr(group_file: &Path) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(group_file).expect("group file")).unwrap();
    v["members"][0]["addr"].as_str().unwrap().to_string()
}

#[test]
fn second_server_on_a_live_data_dir_fails_naming_the_dir_and_pid() {
    let base = tempfile::tempdir().unwrap();
    let first = ServerProcess::start(base.path());
    produce_one(&first.group_file, "t");
    let data = first.data_dir.to_str().unwrap();
    let out = run_cli(
        &["server", "--data-dir", data, "--listen", "127.0.0.1:0"],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(!out.status.success(), "a second server started on {data}");
    assert!(out.stderr.contains(data), "names the dir: {}", out.stderr);
    assert!(
        out.stderr.contains(&format!("pid {}", first.pid())),
        "names the holder's pid {}: {}",
        first.pid(),
        out.stderr
    );
    assert!(out.stderr.contains("DATA_DIR_LOCKED") || out.stderr.contains("in use"));
    // The first server is untouched and still serves its event.
    let d = first.connect();
    let got = common::read_all(&d, "t", "reader", Duration::from_secs(10));
    assert_eq!(got.len(), 1);
}

#[test]
fn kill_9_of_the_lock_holder_then_an_immediate_restart_succeeds() {
    let base = tempfile::tempdir().unwrap();
    let first = ServerProcess::start(base.path());
    produce_one(&first.group_file, "t");
    first.kill9();
    // The kernel released the lock with the process: no stale lock.
    let second = ServerProcess::start(base.path());
    let d = second.connect();
    let got = common::read_all(&d, "t", "reader", Duration::from_secs(10));
    assert_eq!(got.len(), 1, "the acked event survived the restart");
}

#[test]
fn a_live_groups_file_is_never_overwritten_by_another_server() {
    let base = tempfile::tempdir().unwrap();
    let first = ServerProcess::start(base.path());
    let before = std::fs::read(&first.group_file).unwrap();
    let other = base.path().join("other-data");
    let g = first.group_file.to_str().unwrap();
    // As the README suggests: STROM_GROUP_FILE exported, another data dir.
    let out = run_cli(
        &[
            "server",
            "--data-dir",
            other.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        "",
        &[("STROM_GROUP_FILE", g)],
        CLI_TIMEOUT,
    );
    assert!(!out.status.success(), "the second server must refuse");
    assert!(
        out.stderr.contains("--join") && out.stderr.contains(g),
        "says how to join and names the file: {}",
        out.stderr
    );
    assert_eq!(
        std::fs::read(&first.group_file).unwrap(),
        before,
        "the group file is unchanged"
    );
    assert_eq!(group_addr(&first.group_file), first.addr);
}

#[test]
fn a_dead_groups_file_is_replaced_and_the_replacement_is_logged() {
    let base = tempfile::tempdir().unwrap();
    let first = ServerProcess::start(base.path());
    let group_file = first.group_file.clone();
    let old_addr = first.addr.clone();
    first.kill9();
    let other = base.path().join("other-data");
    let mut child = std::process::Command::new(common::strom_bin())
        .args(["server", "--data-dir", other.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--group-file"])
        .arg(&group_file)
        .env("STROM_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + common::START_TIMEOUT;
    while group_addr(&group_file) == old_addr {
        assert!(std::time::Instant::now() < deadline, "file not replaced");
        assert!(child.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("replacing a group file whose members are all gone"),
        "logs the replacement: {stderr}"
    );
}
