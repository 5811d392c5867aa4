//! `strom sink postgres` against a real `strom server` and a real,
//! throw-away PostgreSQL cluster (see common/pg.rs): every event lands
//! once with its mapped columns, JSONB rest and offsets; `kill -9` at any
//! point loses and duplicates nothing after a restart; bad events and bad
//! arguments give the documented behaviour.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pg::PgCluster;
use common::{ok, ServerProcess};
use serde_json::json;
use strom_client::{Driver, Producer, TopicSpec};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const COLUMNS: &str = "event_id:uuid,device_id:text,seq:bigint,temp=temperature:double";

/// Event `i` of the telemetry stream, as the ingest generator makes them.
fn telemetry(i: u64) -> serde_json::Value {
    json!({
        "event_id": event_uuid(i).to_string(),
        "device_id": format!("dev-{:06}", i % 50),
        "timestamp": 1_700_000_000.0 + i as f64 / 10.0,
        "seq": i,
        "temperature": 20.0 + (i % 10) as f64 / 4.0,
        "status": "ok",
    })
}

fn event_uuid(i: u64) -> uuid::Uuid {
    uuid::Uuid::from_u128(0x5eed_0000_0000_4000_8000_0000_0000_0000 | i as u128)
}

fn create_topic(driver: &Driver, name: &str, partitions: u32) {
    driver
        .create_topic(TopicSpec::new(name, partitions))
        .expect("creating the topic");
}

/// Produces events `range` and, if `close`, ends the stream.
fn produce(driver: &Driver, topic: &str, range: std::ops::Range<u64>, close: bool) {
    let p = produce_open(driver, topic, range);
    if close {
        p.close().expect("close");
    }
}

/// Produces events `range` with a producer the caller keeps: while it
/// lives (and renews its lease) the stream does not end.
fn produce_open(driver: &Driver, topic: &str, range: std::ops::Range<u64>) -> Producer {
    let t = driver.open_topic(topic).expect("opening the topic");
    let p = t.producer().expect("a producer");
    for i in range {
        p.push(telemetry(i), ()).expect("push");
    }
    p.flush().expect("flush");
    p
}

fn sink_args<'a>(pg_dsn: &'a str, table: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "sink",
        "postgres",
        "--topic",
        "telemetry",
        "--name",
        "pg",
        "--dsn",
        pg_dsn,
        "--table",
        table,
        "--columns",
        COLUMNS,
    ];
    v.extend_from_slice(extra);
    v
}

/// Per partition: (partition, rows, max offset + 1) in the table.
type RowSpans = Vec<(i32, i64, i64)>;
/// Per partition: (partition, next offset) in the offsets table.
type Stored = Vec<(i32, i64)>;

/// What the table holds per partition, and the stored offsets.
fn positions(pg: &PgCluster, table: &str) -> (RowSpans, Stored) {
    let rows = pg.query(&format!(
        "SELECT strom_partition, count(*), max(strom_offset) + 1 FROM {table} \
         GROUP BY 1 ORDER BY 1"
    ));
    let offs = pg.query(
        "SELECT partition, next_offset FROM strom_sink_offsets \
         WHERE topic = 'telemetry' AND consumer_name = 'pg' ORDER BY 1",
    );
    (
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
        offs.iter().map(|r| (r.get(0), r.get(1))).collect(),
    )
}

/// Every partition's rows are exactly offsets 0..next, and the offsets
/// table says `next`, which is where Strom's partition ends.
fn assert_dense_and_stored(pg: &PgCluster, table: &str, driver: &Driver, topic: &str) {
    let info = driver
        .open_topic(topic)
        .and_then(|t| t.describe())
        .expect("describing the topic");
    let (rows, offs) = positions(pg, table);
    let want: Vec<(i32, i64)> = info
        .partitions
        .iter()
        .map(|p| (p.id as i32, p.next_offset as i64))
        .collect();
    assert_eq!(offs, want, "stored offsets vs the partitions' ends");
    let dense: Vec<(i32, i64, i64)> = want.iter().map(|&(p, n)| (p, n, n)).collect();
    assert_eq!(
        rows, dense,
        "rows per partition (partition, count, max offset + 1)"
    );
}

