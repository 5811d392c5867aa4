//! `strom bench` as a smoke test, so the benchmark can never silently rot:
//! tiny runs of every mode against an embedded server, checking that the
//! JSON parses and that its counts match what was produced. No timing is
//! ever asserted.

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_strom"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run strom bench");
    assert!(
        out.status.success(),
        "strom bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one JSON object, got: {text}");
    serde_json::from_str(lines[0]).expect("bench output is JSON")
}

fn check_counts(v: &Value, mode: &str, events: u64, event_bytes: u64) {
    assert_eq!(v["mode"], mode);
    assert_eq!(v["target"], "strom://embedded");
    assert_eq!(v["events"].as_u64(), Some(events), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(events * event_bytes), "{v}");
    for key in ["seconds", "events_per_s", "mb_per_s"] {
        assert!(v[key].as_f64().is_some(), "{key} missing in {v}");
    }
}

/// A CPU figure `key` of `v`: present, finite and non-negative (its value
/// is timing, never asserted further).
fn cpu_field(v: &Value, key: &str) -> f64 {
    let x = v[key].as_f64();
    assert!(
        x.is_some_and(|x| x.is_finite() && x >= 0.0),
        "{key} missing or not a finite non-negative number in {v}"
    );
    x.unwrap_or_default()
}

#[test]
fn produce_reports_every_event_and_byte() {
    let v = bench(&[
        "produce",
        "--events",
        "300",
        "--metadata-size",
        "64",
        "--data-size",
        "100",
        "--partitions",
        "2",
        "--producers",
        "2",
    ]);
    check_counts(&v, "produce", 300, 164);
    assert_eq!(v["produced"].as_u64(), Some(300), "{v}");
    assert_eq!(v["stored"].as_u64(), Some(300), "{v}");
}

#[test]
fn produce_reports_cpu_per_gb_with_the_embedded_server_counted_once() {
    let v = bench(&["produce", "--events", "300", "--data-size", "1024"]);
    assert!(cpu_field(&v, "client_cpu_s") > 0.0, "{v}");
    cpu_field(&v, "cpu_s_per_gb");
    // Server and client share the process: one figure, not two.
    assert_eq!(v["server_cpu"], "in-process", "{v}");
    assert!(v.get("server_cpu_s").is_none(), "{v}");
}

#[test]
fn produce_metadata_only_counts_metadata_bytes() {
    let v = bench(&[
        "produce",
        "--events",
        "200",
        "--metadata-size",
        "256",
        "--batch",
        "16",
    ]);
    check_counts(&v, "produce", 200, 256);
}

#[test]
fn consume_reads_back_what_was_produced() {
    let v = bench(&[
        "consume",
        "--events",
        "250",
        "--metadata-size",
        "80",
        "--data-size",
        "40",
        "--partitions",
        "3",
        "--consumers",
        "2",
        "--partition-type",
        "memory",
    ]);
    check_counts(&v, "consume", 250, 120);
    assert_eq!(v["produced"].as_u64(), Some(250), "{v}");
    assert_eq!(v["consumed"].as_u64(), Some(250), "{v}");
    assert_eq!(v["stored"].as_u64(), Some(250), "{v}");
    // The memory topic's bound is explicit and holds the whole run.
    assert_eq!(v["memory_overflow"], "drop-oldest", "{v}");
    assert!(
        v["memory_retention_bytes"].as_u64().unwrap_or(0) >= 250 * 120,
        "{v}"
    );
}

#[test]
fn consume_fails_loudly_when_memory_retention_dropped_events() {
    let out = Command::new(env!("CARGO_BIN_EXE_strom"))
        .args([
            "bench",
            "consume",
            "--events",
            "500",
            "--metadata-size",
            "100",
            "--batch",
            "10",
            "--partition-type",
            "memory",
            "--retention-bytes",
            "4096",
            "--json",
        ])
        .output()
        .expect("run strom bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "consume of a too-small memory topic succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "a failed run printed a result"
    );
    assert!(
        err.contains("500 events were produced") && err.contains("are stored"),
        "{err}"
    );
    assert!(err.contains("retention_bytes 4096"), "{err}");
}

#[test]
fn retention_bytes_sizes_the_memory_topic() {
    let v = bench(&[
        "consume",
        "--events",
        "50",
        "--metadata-size",
        "64",
        "--partition-type",
        "memory",
        "--retention-bytes",
        "1048576",
    ]);
    check_counts(&v, "consume", 50, 64);
    assert_eq!(v["memory_retention_bytes"].as_u64(), Some(1 << 20), "{v}");
}

