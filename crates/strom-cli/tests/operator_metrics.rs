//! What an operator sees in `/metrics` after real traffic and failures
//! (docs/observability.md, "Operating a group"): on a `strom cluster up`
//! group of three, a replicated partition's in-sync replicas, the metadata
//! quorum and the data dir's space, and a follower killed with SIGKILL
//! showing up as under-replicated on its leader and on the registry
//! master; on one server, shared groups' pending, redelivered and
//! dead-lettered events, producer leases, a transform's lag and the Kafka
//! front end's requests, errors and groups. Every scrape passes `promtool
//! check metrics`.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{cluster_up_with, Cluster};
use common::http::{http_addr_in, metrics, promtool_check, sample_sum, samples};
use common::procs::CLI_TIMEOUT;
use common::{ok, run_cli};

/// Polls (up to 30 s) until `ok` holds of a fresh scrape of `http`;
/// returns that scrape, or panics with the last one.
fn scrape_until(http: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics(http);
        if ok(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last scrape of {http}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each rank's HTTP address, from its log.
fn http_addrs(c: &Cluster, n: usize) -> Vec<String> {
    (0..n)
        .map(|rank| {
            let path = c.dir.join(format!("server-{rank}.log"));
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                if let Some(a) = http_addr_in(&log) {
                    return a;
                }
                assert!(Instant::now() < deadline, "no HTTP address in {path:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .collect()
}

fn cli(gf: &str, args: &[&str], input: &str) -> String {
    let mut all = vec!["--group-file", gf];
    all.extend_from_slice(args);
    ok(run_cli(&all, input, &[], CLI_TIMEOUT), args[0]).stdout
}

#[test]
fn a_killed_follower_shows_as_under_replicated_beside_the_quorum_and_disk() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up_with(base.path(), 3, &["--", "--http-listen", "127.0.0.1:0"]);
    let gf = c.group_file.clone();
    let http = http_addrs(&c, 3);
    cli(
        &gf,
        &[
            "topic",
            "create",
            "r",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
        ],
        "",
    );
    let input: String = (0..100).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    cli(&gf, &["produce", "r", "--keep-open"], &input);

    // The partition's leader, once its followers are in sync.
    let in_sync = |t: &str| sample_sum(t, "strom_partition_isr_size", "topic=\"r\"") == 3.0;
    let leader = (0..3)
        .find(|r| sample_sum(&metrics(&http[*r]), "strom_replica_role", "role=\"leader\"") == 1.0)
        .expect("a leader of r/0 among the ranks");
    let text = scrape_until(&http[leader], "3 in-sync replicas", in_sync);
    assert_eq!(
        sample_sum(&text, "strom_partition_replicas", "topic=\"r\""),
        3.0
    );
    assert_eq!(
        sample_sum(&text, "strom_partition_under_replicated", "topic=\"r\""),
        0.0
    );
    assert_eq!(
        sample_sum(&text, "strom_partition_high_watermark", "topic=\"r\""),
        100.0
    );
    assert_eq!(
        sample_sum(&text, "strom_replica_follower_in_sync", "topic=\"r\""),
        2.0
    );

    // The quorum: three voters, one leader, every member knows it.
    let mut raft_leaders = 0.0;
    let mut master = None;
    for (rank, h) in http.iter().enumerate() {
        let t = metrics(h);
        promtool_check(&t);
        assert_eq!(
            sample_sum(&t, "strom_meta_quorum_enabled", ""),
            1.0,
            "rank {rank}"
        );
        assert_eq!(sample_sum(&t, "strom_meta_voters", ""), 3.0, "rank {rank}");
        assert_eq!(
            sample_sum(&t, "strom_meta_has_leader", ""),
            1.0,
            "rank {rank}"
        );
        assert!(
            sample_sum(&t, "strom_meta_applied_index", "") > 0.0,
            "rank {rank}"
        );
        raft_leaders += sample_sum(&t, "strom_meta_state", "state=\"leader\"");
        let free = samples(&t, "strom_data_dir_free_bytes", "path=");
        assert!(free.len() == 1 && free[0] > 0.0, "rank {rank}: {free:?}");
        assert!(sample_sum(&t, "strom_data_dir_free_inodes", "") > 0.0);
        if sample_sum(&t, "strom_server_info", "master=\"true\"") == 1.0 {
            master = Some(rank);
        }
    }
    assert_eq!(raft_leaders, 1.0, "one Raft leader");
    let master = master.expect("a registry master");
    let t = metrics(&http[master]);
    assert_eq!(
        sample_sum(&t, "strom_group_under_replicated_partitions", ""),
        0.0
    );
    assert_eq!(sample_sum(&t, "strom_group_offline_partitions", ""), 0.0);

    // Kill the follower that is not the master (of three ranks, one is
    // neither leader nor master); the leader shrinks its ISR and the
    // master records it.
    let victim = (0..3)
        .find(|r| *r != leader && *r != master)
        .expect("a follower that is not the master");
    c.kill(c.pids[victim]);
    let t = scrape_until(
        &http[leader],
        "an under-replicated r/0 on its leader",
        |t| sample_sum(t, "strom_partition_under_replicated", "topic=\"r\"") == 1.0,
    );
    assert_eq!(
        sample_sum(&t, "strom_partition_isr_size", "topic=\"r\""),
        2.0
    );
    assert_eq!(
        sample_sum(&t, "strom_replica_follower_in_sync", "topic=\"r\""),
        1.0
    );
    promtool_check(&t);
    let t = scrape_until(&http[master], "the master counting it", |t| {
        sample_sum(t, "strom_group_under_replicated_partitions", "") == 1.0
    });
    assert_eq!(
        sample_sum(&t, "strom_group_partition_isr_size", "topic=\"r\""),
        2.0
    );
    scrape_until(&http[master], "the master seeing a member down", |t| {
        sample_sum(t, "strom_members", "alive=\"false\"") == 1.0
    });
}