#[test]
fn sink_writes_each_event_once_with_mapped_columns_rest_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    let d = server.connect();
    create_topic(&d, "telemetry", 3);
    produce(&d, "telemetry", 0..500, true);
    let dsn = pg.dsn();
    let out = ok(
        server.cli(
            &sink_args(&dsn, "readings", &["--batch", "64"]),
            "",
            RUN_TIMEOUT,
        ),
        "sink",
    );
    assert!(out.stdout.contains("sink: 500 rows"), "{}", out.stdout);
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 500);
    assert_eq!(
        pg.query_i64("SELECT count(DISTINCT event_id) FROM readings"),
        500
    );
    assert_eq!(
        pg.query_i64("SELECT sum(seq)::bigint FROM readings"),
        (0..500).sum::<i64>()
    );
    let row = &pg
        .query("SELECT event_id::text, device_id, temp, extra::text FROM readings WHERE seq = 7")
        [0];
    assert_eq!(row.get::<_, String>(0), event_uuid(7).to_string());
    assert_eq!(row.get::<_, String>(1), "dev-000007");
    assert_eq!(row.get::<_, f64>(2), 20.0 + 7.0 / 4.0);
    let rest: serde_json::Value = serde_json::from_str(&row.get::<_, String>(3)).unwrap();
    assert_eq!(
        rest,
        json!({"timestamp": 1_700_000_000.7, "status": "ok"}),
        "the JSONB rest holds exactly the unmapped fields"
    );
    assert_dense_and_stored(&pg, "readings", &d, "telemetry");
    // Strom's committed offsets follow PostgreSQL's (acked after commit).
    for p in 0..3u32 {
        let committed = d.consumer_offsets("telemetry", p).expect("offsets");
        let end = d
            .open_topic("telemetry")
            .unwrap()
            .describe()
            .unwrap()
            .partitions[p as usize]
            .next_offset;
        assert!(
            committed.iter().any(|(n, o)| n == "pg" && *o == end),
            "partition {p}: Strom's committed offsets {committed:?}, want pg at {end}"
        );
    }
    // A second run starts where PostgreSQL says and writes nothing again.
    let again = ok(
        server.cli(&sink_args(&dsn, "readings", &[]), "", RUN_TIMEOUT),
        "second sink run",
    );
    assert!(again.stdout.contains("sink: 0 rows"), "{}", again.stdout);
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 500);
}

/// Starts the sink as a child process writing its output into `dir`.
fn spawn_sink(server: &ServerProcess, dsn: &str, dir: &Path, run: usize) -> Child {
    let gf = server.group_file.to_str().unwrap();
    let mut args = vec!["--group-file", gf];
    args.extend(sink_args(dsn, "readings", &["--batch", "200"]));
    let log = |what: &str| std::fs::File::create(dir.join(format!("sink{run}.{what}"))).unwrap();
    Command::new(common::strom_bin())
        .args(&args)
        .env_remove("STROM_LOG")
        .stdin(Stdio::null())
        .stdout(log("out"))
        .stderr(log("err"))
        .spawn()
        .expect("spawning the sink")
}

#[test]
fn sink_killed_with_sigkill_mid_stream_writes_every_event_exactly_once() {
    const EVENTS: u64 = 30_000;
    const CHUNK: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    let d = server.connect();
    create_topic(&d, "telemetry", 3);
    // A producer that keeps producing while the sink runs and dies.
    let producer = {
        let d = d.clone();
        std::thread::spawn(move || {
            let p = produce_open(&d, "telemetry", 0..CHUNK);
            for c in 1..EVENTS / CHUNK {
                std::thread::sleep(Duration::from_millis(10));
                for i in c * CHUNK..(c + 1) * CHUNK {
                    p.push(telemetry(i), ()).expect("push");
                }
                p.flush().expect("flush");
            }
            p.close().expect("close");
        })
    };
    let dsn = pg.dsn();
    let count = || {
        pg.try_query("SELECT count(*) FROM readings")
            .map_or(0, |r| r[0].get::<_, i64>(0))
    };
    let mut kills = Vec::new();
    for (run, at_least) in [2_000i64, 9_000, 17_000].into_iter().enumerate() {
        let mut child = spawn_sink(&server, &dsn, dir.path(), run);
        let deadline = Instant::now() + RUN_TIMEOUT;
        while count() < at_least && child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the sink made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(status) = child.try_wait().unwrap() {
            let err = std::fs::read_to_string(dir.path().join(format!("sink{run}.err")));
            panic!("the sink exited with {status} before it was killed: {err:?}");
        }
        child.kill().expect("SIGKILL the sink");
        child.wait().unwrap();
        kills.push(count());
    }
    producer.join().expect("the producer thread");
    eprintln!("rows in the table at each kill -9: {kills:?}");
    let out = ok(
        server.cli(
            &sink_args(&dsn, "readings", &["--batch", "200"]),
            "",
            RUN_TIMEOUT,
        ),
        "the sink after the kills",
    );
    assert!(out.stdout.contains(" rows in "), "{}", out.stdout);
    let n = EVENTS as i64;
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), n);
    assert_eq!(
        pg.query_i64("SELECT count(DISTINCT event_id) FROM readings"),
        n
    );
    assert_eq!(pg.query_i64("SELECT count(DISTINCT seq) FROM readings"), n);
    assert_dense_and_stored(&pg, "readings", &d, "telemetry");
}