#[test]
fn memcpy_baseline_prints_a_positive_rate() {
    let v = bench(&["baseline", "memcpy", "--size", "64KiB"]);
    assert_eq!(v["baseline"], "memcpy", "{v}");
    assert_eq!(v["size"].as_u64(), Some(64 << 10), "{v}");
    let gbs = v["gb_per_s"].as_f64().expect("gb_per_s");
    assert!(gbs > 0.0 && gbs.is_finite(), "{v}");
    let (lo, hi) = (v["min_gb_per_s"].as_f64(), v["max_gb_per_s"].as_f64());
    assert!(
        lo.is_some_and(|l| l <= gbs) && hi.is_some_and(|h| h >= gbs),
        "{v}"
    );
}

#[test]
fn consume_with_selectivity_counts_only_selected_data() {
    let v = bench(&[
        "consume",
        "--events",
        "100",
        "--metadata-size",
        "60",
        "--data-size",
        "200",
        "--selectivity",
        "0.25",
    ]);
    check_counts(&v, "consume", 100, 60 + 50);
}

#[test]
fn e2e_delivers_every_event_with_latencies() {
    let v = bench(&[
        "e2e",
        "--events",
        "200",
        "--metadata-size",
        "64",
        "--data-size",
        "32",
        "--rate",
        "5000",
        "--warmup",
        "20",
    ]);
    check_counts(&v, "e2e", 200, 96);
    assert_eq!(v["latency_samples"].as_u64(), Some(200), "{v}");
    assert!(
        v["p50_us"].as_u64().is_some() && v["p99_us"].as_u64().is_some(),
        "{v}"
    );
}

#[test]
fn procs_workers_aggregate_their_counts() {
    let v = bench(&[
        "produce",
        "--events",
        "200",
        "--metadata-size",
        "64",
        "--partitions",
        "2",
        "--producers",
        "2",
        "--procs",
    ]);
    check_counts(&v, "produce", 200, 64);
    // Workers in their own processes: the bench process is the server's.
    assert!(cpu_field(&v, "client_cpu_s") > 0.0, "{v}");
    cpu_field(&v, "server_cpu_s");
    cpu_field(&v, "cpu_s_per_gb");
    assert_eq!(v["server_cpu"], "bench-process", "{v}");
    let v = bench(&[
        "e2e",
        "--events",
        "100",
        "--metadata-size",
        "64",
        "--partitions",
        "2",
        "--producers",
        "2",
        "--consumers",
        "2",
        "--procs",
    ]);
    check_counts(&v, "e2e", 100, 64);
}

#[cfg(not(feature = "peers"))]
#[test]
fn peer_targets_without_the_feature_say_how_to_build_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_strom"))
        .args(["bench", "produce", "--target", "kafka://127.0.0.1:9"])
        .output()
        .expect("run strom bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--features peers"), "{err}");
}

/// `strom bench tasks` with 2000 tasks, 3 workers and batches of 32 on
/// Strom alone, plus `extra`.
fn bench_tasks(extra: &[&str]) -> Value {
    let mut args = vec![
        "tasks",
        "--tasks",
        "2000",
        "--workers",
        "3",
        "--batch",
        "32",
        "--peers",
        "strom",
    ];
    args.extend_from_slice(extra);
    bench(&args)
}

#[test]
fn tasks_completes_every_task_through_a_shared_group() {
    let v = bench_tasks(&["--task-bytes", "16"]);
    assert_eq!(v["mode"], "tasks");
    assert_eq!(v["tasks"].as_u64(), Some(2000), "{v}");
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 1, "{v}");
    let r = &results[0];
    assert_eq!(r["system"], "strom");
    assert_eq!(r["completed"].as_u64(), Some(2000), "{v}");
    assert!(r["taken"].as_u64().unwrap_or(0) >= 2000, "{v}");
    for key in ["seconds", "tasks_per_s"] {
        assert!(r[key].as_f64().is_some(), "{key} missing in {v}");
    }
    for key in ["p50_us", "p99_us", "max_us"] {
        assert!(r[key].as_u64().is_some(), "{key} missing in {v}");
    }
}

#[test]
fn tasks_completes_every_task_through_a_partitioned_group() {
    let v = bench_tasks(&["--group", "partitioned"]);
    assert_eq!(v["group"], "partitioned", "{v}");
    let r = &v["results"].as_array().expect("results array")[0];
    assert_eq!(r["system"], "strom");
    assert_eq!(r["completed"].as_u64(), Some(2000), "{v}");
}

