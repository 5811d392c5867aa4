//! `strom bench transport`: the same produce and consume runs over each
//! transport a client can reach a server by, side by side with a memcpy of
//! one data part measured in the same run.
//!
//! For each name in `--transport` (default `tcp,shm,shm-socket`) it starts
//! a `strom server` child process listening on that transport, produces
//! `--events` events into a memory partition through the ordinary client,
//! then consumes them (fetching every data byte into the consumer's
//! buffers), and stops the server. Server and client are separate
//! processes, as on a real node. `shm-socket` is shm with cross-memory
//! attach turned off in the server (`STROM_SHM_CMA=0`), so its data parts
//! go through the socket: the fallback's cost.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{baseline, engine, open_target, BenchArgs, Config, Mode};

/// How a transport name is served: the listen URL and whether the server
/// may let clients pull data parts (cross-memory attach).
fn listen_of(name: &str) -> anyhow::Result<(&'static str, bool)> {
    Ok(match name {
        "tcp" => ("127.0.0.1:0", true),
        "shm" => ("shm://auto", true),
        "shm-socket" => ("shm://auto", false),
        other => {
            anyhow::bail!("unknown transport '{other}' in --transport: use tcp, shm or shm-socket")
        }
    })
}

/// A `strom server` child process in a temporary directory.
struct LocalServer {
    child: Child,
    group_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl LocalServer {
    fn start(listen: &str, cma: bool) -> anyhow::Result<LocalServer> {
        let dir = tempfile::tempdir()?;
        let group_file = dir.path().join("group.json");
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("server")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen")
            .arg(listen)
            .arg("--group-file")
            .arg(&group_file)
            .env_remove("STROM_GROUP_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !cma {
            cmd.env("STROM_SHM_CMA", "0");
        }
        let mut s = LocalServer {
            child: cmd.spawn()?,
            group_file,
            _dir: dir,
        };
        s.wait_ready(Duration::from_secs(30))?;
        Ok(s)
    }

    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while !ready(&self.group_file) {
            if let Some(st) = self.child.try_wait()? {
                anyhow::bail!("the benchmark's strom server exited early ({st})");
            }
            if start.elapsed() > limit {
                anyhow::bail!("the benchmark's strom server did not start within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn ready(group_file: &Path) -> bool {
    std::fs::read(group_file).is_ok_and(|b| serde_json::from_slice::<serde_json::Value>(&b).is_ok())
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One transport's produce and consume figures.
struct Row {
    name: String,
    addr: String,
    produce: engine::Result,
    consume: engine::Result,
}

fn gbs(r: &engine::Result) -> f64 {
    r.bytes as f64 / r.seconds / 1e9
}

/// Produce then consume over one transport.
fn measure(args: &BenchArgs, name: &str) -> anyhow::Result<Row> {
    let (listen, cma) = listen_of(name)?;
    let server = LocalServer::start(listen, cma)?;
    let group: serde_json::Value = serde_json::from_slice(&std::fs::read(&server.group_file)?)?;
    let addr = group["members"][0]["addr"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let topic = format!("bench-transport-{}", super::workload::now_us());
    let mut results = Vec::new();
    for mode in [Mode::Produce, Mode::Consume] {
        let mut a = args.clone();
        a.mode = mode;
        a.partition_type = "memory".into();
        a.topic = Some(topic.clone());
        let target_spec = format!("strom://{}", server.group_file.display());
        let mut target = open_target(Some(&target_spec), None)?;
        let cfg = Config::new(a)?;
        target.prepare(&cfg)?;
        results.push(engine::run(&cfg, target.as_ref())?);
    }
    let consume = results
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no consume result"))?;
    let produce = results
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no produce result"))?;
    Ok(Row {
        name: name.to_string(),
        addr,
        produce,
        consume,
    })
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let names: Vec<String> = args
        .transport
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for n in &names {
        listen_of(n)?;
    }
    let mut rows = Vec::new();
    for n in &names {
        rows.push(measure(&args, n)?);
    }
    let memcpy = baseline::memcpy_samples(args.data_size.max(1));
    let memcpy_gbs = memcpy[memcpy.len() / 2];
    report(&args, &rows, memcpy_gbs);
    Ok(())
}

fn report(args: &BenchArgs, rows: &[Row], memcpy_gbs: f64) {
    let per = |r: &Row| {
        json!({
            "transport": r.name, "addr": r.addr,
            "produce_gb_per_s": gbs(&r.produce), "consume_gb_per_s": gbs(&r.consume),
            "produce_events_per_s": r.produce.events as f64 / r.produce.seconds,
            "consume_events_per_s": r.consume.events as f64 / r.consume.seconds,
            "produce_vs_memcpy": gbs(&r.produce) / memcpy_gbs,
            "consume_vs_memcpy": gbs(&r.consume) / memcpy_gbs,
            "produced": r.produce.produced, "consumed": r.consume.consumed,
        })
    };
    if args.json {
        let out = json!({
            "mode": "transport", "events": args.events, "metadata_size": args.metadata_size,
            "data_size": args.data_size, "partition_type": "memory",
            "memcpy_gb_per_s": memcpy_gbs,
            "transports": rows.iter().map(per).collect::<Vec<_>>(),
        });
        println!("{out}");
        return;
    }
    println!(
        "{} events of {} B metadata + {} B data, memory partition, server in its own process",
        args.events, args.metadata_size, args.data_size
    );
    println!(
        "memcpy of one data part ({} B, warm buffers): {memcpy_gbs:.2} GB/s",
        args.data_size
    );
    println!(
        "{:<11} {:>12} {:>9} {:>12} {:>9}  address",
        "transport", "produce GB/s", "/memcpy", "consume GB/s", "/memcpy"
    );
    for r in rows {
        let (p, c) = (gbs(&r.produce), gbs(&r.consume));
        println!(
            "{:<11} {:>12.2} {:>8.0}% {:>12.2} {:>8.0}%  {}",
            r.name,
            p,
            100.0 * p / memcpy_gbs,
            c,
            100.0 * c / memcpy_gbs,
            r.addr
        );
    }
}