#[test]
fn sink_stops_before_a_bad_event_and_skip_mode_moves_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    let d = server.connect();
    create_topic(&d, "telemetry", 1);
    let t = d.open_topic("telemetry").unwrap();
    let p = t.producer().unwrap();
    for i in 0..12u64 {
        match i {
            5 => p.push(b"not json {".to_vec(), ()),
            9 => p.push(
                json!({"event_id": event_uuid(i).to_string(), "device_id": "d"}),
                (),
            ),
            _ => p.push(telemetry(i), ()),
        }
        .expect("push");
    }
    p.close().expect("close");
    let dsn = pg.dsn();
    let stop = server.cli(&sink_args(&dsn, "readings", &[]), "", RUN_TIMEOUT);
    assert_eq!(stop.status.code(), Some(1), "stderr: {}", stop.stderr);
    assert!(
        stop.stderr.contains("event 0/5") && stop.stderr.contains("not JSON"),
        "{}",
        stop.stderr
    );
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 5);
    let (_, offs) = positions(&pg, "readings");
    assert_eq!(offs, vec![(0, 5)], "stored position is the bad event");
    // A restart meets the same event and writes nothing more.
    let again = server.cli(&sink_args(&dsn, "readings", &[]), "", RUN_TIMEOUT);
    assert_eq!(again.status.code(), Some(1), "stderr: {}", again.stderr);
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 5);
    let skip = ok(
        server.cli(
            &sink_args(&dsn, "readings", &["--on-bad", "skip"]),
            "",
            RUN_TIMEOUT,
        ),
        "the sink with --on-bad skip",
    );
    assert!(
        skip.stdout.contains("2 bad events skipped"),
        "{}",
        skip.stdout
    );
    assert!(skip.stderr.contains("lacks field 'seq'"), "{}", skip.stderr);
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 10);
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM readings WHERE seq IN (5, 9)"),
        0
    );
    let (_, offs) = positions(&pg, "readings");
    assert_eq!(
        offs,
        vec![(0, 12)],
        "stored position is past the skipped events"
    );
}

#[test]
fn sink_refuses_bad_specs_unreachable_postgres_and_mismatched_tables() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    create_topic(&server.connect(), "telemetry", 1);
    let dsn = pg.dsn();
    let refused = |args: Vec<&str>, want: &str| {
        let out = server.cli(&args, "", RUN_TIMEOUT);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(want),
            "{args:?}: want '{want}' in {}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    };
    let mut bad_spec = sink_args(&dsn, "readings", &[]);
    bad_spec[11] = "seq:bigint,device_id";
    refused(bad_spec, "'device_id' lacks a type");
    let mut bad_type = sink_args(&dsn, "readings", &[]);
    bad_type[11] = "seq:numeric";
    refused(bad_type, "unknown type 'numeric'");
    refused(
        sink_args(
            "host=/nonexistent/socket/dir port=1 user=x",
            "readings",
            &[],
        ),
        "connecting to PostgreSQL",
    );
    refused(sink_args("this is not a dsn", "readings", &[]), "bad --dsn");
    refused(sink_args(&dsn, "bad-name", &[]), "not a plain identifier");
    pg.execute("CREATE TABLE mismatched (seq text NOT NULL, other integer NOT NULL)");
    refused(
        sink_args(&dsn, "mismatched", &[]),
        "table mismatched exists but does not match",
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM strom_sink_offsets"),
        0,
        "a refused run stores no position"
    );
}

