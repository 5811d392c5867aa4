//! What an operator sees in `/metrics` after real traffic and failures
//! (docs/observability.md, "Operating a group"): on a `strom cluster up`
//! group of three, a replicated partition's in-sync replicas, the metadata
//! quorum and the data dir's space, and a follower killed with SIGKILL
//! showing up as under-replicated on its leader and on the registry
//! master; on one server, shared groups' pending, redelivered and
//! dead-lettered events, producer leases, a transform's lag, the Kafka
//! front end's requests, errors and groups, and a tiered partition's
//! uploads and tier reads. Every scrape passes `promtool
//! check metrics`.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{cluster_up_with, Cluster};
use common::http::{chromium, http_addr_in, metrics, promtool_check, sample_sum, samples};
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

/// The repository's root (for docs and examples).
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every metric family in `text` is in docs/observability.md's tables.
fn all_documented(text: &str) {
    let doc = std::fs::read_to_string(repo().join("docs/observability.md")).unwrap();
    for name in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = name.split(' ').next().unwrap();
        assert!(
            doc.contains(&format!("`{name}`")),
            "{name} is not in docs/observability.md"
        );
    }
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
        all_documented(&t);
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

    // The master's dashboard shows the partition under-replicated and the
    // quorum members it reached, one of them its leader.
    let url = format!("http://{}/", http[master]);
    let dom = chromium(&["--dump-dom", &url], &base.path().join("profile"));
    let page = String::from_utf8_lossy(&dom.stdout);
    assert!(
        page.contains("data-replication=\"r/0\" data-state=\"under-replicated\""),
        "no under-replicated r/0 row:\n{page}"
    );
    assert_eq!(page.matches("<tr data-quorum-member=").count(), 2, "{page}");
    assert_eq!(
        page.matches("\" data-state=\"leader\"").count(),
        1,
        "{page}"
    );
    assert!(
        page.contains("id=\"under-replicated\" data-value=\"1\""),
        "{page}"
    );
}