#[test]
fn transport_compares_every_transport_beside_memcpy() {
    let v = bench(&[
        "transport",
        "--transport",
        "tcp,shm,shm-socket,ofi+tcp,ofi+shm",
        "--events",
        "3",
        "--metadata-size",
        "64",
        "--data-size",
        "100000",
        "--rounds",
        "1",
    ]);
    assert_eq!(v["mode"], "transport", "{v}");
    assert!(
        v["memcpy_gb_per_s"].as_f64().is_some_and(|g| g > 0.0),
        "{v}"
    );
    assert!(
        v["memcpy_fresh_gb_per_s"].as_f64().is_some_and(|g| g > 0.0),
        "{v}"
    );
    let rows = v["transports"].as_array().expect("transports");
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|r| r["transport"].as_str())
        .collect();
    assert_eq!(
        names,
        ["tcp", "shm", "shm-socket", "ofi+tcp", "ofi+shm"],
        "{v}"
    );
    for r in rows {
        let addr = r["addr"].as_str().unwrap_or("");
        let scheme = addr.split_once("://").map_or("tcp", |(s, _)| s);
        let name = r["transport"].as_str().unwrap_or("");
        assert_eq!(scheme, name.trim_end_matches("-socket"), "{r}");
        assert_eq!(r["consumed"].as_u64(), Some(3), "every event consumed: {r}");
        for phase in ["produce_cpu", "consume_cpu"] {
            // The server is a child process: its CPU comes from /proc.
            assert_eq!(r[phase]["server_cpu"], "proc-stat", "{r}");
            for k in ["client_cpu_s", "server_cpu_s", "cpu_s_per_gb"] {
                cpu_field(&r[phase], k);
            }
        }
        for k in ["produce_gb_per_s", "consume_gb_per_s"] {
            assert!(
                r[k].as_f64().is_some_and(|g| g > 0.0 && g.is_finite()),
                "{k}: {r}"
            );
        }
    }
}

/// A group of `strom cluster up`, taken down (`strom cluster down`) when
/// dropped, so a failed assertion leaves no server behind.
struct LocalCluster {
    dir: tempfile::TempDir,
    group_file: String,
}

impl LocalCluster {
    fn up(servers: u32) -> LocalCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = Command::new(env!("CARGO_BIN_EXE_strom"))
            .args(["cluster", "up", "--servers", &servers.to_string()])
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .expect("run strom cluster up");
        let cluster = LocalCluster {
            group_file: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            dir,
        };
        assert!(
            out.status.success(),
            "strom cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_strom"))
            .args(["cluster", "down", "--timeout", "5"])
            .arg("--data-dir")
            .arg(self.dir.path())
            .output();
    }
}

#[test]
fn produce_to_a_replicated_topic_reports_acks_and_ack_latency() {
    let c = LocalCluster::up(3);
    let target = format!("strom://{}", c.group_file);
    for acks in ["all", "leader"] {
        let v = bench(&[
            "produce",
            "--target",
            &target,
            "--events",
            "200",
            "--data-size",
            "100",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--acks",
            acks,
        ]);
        assert_eq!(v["mode"], "produce", "{v}");
        assert_eq!(v["produced"].as_u64(), Some(200), "{v}");
        assert_eq!(v["stored"].as_u64(), Some(200), "{v}");
        assert_eq!(v["replication_factor"].as_u64(), Some(3), "{v}");
        assert_eq!(v["acks"], acks, "{v}");
        assert_eq!(v["latency"], "push->ack", "{v}");
        assert_eq!(v["latency_samples"].as_u64(), Some(200), "{v}");
        for key in ["p50_us", "p99_us", "events_per_s", "mb_per_s"] {
            assert!(v[key].as_f64().is_some(), "{key} missing in {v}");
        }
        // Server CPU is every member's: each holds a copy.
        assert_eq!(v["server_cpu"], "proc-stat", "{v}");
        assert_eq!(
            v["server_cpu_pids"].as_array().map(Vec::len),
            Some(3),
            "{v}"
        );
        cpu_field(&v, "server_cpu_s");
        cpu_field(&v, "cpu_s_per_gb");
    }
}

#[test]
fn transform_carries_every_event_and_the_filter_half() {
    let v = bench(&[
        "transform",
        "--events",
        "200",
        "--data-size",
        "512",
        "--partitions",
        "2",
    ]);
    assert_eq!(v["mode"], "transform");
    assert_eq!(v["runs"], "in-process");
    assert!(v["peer_consume"]["mb_per_s"].as_f64().is_some(), "{v}");
    let out: Vec<(String, u64)> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["case"].as_str().unwrap().to_string(),
                c["events_out"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [("copy", 200), ("filter", 100), ("zstd", 200)];
    let want: Vec<(String, u64)> = want.iter().map(|(c, n)| (c.to_string(), *n)).collect();
    assert_eq!(out, want, "{v}");
}
