//! Tiered storage with the real `strom server` (docs/tiering.md): a server
//! with `tier_dir` and `tier_local_retention_bytes = 0` copies the closed
//! segments of a file partition to the tier, drops them locally once
//! verified, and a consumer replaying from the beginning gets every byte
//! back; `kill -9` while copies run loses nothing and the restarted server
//! finishes the copies.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{event_payload, read_all, wait_for, ServerProcess, Stored};
use strom_client::{Driver, PushFuture, TopicSpec};

const TIMEOUT: Duration = Duration::from_secs(120);

fn config(tier: &Path, segment_bytes: u64) -> String {
    format!(
        "segment_bytes = {segment_bytes}\ntier_dir = \"{}\"\ntier_local_retention_bytes = 0\n\
         tier_check_ms = 50\ntier_cache_segments = 2\n",
        tier.display()
    )
}

/// The directory of partition 0 of `topic` under the server's data dir.
fn partition_dir(data: &Path, topic: &str) -> PathBuf {
    let topics = data.join("topics");
    let entry = std::fs::read_dir(&topics)
        .expect("listing the topics")
        .filter_map(|e| e.ok())
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{topic}."))
        })
        .expect("the topic's directory");
    entry.path().join("0")
}

/// Names of the files ending with `.ext` in `dir` (none if it is missing).
fn files(dir: &Path, ext: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&format!(".{ext}")))
        .collect();
    names.sort();
    names
}

/// The tier directory of partition 0 of `topic`.
fn tier_partition(tier: &Path, local: &Path) -> PathBuf {
    let topic_dir = local
        .parent()
        .and_then(|p| p.file_name())
        .expect("topic dir name");
    tier.join(topic_dir).join("0")
}

/// Pushes `n` events (`tag`) and waits for every ack; returns them by offset.
fn produce(driver: &Driver, topic: &str, tag: &str, n: u64, big: usize) -> BTreeMap<u64, Stored> {
    let t = driver.open_topic(topic).expect("opening the topic");
    let producer = t.producer().expect("producer");
    let mut pending: Vec<(PushFuture, Stored)> = Vec::new();
    let mut acked = BTreeMap::new();
    for i in 0..n {
        let (meta, mut data) = event_payload(tag, i);
        if big > 0 {
            data.resize(big, (i % 251) as u8);
        }
        let f = producer
            .push(meta.clone(), data.clone())
            .expect("push accepted");
        pending.push((f, Stored { meta, data }));
        // Waiting every few events keeps batches (which never split
        // across segments) small, so segments roll often.
        if pending.len() == 4 || i + 1 == n {
            for (f, s) in pending.drain(..) {
                let id = f
                    .wait_timeout(Some(TIMEOUT))
                    .expect("every push is acknowledged");
                acked.insert(id.offset, s);
            }
        }
    }
    producer.close().expect("closing the producer");
    acked
}

/// Waits until only the active segment is local and the tier holds every
/// other one; returns how many segments are in the tier.
fn wait_until_tiered(local: &Path, tier: &Path) -> usize {
    wait_for(
        "closed segments copied to the tier and dropped locally",
        || {
            let logs = files(local, "log");
            let tiered = files(tier, "log");
            logs.len() == 1 && tiered.last() < logs.first() && !tiered.is_empty()
        },
    );
    files(tier, "log").len()
}

fn assert_all_read(driver: &Driver, topic: &str, want: &BTreeMap<u64, Stored>) {
    let got = read_all(driver, topic, "replay", TIMEOUT);
    assert_eq!(got.start[&0], 0, "the partition still starts at offset 0");
    assert_eq!(got.len(), want.len(), "every event read back");
    for (offset, w) in want {
        let g = &got.events[&(0, *offset)];
        assert_eq!(g.meta, w.meta, "metadata of offset {offset}");
        assert!(
            g.data == w.data,
            "data of offset {offset} ({} bytes)",
            w.data.len()
        );
    }
}

