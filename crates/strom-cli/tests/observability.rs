//! The HTTP endpoint of a real `strom server --http-listen`: `/metrics`
//! counts what was produced, consumed and refused and passes `promtool
//! check metrics`; the dashboard shows a live producer's rate and topic in
//! headless Chromium (a screenshot is kept as a test artifact); `strom top`
//! shows the same in the terminal; the master's endpoint shows every
//! member's partitions.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::{chromium, get, http_addr_in, promtool_check, sample_sum};
use common::{ok, run_cli, ServerProcess};

const T: Duration = Duration::from_secs(60);

/// Starts a server with an HTTP endpoint; returns it and `host:port`.
fn server_with_http(base: &std::path::Path) -> (ServerProcess, String) {
    let server = ServerProcess::start_with(base, &["--http-listen", "127.0.0.1:0"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let err = server.stderr();
        if let Some(addr) = http_addr_in(&err) {
            return (server, addr);
        }
        assert!(
            Instant::now() < deadline,
            "no HTTP address in stderr:\n{err}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn json(http: &str, path: &str) -> serde_json::Value {
    let (status, _, body) = get(http, path, "application/json");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

#[test]
fn metrics_count_produced_consumed_and_refused_and_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let (server, http) = server_with_http(dir.path());
    ok(
        server.cli(&["topic", "create", "obs", "--partitions", "2"], "", T),
        "create",
    );
    let driver = server.connect();
    let topic = driver.open_topic("obs").unwrap();
    let p = topic.producer().unwrap();
    for i in 0..200u32 {
        p.push(format!("{{\"i\":{i}}}"), vec![7u8; 100]).unwrap();
    }
    p.flush().unwrap();
    // A consumer name reads and acks 50 events; the lag is the rest.
    let out = ok(
        server.cli(
            &["consume", "obs", "--name", "reader", "--max", "50"],
            "",
            T,
        ),
        "consume",
    );
    assert_eq!(out.lines().len(), 50);
    // A refused request is counted by its code.
    let bad = server.cli(&["topic", "describe", "no-such-topic"], "", T);
    assert!(!bad.status.success());

    let (status, ctype, text) = get(&http, "/metrics", "*/*");
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    promtool_check(&text);
    assert_eq!(
        sample_sum(&text, "strom_partition_in_events_total", "topic=\"obs\""),
        200.0,
        "{text}"
    );
    assert!(sample_sum(&text, "strom_partition_in_bytes_total", "topic=\"obs\"") >= 200.0 * 100.0);
    assert!(sample_sum(&text, "strom_partition_out_events_total", "topic=\"obs\"") >= 50.0);
    assert!(sample_sum(&text, "strom_partition_in_batches_total", "topic=\"obs\"") >= 1.0);
    // `always` durability (the default): every append was synced.
    assert!(
        sample_sum(
            &text,
            "strom_partition_fsync_latency_seconds_count",
            "topic=\"obs\""
        ) >= 1.0
    );
    assert!(
        sample_sum(
            &text,
            "strom_partition_append_latency_seconds_count",
            "topic=\"obs\""
        ) >= 1.0
    );
    assert_eq!(
        sample_sum(&text, "strom_partition_next_offset", "topic=\"obs\""),
        200.0
    );
    assert!(sample_sum(&text, "strom_partition_storage_bytes", "topic=\"obs\"") >= 20_000.0);
    assert_eq!(
        sample_sum(
            &text,
            "strom_consumer_committed_offset",
            "consumer=\"reader\""
        ),
        50.0,
        "{text}"
    );
    // Lag is per partition the name committed on: next offset - committed.
    let mut lag = 0.0;
    for part in ["partition=\"0\"", "partition=\"1\""] {
        let on = |m: &str| format!("{part},type=\"file\"{m}");
        let committed = on(",consumer=\"reader\"");
        if !text.contains(&format!(
            "strom_consumer_committed_offset{{topic=\"obs\",{committed}}}"
        )) {
            continue;
        }
        let next = sample_sum(&text, "strom_partition_next_offset", &on("}"));
        let c = sample_sum(&text, "strom_consumer_committed_offset", &committed);
        let l = sample_sum(&text, "strom_consumer_lag_events", &committed);
        assert_eq!(l, next - c, "{part}: {text}");
        lag += l;
    }
    assert!(
        lag >= 50.0,
        "at least the rest of the partitions read: {text}"
    );
    assert!(
        sample_sum(&text, "strom_errors_total", "name=\"TOPIC_NOT_FOUND\"") >= 1.0,
        "{text}"
    );
    assert!(
        sample_sum(&text, "strom_connections", "") >= 1.0,
        "the driver is connected"
    );
    assert!(sample_sum(&text, "process_resident_memory_bytes", "") > 1e6);

    // Prometheus asks for OpenMetrics, and gets it.
    let (status, ctype, om) = get(
        &http,
        "/metrics",
        "application/openmetrics-text; version=1.0.0",
    );
    assert_eq!(status, 200);
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(om.ends_with("# EOF\n"), "{om}");

    // The JSON snapshot says the same.
    let snap = json(&http, "/api/snapshot");
    let parts = snap["partitions"].as_array().unwrap();
    let events: u64 = parts.iter().map(|p| p["events_in"].as_u64().unwrap()).sum();
    assert_eq!(events, 200, "{snap}");
    let (status, _, _) = get(&http, "/no-such-page", "*/*");
    assert_eq!(status, 404);
}

/// Produces small batches on `topic` until `stop`.
fn keep_producing(
    topic: strom_client::Topic,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let p = topic.producer().unwrap();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..50 {
                p.push(format!("{{\"n\":{n}}}"), Vec::<u8>::new()).unwrap();
                n += 1;
            }
            p.flush().unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        n
    })
}

/// Waits until the history shows `topic` being produced to.
fn wait_for_rate(http: &str, topic: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = json(http, "/api/history");
        let rate = h["points"]
            .as_array()
            .and_then(|p| p.last())
            .and_then(|p| p["topics"][topic]["in_events"].as_f64())
            .unwrap_or(0.0);
        if rate > 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no produce rate for {topic}: {h}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_dashboard_shows_a_live_producers_rate_and_topic_in_headless_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let (server, http) = server_with_http(dir.path());
    ok(
        server.cli(
            &["topic", "create", "live-topic", "--type", "memory"],
            "",
            T,
        ),
        "create",
    );
    let driver = server.connect();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = keep_producing(driver.open_topic("live-topic").unwrap(), stop.clone());
    wait_for_rate(&http, "live-topic");

    let url = format!("http://{http}/");
    let dom = chromium(&["--dump-dom", &url], &dir.path().join("profile-1"));
    let page = String::from_utf8_lossy(&dom.stdout).to_string();
    let artifacts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let screenshot = chromium(
        &[
            "--window-size=1280,1400",
            &format!("--screenshot={}", shot.display()),
            &url,
        ],
        &dir.path().join("profile-2"),
    );
    stop.store(true, Ordering::Relaxed);
    let produced = producer.join().unwrap();
    assert!(produced > 0);

    let rate: f64 = page
        .split("id=\"produce-rate\" data-value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no produce rate in the page:\n{page}\n{}",
                String::from_utf8_lossy(&dom.stderr)
            )
        });
    assert!(rate > 0.0, "the dashboard shows a produce rate of {rate}");
    assert!(
        page.contains("<tr data-topic=\"live-topic\">"),
        "the topic row is missing:\n{page}"
    );
    assert!(page.contains("127.0.0.1:"), "the member list is missing");
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {}: {e}\n{}",
            shot.display(),
            String::from_utf8_lossy(&screenshot.stderr)
        )
    });
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}