#[test]
fn shared_groups_leases_transforms_and_kafka_show_in_metrics() {
    use strom_client::{GroupOptions, Next, ProducerOptions, TopicSpec};
    let base = tempfile::tempdir().expect("tempdir");
    let (server, broker) =
        common::kafka::start_with_args(base.path(), &["--http-listen", "127.0.0.1:0"]);
    let http = common::http::http_addr(&server);
    let d = server.connect();

    // A shared group: one event nacked to the dead-letter topic, one held.
    let work = d.create_topic(TopicSpec::new("work", 1)).unwrap();
    let p = work
        .producer_with(ProducerOptions {
            lease: None,
            ..Default::default()
        })
        .unwrap();
    for i in 0..5u32 {
        p.push(format!("{{\"i\":{i}}}"), ())
            .unwrap()
            .wait()
            .unwrap();
    }
    let mut o = GroupOptions::shared();
    o.max_deliveries = Some(2);
    o.consumer.prefetch = 1;
    let g = work.consumer_group("g", o).unwrap();
    let first = |e: &strom_client::Event| e.meta().offset == 0;
    let mut nacks = 0;
    let held = loop {
        let Next::Event(e) = g.pull_timeout(Duration::from_secs(20)).unwrap() else {
            panic!("the group ran dry");
        };
        if first(&e) {
            e.nack().wait().unwrap();
            nacks += 1;
        } else if nacks == 2 {
            break e;
        } else {
            e.nack().wait().unwrap();
        }
    };
    let t = scrape_until(&http, "a dead letter and a held event", |t| {
        sample_sum(
            t,
            "strom_shared_group_dead_lettered_events_total",
            "group=\"g\"",
        ) == 1.0
            && sample_sum(t, "strom_shared_group_pending_events", "group=\"g\"") >= 1.0
    });
    assert!(
        sample_sum(
            &t,
            "strom_shared_group_redelivered_events_total",
            "group=\"g\""
        ) >= 1.0
    );
    assert!(
        sample_sum(
            &t,
            "strom_shared_group_consumer_pending_events",
            "group=\"g\""
        ) >= 1.0
    );
    assert_eq!(
        sample_sum(&t, "strom_shared_group_lag_events", "group=\"g\""),
        4.0
    );
    held.ack().wait().unwrap();

    // A transform's lag, once it has caught up.
    ok(
        server.cli(
            &[
                "transform",
                "create",
                "t1",
                "--from",
                "work",
                "--to",
                "copy",
            ],
            "",
            CLI_TIMEOUT,
        ),
        "transform create",
    );
    scrape_until(&http, "the transform's lag", |t| {
        samples(t, "strom_transform_lag_events", "transform=\"t1\"") == vec![0.0]
    });

    // A producer with a 1 s lease whose process is killed: open, then expired.
    let mut child = std::process::Command::new(common::strom_bin())
        .args([
            "--address",
            &server.addr,
            "produce",
            "leased",
            "--lease",
            "1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    d.create_topic(TopicSpec::new("leased", 1)).unwrap();
    scrape_until(&http, "an open lease", |t| {
        sample_sum(t, "strom_producer_leases", "") == 1.0
    });
    child.kill().unwrap();
    child.wait().unwrap();
    scrape_until(&http, "the lease expiring", |t| {
        sample_sum(t, "strom_producer_leases_expired_total", "") == 1.0
            && sample_sum(t, "strom_producer_leases", "") == 0.0
    });

    // Kafka: a produce, a refused metadata request, a group.
    common::kafka::kcat(&["-b", &broker, "-P", "-t", "work"], b"from-kafka\n");
    common::kafka::kcat(
        &["-b", &broker, "-G", "kg", "-e", "-q", "-f", "%s\n", "work"],
        b"",
    );
    // Metadata v4 for a missing topic, without auto-creation.
    let mut body = 1i32.to_be_bytes().to_vec();
    common::kafka_raw::string(&mut body, "missing");
    body.push(0);
    let mut s = common::kafka_raw::connect(&broker);
    std::io::Write::write_all(&mut s, &common::kafka_raw::request(3, 4, 1, &body)).unwrap();
    common::kafka_raw::response(&mut s).expect("a metadata answer");
    let t = scrape_until(&http, "Kafka requests and a group", |t| {
        sample_sum(t, "strom_kafka_requests_total", "api=\"Produce\"") >= 1.0
            && sample_sum(t, "strom_kafka_groups", "") == 1.0
    });
    assert!(sample_sum(&t, "strom_kafka_requests_total", "api=\"Metadata\"") >= 1.0);
    assert!(sample_sum(&t, "strom_kafka_requests_total", "api=\"JoinGroup\"") >= 1.0);
    let unknown = "api=\"Metadata\",error=\"UNKNOWN_TOPIC_OR_PARTITION\"";
    assert_eq!(sample_sum(&t, "strom_kafka_errors_total", unknown), 1.0);
    promtool_check(&t);
    all_documented(&t);
}

fn promtool(args: &[&str]) {
    let out = std::process::Command::new("promtool")
        .args(args)
        .current_dir(repo().join("examples/prometheus"))
        .output()
        .expect("promtool (Debian package prometheus; `make test` installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_watch_documented_metrics() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["test", "rules", "alerts_test.yml"]);
    promtool(&["check", "config", "prometheus.yml"]);
    let rules = std::fs::read_to_string(repo().join("examples/prometheus/alerts.yml")).unwrap();
    let doc = std::fs::read_to_string(repo().join("docs/observability.md")).unwrap();
    let mut watched = 0;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("strom_") && word.len() > "strom_".len() {
            watched += 1;
            assert!(
                doc.contains(&format!("`{word}`")),
                "{word} is not in docs/observability.md"
            );
        }
    }
    assert!(watched >= 10, "the rules watch Strom's metrics");
}

#[test]
fn a_tiered_partition_counts_its_uploads_and_tier_reads() {
    let base = tempfile::tempdir().expect("tempdir");
    let tier = base.path().join("tier");
    let server = common::ServerProcess::start_with_config(
        base.path(),
        &format!(
            "segment_bytes = 8192\ntier_dir = \"{}\"\ntier_local_retention_bytes = 0\n\
             tier_check_ms = 50\nhttp_listen = \"127.0.0.1:0\"\n",
            tier.display()
        ),
    );
    let http = common::http::http_addr(&server);
    ok(
        server.cli(
            &["topic", "create", "cold", "--partitions", "1"],
            "",
            CLI_TIMEOUT,
        ),
        "topic create",
    );
    // Batches of 8 KiB of data: each closes a segment.
    let d = server.connect();
    let p = d.open_topic("cold").unwrap().producer().unwrap();
    for i in 0..64u32 {
        p.push(format!("{{\"i\":{i}}}"), vec![7u8; 1024]).unwrap();
        if i % 8 == 7 {
            p.flush().unwrap();
        }
    }
    p.close().unwrap();
    // With no local retention, each pass drops what it copied: once two
    // segments are in the tier, the first is there alone.
    // A sole copy uploads everything the tier holds (the count follows
    // the manifest, so both are read at a pass's end).
    let t = scrape_until(&http, "segments uploaded to the tier", |t| {
        let tiered = sample_sum(t, "strom_tier_bytes", "topic=\"cold\"");
        sample_sum(t, "strom_tier_segments", "topic=\"cold\"") >= 2.0
            && sample_sum(t, "strom_tier_uploaded_bytes_total", "topic=\"cold\"") == tiered
    });
    assert!(
        sample_sum(&t, "strom_tier_bytes", "topic=\"cold\"") > 0.0,
        "{t}"
    );
    assert_eq!(
        sample_sum(&t, "strom_tier_reads_total", "topic=\"cold\""),
        0.0
    );
    // Reading from the start goes to the tier for the segments dropped here.
    let out = ok(
        server.cli(
            &[
                "consume",
                "cold",
                "--name",
                "r",
                "--from",
                "beginning",
                "--max",
                "400",
            ],
            "",
            CLI_TIMEOUT,
        ),
        "consume",
    );
    assert_eq!(out.lines().len(), 64);
    let t = metrics(&http);
    assert!(
        sample_sum(&t, "strom_tier_reads_total", "topic=\"cold\"") > 0.0,
        "{t}"
    );
    assert_eq!(
        sample_sum(&t, "strom_tier_errors_total", "topic=\"cold\""),
        0.0
    );
    promtool_check(&t);
    all_documented(&t);
}