#[test]
fn tiered_partition_replays_every_byte_from_offset_zero() {
    let base = tempfile::tempdir().expect("tempdir");
    let tier = base.path().join("tier");
    let server = ServerProcess::start_with_config(base.path(), &config(&tier, 8192));
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("tiered", 1))
        .expect("creating the topic");
    let want = produce(&driver, "tiered", "tier", 600, 0);
    let local = partition_dir(&server.data_dir, "tiered");
    let tier_part = tier_partition(&tier, &local);
    let tiered = wait_until_tiered(&local, &tier_part);
    assert!(tiered >= 20, "many segments in the tier ({tiered})");
    assert_eq!(files(&tier_part, "data").len(), tiered);
    eprintln!("{tiered} segments in the tier, 1 local");
    assert_all_read(&driver, "tiered", &want);
    // Reading from the beginning again hits segments evicted from the cache.
    let again = read_all(&driver, "tiered", "replay-2", TIMEOUT);
    assert_eq!(again.len(), want.len());
}

#[test]
fn kill_9_during_tier_copies_loses_nothing_and_restart_finishes_them() {
    let base = tempfile::tempdir().expect("tempdir");
    let tier = base.path().join("tier");
    // 96 MiB in 1 MiB events, in segments of 1 MiB. They are written with
    // the tier's pass an hour away, so that the whole backlog waits for
    // the restart below, whatever the machine's load (a pass running
    // during the writes could keep up with them, and leave nothing to kill).
    let idle = config(&tier, 1 << 20).replace("tier_check_ms = 50", "tier_check_ms = 3600000");
    let server = ServerProcess::start_with_config(base.path(), &idle);
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("copying", 1))
        .expect("creating the topic");
    let want = produce(&driver, "copying", "kill", 96, 1 << 20);
    let local = partition_dir(&server.data_dir, "copying");
    let tier_part = tier_partition(&tier, &local);
    assert!(
        files(&tier_part, "log").is_empty(),
        "no copy before the tier's first pass"
    );
    drop(driver);
    server.kill9();
    // The tier's pass every 50 ms now: kill the moment a copy is in flight
    // (a `.tmp` object in the tier), or once the copies have started.
    let cfg = config(&tier, 1 << 20);
    let server = ServerProcess::start_with_config(base.path(), &cfg);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while files(&tier_part, "tmp").is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    wait_for("the first copy to start", || {
        std::fs::read_dir(&tier_part).is_ok_and(|mut d| d.next().is_some())
    });
    server.kill9();
    let tiered_at_kill = files(&tier_part, "log").len();
    let tmp_at_kill = files(&tier_part, "tmp").len();
    let local_at_kill = files(&local, "log").len();
    eprintln!(
        "at the kill: {tiered_at_kill} segments in the tier, {tmp_at_kill} copies in flight, \
         {local_at_kill} local"
    );
    assert!(
        local_at_kill > 1,
        "the kill came before every copy finished"
    );

    let server = ServerProcess::start_with_config(base.path(), &cfg);
    let driver = server.connect();
    let tiered = wait_until_tiered(&local, &tier_part);
    assert!(
        tiered >= 20,
        "the restart finished the copies ({tiered} in the tier)"
    );
    assert!(
        files(&tier_part, "tmp").is_empty(),
        "no copy left half done"
    );
    assert_all_read(&driver, "copying", &want);
}