#[test]
fn strom_top_shows_topics_rates_and_lag() {
    let dir = tempfile::tempdir().unwrap();
    let (server, http) = server_with_http(dir.path());
    ok(
        server.cli(&["topic", "create", "top-topic", "--type", "memory"], "", T),
        "create",
    );
    let driver = server.connect();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = keep_producing(driver.open_topic("top-topic").unwrap(), stop.clone());
    wait_for_rate(&http, "top-topic");
    ok(
        server.cli(
            &["consume", "top-topic", "--name", "slow", "--max", "10"],
            "",
            T,
        ),
        "consume",
    );

    let out = ok(
        run_cli(&["top", "--http", &http, "--once"], "", &[], T),
        "top",
    );
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("top-topic ") && l.split_whitespace().count() == 9)
        .unwrap_or_else(|| panic!("no topic row:\n{}", out.stdout));
    let in_rate = row.split_whitespace().nth(2).unwrap();
    assert_ne!(in_rate, "0", "a live producer has a rate: {row}");
    assert!(
        out.stdout.contains("slow"),
        "the consumer's lag row:\n{}",
        out.stdout
    );

    let out = ok(
        run_cli(&["top", "--http", &http, "--once", "--json"], "", &[], T),
        "top --json",
    );
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let lag: u64 = v["endpoints"][0]["group"]["servers"][0]["partitions"][0]["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "slow")
        .map(|c| c["lag"].as_u64().unwrap())
        .sum();
    assert!(lag > 0, "the producer runs on past the slow consumer: {v}");
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();

    // Nothing listening: a clear error, not a panic.
    let out = run_cli(&["top", "--http", "127.0.0.1:1", "--once"], "", &[], T);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--http-listen"), "{}", out.stderr);
}

