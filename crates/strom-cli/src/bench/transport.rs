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
//!
//! Every byte a memory partition stores lands in memory the server has
//! never touched, so the kernel must zero it first (and, in a virtual
//! machine, the host must back it on first touch): that, not the copy, is
//! most of a produce run's cost. The report therefore prints two memcpy
//! figures, between warm buffers and into fresh memory, and each transport
//! runs `--rounds` times (the median is reported, every round is in the
//! JSON). Beside each rate it prints the CPU seconds per GB, client (this
//! process) plus server (the child's `/proc/PID/stat`), over every round.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::cpu::{CpuUse, ServerCpu};
use super::{baseline, engine, open_target, BenchArgs, Config, Mode};

/// How a transport name is served: the listen URL and whether the server
/// may let clients pull data parts (cross-memory attach).
fn listen_of(name: &str) -> anyhow::Result<(&'static str, bool)> {
    Ok(match name {
        "tcp" => ("127.0.0.1:0", true),
        "shm" => ("shm://auto", true),
        "shm-socket" => ("shm://auto", false),
        "ofi+tcp" => ("ofi+tcp://auto", true),
        "ofi+shm" => ("ofi+shm://auto", true),
        other => anyhow::bail!(
            "unknown transport '{other}' in --transport: use tcp, shm, shm-socket, ofi+tcp or ofi+shm"
        ),
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
        if !strom_server::local_only(listen) {
            // libfabric's tcp provider listens on a network address: this
            // short-lived benchmark server accepts that without auth.
            cmd.arg("--insecure");
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
    /// SIGTERM first: a server that shuts down cleanly removes its shm
    /// socket and its libfabric shared-memory regions (SIGKILL leaves them
    /// behind in /tmp and /dev/shm); SIGKILL after 5 s.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One transport's produce and consume figures (GB/s), one per round.
struct Row {
    name: String,
    addr: String,
    produce: Vec<f64>,
    consume: Vec<f64>,
    /// Events consumed, over every round (each round checks its own count).
    consumed: u64,
    /// CPU and bytes of every round's produce and consume phases.
    produce_cpu: Vec<(CpuUse, u64)>,
    consume_cpu: Vec<(CpuUse, u64)>,
}

/// CPU of phases summed, and the bytes they moved.
fn cpu_of(phases: &[(CpuUse, u64)]) -> (CpuUse, u64) {
    (
        CpuUse::sum(phases.iter().map(|(c, _)| c)),
        phases.iter().map(|(_, b)| b).sum(),
    )
}

/// The CPU fields of one phase over every round, as in `strom bench`'s
/// JSON (`client_cpu_s`, `server_cpu_s`, `cpu_s_per_gb`, ...).
fn cpu_json(phases: &[(CpuUse, u64)]) -> serde_json::Value {
    let (cpu, bytes) = cpu_of(phases);
    let mut v = json!({});
    cpu.write_json(bytes, &mut v);
    v
}

/// CPU-s per GB of one phase over every round, for the table.
fn cpu_cell(phases: &[(CpuUse, u64)]) -> String {
    let (cpu, bytes) = cpu_of(phases);
    cpu.per_gb(bytes)
        .map_or("-".to_string(), |g| format!("{g:.2}"))
}

fn gbs(r: &engine::Result) -> f64 {
    r.bytes as f64 / r.seconds / 1e9
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// GB/s of copying `len` bytes into freshly allocated memory (the
/// allocation and its page faults timed too), median of `rounds`
/// copies of at least 256 MiB each.
fn memcpy_fresh(len: usize, rounds: usize) -> f64 {
    let src = vec![0x5Au8; len];
    let copies = (256usize << 20).div_ceil(len).max(1);
    let mut samples = Vec::new();
    for _ in 0..rounds.max(3) {
        let start = Instant::now();
        let mut kept = Vec::with_capacity(copies);
        for _ in 0..copies {
            kept.push(std::hint::black_box(src.clone()));
        }
        let t = start.elapsed().as_secs_f64();
        samples.push((copies * len) as f64 / t / 1e9);
    }
    median(&samples)
}

/// Produce then consume over one transport, `rounds` times (a fresh
/// server each time).
fn measure(args: &BenchArgs, name: &str) -> anyhow::Result<Row> {
    let mut row = Row {
        name: name.to_string(),
        addr: String::new(),
        produce: Vec::new(),
        consume: Vec::new(),
        consumed: 0,
        produce_cpu: Vec::new(),
        consume_cpu: Vec::new(),
    };
    for _ in 0..args.rounds.max(1) {
        let (addr, p, c) = round(args, name)?;
        row.addr = addr;
        row.produce.push(gbs(&p));
        row.consume.push(gbs(&c));
        row.consumed += c.consumed.unwrap_or(0);
        row.produce_cpu.push((p.cpu, p.bytes));
        row.consume_cpu.push((c.cpu, c.bytes));
    }
    Ok(row)
}

/// One round: the server's address, the produce and the consume result.
fn round(args: &BenchArgs, name: &str) -> anyhow::Result<(String, engine::Result, engine::Result)> {
    let (listen, cma) = listen_of(name)?;
    let server = LocalServer::start(listen, cma)?;
    let group: serde_json::Value = serde_json::from_slice(&std::fs::read(&server.group_file)?)?;
    let addr = group["members"][0]["addr"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let topic = format!("bench-transport-{}", super::workload::now_us());
    let cpu = ServerCpu::Pids(vec![server.child.id()]);
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
        results.push(engine::run(&cfg, target.as_ref(), &cpu)?);
    }
    let consume = results
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no consume result"))?;
    let produce = results
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no produce result"))?;
    Ok((addr, produce, consume))
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
    let base = Baselines {
        warm: memcpy[memcpy.len() / 2],
        fresh: memcpy_fresh(args.data_size.max(1), args.rounds),
    };
    report(&args, &rows, &base);
    Ok(())
}

/// memcpy of one data part: between warm buffers, and into fresh memory.
struct Baselines {
    warm: f64,
    fresh: f64,
}

fn report(args: &BenchArgs, rows: &[Row], base: &Baselines) {
    let per = |r: &Row| {
        let (p, c) = (median(&r.produce), median(&r.consume));
        json!({
            "transport": r.name, "addr": r.addr,
            "produce_gb_per_s": p, "consume_gb_per_s": c,
            "produce_rounds": r.produce, "consume_rounds": r.consume,
            "produce_vs_memcpy": p / base.warm, "consume_vs_memcpy": c / base.warm,
            "produce_vs_memcpy_fresh": p / base.fresh,
            "consumed": r.consumed,
            "produce_cpu": cpu_json(&r.produce_cpu), "consume_cpu": cpu_json(&r.consume_cpu),
        })
    };
    if args.json {
        let out = json!({
            "mode": "transport", "events": args.events, "metadata_size": args.metadata_size,
            "data_size": args.data_size, "partition_type": "memory", "rounds": args.rounds,
            "memcpy_gb_per_s": base.warm, "memcpy_fresh_gb_per_s": base.fresh,
            "transports": rows.iter().map(per).collect::<Vec<_>>(),
        });
        println!("{out}");
        return;
    }
    println!(
        "{} events of {} B metadata + {} B data, memory partition, server in its own \
         process, median of {} rounds",
        args.events, args.metadata_size, args.data_size, args.rounds
    );
    println!(
        "memcpy of one data part ({} B): {:.2} GB/s between warm buffers, {:.2} GB/s into \
         fresh memory",
        args.data_size, base.warm, base.fresh
    );
    println!("CPU-s/GB: client plus server CPU seconds per GB moved, over every round");
    println!(
        "{:<11} {:>12} {:>8} {:>8} {:>8} {:>12} {:>8} {:>8}  address",
        "transport",
        "produce GB/s",
        "/memcpy",
        "/fresh",
        "CPU-s/GB",
        "consume GB/s",
        "/memcpy",
        "CPU-s/GB"
    );
    for r in rows {
        let (p, c) = (median(&r.produce), median(&r.consume));
        println!(
            "{:<11} {:>12.2} {:>7.0}% {:>7.0}% {:>8} {:>12.2} {:>7.0}% {:>8}  {}",
            r.name,
            p,
            100.0 * p / base.warm,
            100.0 * p / base.fresh,
            cpu_cell(&r.produce_cpu),
            c,
            100.0 * c / base.warm,
            cpu_cell(&r.consume_cpu),
            r.addr
        );
    }
}