#[test]
fn topic_that_opts_out_of_the_tier_stays_local() {
    let base = tempfile::tempdir().expect("tempdir");
    let tier = base.path().join("tier");
    // The tier from the command line (`--tier-dir`), the rest from the
    // config file; the opt-out from `topic create --tier false`.
    let cfg = config(&tier, 8192).replace(&format!("tier_dir = \"{}\"\n", tier.display()), "");
    assert!(!cfg.contains("tier_dir"));
    let file = base.path().join("server.toml");
    std::fs::write(&file, cfg).expect("writing the config");
    let (file, tier_arg) = (file.to_str().unwrap(), tier.to_str().unwrap());
    let server =
        ServerProcess::start_with(base.path(), &["--config", file, "--tier-dir", tier_arg]);
    let driver = server.connect();
    let out = server.cli(
        &["topic", "create", "local-only", "--tier", "false"],
        "",
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        driver.describe("local-only").unwrap().spec.tier,
        Some(false)
    );
    // A tiered topic next to it shows the copy passes run meanwhile.
    driver
        .create_topic(TopicSpec::new("tiered", 1))
        .expect("creating the topic");
    let want = produce(&driver, "local-only", "local", 200, 0);
    produce(&driver, "tiered", "tier", 200, 0);
    let tiered = partition_dir(&server.data_dir, "tiered");
    wait_until_tiered(&tiered, &tier_partition(&tier, &tiered));
    let local = partition_dir(&server.data_dir, "local-only");
    assert!(files(&local, "log").len() > 5, "every segment stays local");
    assert!(
        !tier_partition(&tier, &local).exists(),
        "nothing copied to the tier"
    );
    assert!(!local.join("tier.manifest").exists());
    assert_all_read(&driver, "local-only", &want);
}

/// A moto S3 server (`moto_server`, PyPI `moto[server]`) on a free port
/// with bucket `strom`, stopped on drop; `None` where it is not installed.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `moto_server` from PATH, else from the repository's Python venv, where
/// `make python-setup` installs it (PyPI `moto[server]`).
fn moto_server() -> std::path::PathBuf {
    let venv =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/.venv/bin/moto_server");
    match venv.exists() {
        true => venv,
        false => "moto_server".into(),
    }
}

fn start_moto() -> Option<Moto> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = std::process::Command::new(moto_server())
        .args(["-H", "127.0.0.1", "-p", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let mut lines = BufReader::new(child.stderr.take()?).lines();
    let endpoint = lines.by_ref().take(20).map_while(|l| l.ok()).find_map(|l| {
        l.split_once("Running on ")
            .map(|(_, u)| u.trim().to_string())
    });
    std::thread::spawn(move || lines.for_each(drop));
    let moto = Moto {
        child,
        endpoint: endpoint?,
    };
    let addr = moto.endpoint.trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).ok()?;
    write!(
        s,
        "PUT /strom HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply.contains(" 200 ").then_some(moto)
}

#[test]
fn object_store_tier_through_the_server_replays_every_byte() {
    let base = tempfile::tempdir().expect("tempdir");
    let moto = start_moto();
    let (url, env): (String, Vec<(&str, String)>) = match &moto {
        Some(m) => {
            eprintln!("tier_url backend: S3 (moto_server at {})", m.endpoint);
            let env = vec![
                ("AWS_ENDPOINT", m.endpoint.clone()),
                ("AWS_ALLOW_HTTP", "true".to_string()),
                ("AWS_ACCESS_KEY_ID", "test".to_string()),
                ("AWS_SECRET_ACCESS_KEY", "test".to_string()),
                ("AWS_REGION", "us-east-1".to_string()),
            ];
            ("s3://strom/cluster".to_string(), env)
        }
        None => {
            eprintln!("tier_url backend: object_store LocalFileSystem (no moto_server installed)");
            (
                format!("file://{}", base.path().join("objects").display()),
                Vec::new(),
            )
        }
    };
    let cfg = format!(
        "segment_bytes = 8192\ntier_url = \"{url}\"\ntier_local_retention_bytes = 0\ntier_check_ms = 50\n"
    );
    let file = base.path().join("server.toml");
    std::fs::write(&file, cfg).expect("writing the config");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = ServerProcess::start_with_env(
        base.path(),
        &["--config", file.to_str().expect("utf-8")],
        &env,
    );
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("s3", 1))
        .expect("creating the topic");
    let want = produce(&driver, "s3", "s3", 300, 0);
    let local = partition_dir(&server.data_dir, "s3");
    wait_for("closed segments dropped locally", || {
        files(&local, "log").len() == 1
    });
    let info = driver
        .open_topic("s3")
        .and_then(|t| t.describe())
        .expect("describe");
    assert_eq!(
        info.partitions[0].first_offset, 0,
        "the tier still starts at 0"
    );
    assert_all_read(&driver, "s3", &want);
}