#[test]
fn sink_ends_on_idle_timeout_and_exits_128_plus_signal_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    let d = server.connect();
    create_topic(&d, "telemetry", 2);
    // The stream stays open: only the idle timeout ends this run.
    let _open = produce_open(&d, "telemetry", 0..1_000);
    let dsn = pg.dsn();
    let idle = ok(
        server.cli(
            &sink_args(&dsn, "readings", &["--idle-timeout", "0.5"]),
            "",
            RUN_TIMEOUT,
        ),
        "the sink with --idle-timeout",
    );
    assert!(idle.stdout.contains("sink: 1000 rows"), "{}", idle.stdout);
    // SIGTERM while waiting for more: a clean stop, positions matching the
    // rows, and an exit code that says which signal.
    let _open2 = produce_open(&d, "telemetry", 1_000..1_500);
    let mut child = spawn_sink(&server, &dsn, dir.path(), 0);
    let deadline = Instant::now() + RUN_TIMEOUT;
    while pg.query_i64("SELECT count(*) FROM readings") < 1_500 {
        assert!(child.try_wait().unwrap().is_none(), "the sink exited early");
        assert!(Instant::now() < deadline, "the sink made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = common::wait_bounded(&mut child, RUN_TIMEOUT).expect("the sink exits");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let out = std::fs::read_to_string(dir.path().join("sink0.out")).unwrap();
    assert!(out.contains("sink: 500 rows"), "{out}");
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 1_500);
    assert_eq!(
        pg.query_i64("SELECT sum(next_offset)::bigint FROM strom_sink_offsets"),
        1_500
    );
}

#[test]
fn second_sink_with_the_same_name_is_refused_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    let d = server.connect();
    create_topic(&d, "telemetry", 2);
    let _open = produce_open(&d, "telemetry", 0..100);
    let dsn = pg.dsn();
    let mut first = spawn_sink(&server, &dsn, dir.path(), 0);
    let deadline = Instant::now() + RUN_TIMEOUT;
    while pg
        .try_query("SELECT count(*) FROM readings")
        .map_or(0, |r| r[0].get::<_, i64>(0))
        < 100
    {
        assert!(first.try_wait().unwrap().is_none(), "the first sink exited");
        assert!(Instant::now() < deadline, "the first sink made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = server.cli(&sink_args(&dsn, "readings", &[]), "", RUN_TIMEOUT);
    assert_eq!(second.status.code(), Some(1), "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("another sink holds topic 'telemetry' as consumer 'pg'"),
        "{}",
        second.stderr
    );
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first sink still runs"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(pg.query_i64("SELECT count(*) FROM readings"), 100);
}

#[test]
fn a_backlog_drains_from_every_partition_in_turn() {
    // 4 partitions with 10,000 events each wait when the sink starts. A
    // sink that always filled its batches from the first partition with
    // events would write nothing of the others until that one was empty.
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let pg = PgCluster::start();
    let d = server.connect();
    create_topic(&d, "telemetry", 4);
    produce(&d, "telemetry", 0..40_000, true);
    let count = || {
        pg.try_query("SELECT count(*) FROM readings")
            .map_or(0, |r| r[0].get::<_, i64>(0))
    };
    let mut child = spawn_sink(&server, &pg.dsn(), dir.path(), 0);
    let deadline = Instant::now() + RUN_TIMEOUT;
    while count() < 4_000 && child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the sink made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL the sink");
    child.wait().unwrap();
    let (rows, _) = positions(&pg, "readings");
    let total: i64 = rows.iter().map(|r| r.1).sum();
    assert!(total < 40_000, "killed before the end: {rows:?}");
    // What the sink said (its warnings name partitions it could not read).
    let said = std::fs::read_to_string(dir.path().join("sink0.err")).unwrap_or_default();
    assert_eq!(rows.len(), 4, "every partition has rows: {rows:?}\n{said}");
    for (p, n, _) in &rows {
        assert!(
            *n * 8 >= total,
            "partition {p} got {n} of {total} rows: {rows:?}; the sink said:\n{said}"
        );
    }
}
