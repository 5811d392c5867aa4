//! `strom cluster up` with its defaults starts what survives any one
//! member: a 3-server group keeps its registry on a quorum of three voters,
//! so after `kill -9` of member 0 (the registry's first leader and a
//! partition leader) new CLI producers and consumers work and every
//! acknowledged event reads back; `strom status` says how many failures
//! the group survives before and after. Real `strom` processes, temp dirs,
//! port 0.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::cluster::{cluster_up, cluster_up_with, running};
use common::procs::{positions, CLI_TIMEOUT};
use common::{ok, run_cli};
use serde_json::Value;

/// `strom status --json` of the group.
fn status(group_file: &str) -> Value {
    let out = ok(
        run_cli(
            &["--group-file", group_file, "status", "--json"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "status",
    );
    serde_json::from_str(&out.stdout).expect("status --json is JSON")
}

/// Produces `n` events numbered from `from` with the CLI, its producer left
/// open (the stream goes on for the next one); every one must
/// be acknowledged. Returns their positions.
fn produce(group_file: &str, from: u32, n: u32) -> Vec<(u32, u64)> {
    let input: String = (from..from + n)
        .map(|i| format!("{{\"i\":{i}}}\n"))
        .collect();
    let out = ok(
        run_cli(
            &["--group-file", group_file, "produce", "r", "--keep-open"],
            &input,
            &[],
            CLI_TIMEOUT,
        ),
        "produce",
    );
    let got = positions(&out);
    assert_eq!(
        got.len(),
        n as usize,
        "one position per event:\n{}",
        out.stdout
    );
    got
}

#[test]
fn a_default_cluster_up_of_three_survives_the_death_of_member_0() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up(base.path(), 3);
    let gf = c.group_file.clone();
    let s = status(&gf);
    assert_eq!(s["survives"]["registry"]["survives"], 1, "{s:#}");
    let roles: BTreeSet<String> = s["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        roles.contains("leader") && roles.contains("voter"),
        "{roles:?}"
    );

    ok(
        run_cli(
            &[
                "--group-file",
                &gf,
                "topic",
                "create",
                "r",
                "--partitions",
                "2",
                "--replication-factor",
                "3",
            ],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "topic create",
    );
    let mut acked: BTreeSet<(u32, u64)> = produce(&gf, 0, 200).into_iter().collect();
    let s = status(&gf);
    assert_eq!(s["survives"]["member_failures"], 1, "{s:#}");
    assert_eq!(s["survives"]["topics"]["r"]["survives"], 2, "{s:#}");

    // Member 0: rank 0, the registry's first leader.
    let pid = c.pids[0];
    // SAFETY: kill(2) on a server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    while running(pid) {
        std::thread::sleep(Duration::from_millis(20));
    }

    acked.extend(produce(&gf, 200, 200));
    let out = ok(
        run_cli(
            &["--group-file", &gf, "consume", "r", "--name", "after"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "consume after member 0 died",
    );
    let read: BTreeSet<(u32, u64)> = positions(&out).into_iter().collect();
    let lost: Vec<_> = acked.difference(&read).collect();
    assert!(
        lost.is_empty(),
        "acknowledged events not read back: {lost:?}"
    );
    assert_eq!(read.len(), 400, "every event once");

    let s = status(&gf);
    assert_eq!(s["survives"]["member_failures"], 0, "{s:#}");
    let why = s["survives"]["registry"]["why"].as_str().unwrap_or("");
    assert!(why.contains("2 of 3 voters alive"), "{why}");
}

#[test]
fn cluster_up_checks_its_voters_and_passes_server_options_through() {
    let base = tempfile::tempdir().expect("tempdir");
    let d = base.path().to_str().expect("utf-8");
    let out = run_cli(
        &[
            "cluster",
            "up",
            "--servers",
            "2",
            "--meta-voters",
            "3",
            "--data-dir",
            d,
        ],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("--meta-voters 3 needs at least 3 servers"),
        "{}",
        out.stderr
    );
    // A server option after `--` reaches every member: here the HTTP
    // listener each member logs.
    let c = cluster_up_with(base.path(), 1, &["--", "--http-listen", "127.0.0.1:0"]);
    let log = std::fs::read_to_string(c.dir.join("server-0.log")).expect("server log");
    assert!(
        log.contains("strom http listening on http://127.0.0.1:"),
        "the member serves HTTP:\n{log}"
    );
    let s = status(&c.group_file);
    assert_eq!(s["survives"]["registry"]["survives"], 0, "{s:#}");
}