#[test]
fn a_bad_http_address_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cli(
        &[
            "server",
            "--data-dir",
            dir.path().join("d").to_str().unwrap(),
            "--http-listen",
            "nonsense",
        ],
        "",
        &[],
        T,
    );
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("http_listen = 'nonsense' is not HOST:PORT"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_masters_endpoint_shows_every_members_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (server, http) = server_with_http(dir.path());
    let _member = server.join_member(&dir.path().join("member-1"), &[], Stdio::null());
    let driver = server.connect();
    let deadline = Instant::now() + T;
    while driver
        .members()
        .map_or(0, |m| m.iter().filter(|m| m.alive).count())
        < 2
    {
        assert!(Instant::now() < deadline, "the member never joined");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two partitions, placed round-robin: one on each member.
    ok(
        server.cli(&["topic", "create", "grp", "--partitions", "2"], "", T),
        "create",
    );
    let p = driver.open_topic("grp").unwrap().producer().unwrap();
    for i in 0..100u32 {
        p.push(format!("{{\"i\":{i}}}"), Vec::<u8>::new()).unwrap();
    }
    p.flush().unwrap();

    let g = json(&http, "/api/group");
    assert_eq!(g["unreachable"].as_array().unwrap().len(), 0, "{g}");
    let servers = g["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 2, "{g}");
    let mut placed: Vec<(u64, u64, u64)> = servers
        .iter()
        .flat_map(|s| {
            let member = s["member"].as_u64().unwrap();
            s["partitions"].as_array().unwrap().iter().map(move |p| {
                (
                    member,
                    p["partition"].as_u64().unwrap(),
                    p["events_in"].as_u64().unwrap(),
                )
            })
        })
        .collect();
    placed.sort();
    assert_eq!(placed.len(), 2, "{g}");
    assert_ne!(
        placed[0].0, placed[1].0,
        "one partition per member: {placed:?}"
    );
    assert_eq!(placed.iter().map(|p| p.2).sum::<u64>(), 100, "{placed:?}");

    // The dashboard and strom top on the master list both partitions.
    let url = format!("http://{http}/");
    let dom = chromium(&["--dump-dom", &url], &dir.path().join("profile"));
    let page = String::from_utf8_lossy(&dom.stdout);
    for part in ["grp/0", "grp/1"] {
        assert!(
            page.contains(&format!("data-partition=\"{part}\"")),
            "no {part} row:\n{page}"
        );
    }
    assert!(
        page.contains("data-member=\"1\""),
        "no member 1 row:\n{page}"
    );
    let out = ok(
        run_cli(&["top", "--http", &http, "--once"], "", &[], T),
        "top",
    );
    let rows = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("grp ") && l.split_whitespace().count() == 10);
    assert_eq!(rows.count(), 2, "both partitions:\n{}", out.stdout);
}
