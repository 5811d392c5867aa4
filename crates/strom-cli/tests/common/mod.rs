//! Helpers shared by the process-level tests: a real `strom server` child
//! process on a temporary data directory and port 0, the `strom` CLI with a
//! bounded run time, and readers that drain a topic through the client.

#![allow(dead_code)]

pub mod audit;
pub mod auth;
pub mod certs;
pub mod cluster;
pub mod faults;
pub mod forger;
pub mod http;
pub mod kafka;
pub mod kafka_raw;
pub mod pg;
pub mod procs;
pub mod raw;
pub mod replicated;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strom_client::{ConsumerOptions, Driver, Next, StartPos};

/// How long a server may take to write its group file.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

pub fn strom_bin() -> &'static str {
    env!("CARGO_BIN_EXE_strom")
}

/// A `strom server` child process. Its data directory and group file live
/// under a directory the test owns, so a restart on the same directory sees
/// the same data. The child is killed when this is dropped.
pub struct ServerProcess {
    pub data_dir: PathBuf,
    pub group_file: PathBuf,
    /// `host:port` of the master, as written in the group file.
    pub addr: String,
    child: Child,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

/// A `strom server` joined to another server's group; killed when dropped.
pub struct JoinedMember(pub Child);

impl Drop for JoinedMember {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ServerProcess {
    /// Starts a server that joins this one's group, listening on a free
    /// port with its data in `data_dir`, plus `extra` arguments; its stderr
    /// goes to `stderr`.
    pub fn join_member(&self, data_dir: &Path, extra: &[&str], stderr: Stdio) -> JoinedMember {
        let child = Command::new(strom_bin())
            .args(["server", "--listen", "127.0.0.1:0"])
            .args(extra)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--join")
            .arg(&self.group_file)
            .env_remove("STROM_GROUP_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawning the member");
        JoinedMember(child)
    }

    /// Starts a server with its data in `base/data` and its group file at
    /// `base/group.json`, and waits (bounded) until the group file names it.
    pub fn start(base: &Path) -> ServerProcess {
        Self::start_with(base, &[])
    }

    /// [`ServerProcess::start`] with `config` (TOML) as its config file,
    /// written to `base/server.toml`.
    #[allow(dead_code)] // not every test binary uses it
    pub fn start_with_config(base: &Path, config: &str) -> ServerProcess {
        let file = base.join("server.toml");
        std::fs::write(&file, config).expect("writing the server's config file");
        Self::start_with(base, &["--config", file.to_str().expect("utf-8 path")])
    }

    /// [`ServerProcess::start`] with extra `strom server` arguments.
    pub fn start_with(base: &Path, extra: &[&str]) -> ServerProcess {
        Self::start_with_env(base, extra, &[])
    }

    /// [`ServerProcess::start_with`] with extra environment variables.
    pub fn start_with_env(base: &Path, extra: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        Self::spawn(base, "127.0.0.1:0", extra, env, None)
    }

    /// [`ServerProcess::start_with`] in a process whose file-descriptor
    /// limit (RLIMIT_NOFILE, soft and hard) is `nofile`, as `ulimit -n`.
    pub fn start_with_nofile(base: &Path, extra: &[&str], nofile: u64) -> ServerProcess {
        Self::spawn(base, "127.0.0.1:0", extra, &[], Some(nofile))
    }

    /// [`ServerProcess::start_with`] listening on `listen` (a URL such as
    /// `tls://127.0.0.1:0`) instead of loopback TCP.
    #[allow(dead_code)] // not every test binary uses it
    pub fn start_on(
        base: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServerProcess {
        Self::spawn(base, listen, extra, env, None)
    }

    /// Starts the server of `base` again on the address it had (`addr`,
    /// `host:port`), as an operator restarts a master its members and
    /// clients know.
    pub fn restart_on(base: &Path, addr: &str) -> ServerProcess {
        Self::spawn(base, addr, &[], &[], None)
    }

    fn spawn(
        base: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> ServerProcess {
        let data_dir = base.join("data");
        let group_file = base.join("group.json");
        // A restart writes a new file; removing the old one first means the
        // file's presence tells that this process is listening.
        match std::fs::remove_file(&group_file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot remove old group file {}: {e}", group_file.display()),
        }
        let mut cmd = Command::new(strom_bin());
        cmd.arg("server")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--listen")
            .arg(listen)
            .arg("--group-file")
            .arg(&group_file)
            .args(extra)
            .env_remove("STROM_LOG")
            .env_remove("STROM_GROUP_FILE")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: n as libc::rlim_t,
                rlim_max: n as libc::rlim_t,
            };
            // SAFETY: setrlimit(2) is async-signal-safe, and `lim` is a
            // plain value copied into the closure.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd.spawn().expect("spawning strom server");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr is piped");
        let sink = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut server = ServerProcess {
            data_dir,
            group_file,
            addr: String::new(),
            child,
            stderr,
            stderr_thread: Some(stderr_thread),
        };
        server.addr = server.wait_for_group_file();
        server
    }

    fn wait_for_group_file(&mut self) -> String {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the server") {
                panic!(
                    "strom server exited with {status} before writing its group file; stderr:\n{}",
                    self.stderr()
                );
            }
            if let Ok(text) = std::fs::read(&self.group_file) {
                let v: serde_json::Value =
                    serde_json::from_slice(&text).expect("the group file is valid JSON");
                let master = v["master"].as_u64().expect("group file names a master");
                let addr = v["members"]
                    .as_array()
                    .expect("group file lists members")
                    .iter()
                    .find(|m| m["id"].as_u64() == Some(master))
                    .and_then(|m| m["addr"].as_str())
                    .expect("group file has the master's address")
                    .to_string();
                return addr;
            }
            assert!(
                Instant::now() < deadline,
                "strom server wrote no group file within {START_TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Runs `strom --group-file <this server's group file> ARGS`.
    pub fn cli(&self, args: &[&str], stdin: &str, timeout: Duration) -> CliOutput {
        let gf = self.group_file.to_str().expect("utf-8 path");
        let mut full = vec!["--group-file", gf];
        full.extend_from_slice(args);
        run_cli(&full, stdin, &[], timeout)
    }

    /// The server's resident set size in bytes (VmRSS).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("reading /proc/PID/status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kb * 1024
    }

    /// Everything the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The rest of the first stderr line starting with `prefix`, waiting
    /// up to 10 s for it: a server prints its HTTP and Kafka addresses
    /// after it wrote its group file, which is all `start` waits for.
    #[allow(dead_code)] // not every test binary uses it
    pub fn printed(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let err = self.stderr();
            if let Some(rest) = err.lines().find_map(|l| l.strip_prefix(prefix)) {
                return rest.trim().to_string();
            }
            assert!(
                Instant::now() < deadline,
                "nothing printed starting with {prefix:?}; stderr:\n{err}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn connect(&self) -> Driver {
        Driver::connect(&self.group_file).expect("connecting to the server")
    }

    /// True while the process runs.
    pub fn is_alive(&mut self) -> bool {
        self.child.try_wait().expect("polling the server").is_none()
    }

    /// SIGKILL, then reap.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reaping the server");
    }

    /// SIGTERM, then wait (bounded) for the exit status.
    pub fn terminate(mut self, timeout: Duration) -> (ExitStatus, String) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM) failed");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the server") {
                if let Some(t) = self.stderr_thread.take() {
                    let _ = t.join();
                }
                return (status, self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "strom server did not exit within {timeout:?} of SIGTERM; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to `timeout` for `child` to exit; on timeout kills and reaps it
/// and returns `None`.
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("polling strom") {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asserts that a CLI run succeeded, showing its output if not.
pub fn ok(out: CliOutput, what: &str) -> CliOutput {
    assert!(
        out.status.success(),
        "{what} failed with {}; stdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

/// Output of one CLI run.
pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().filter(|l| !l.is_empty()).collect()
    }
}

/// Runs `strom ARGS` with `stdin` and extra environment, killing it if it
/// takes longer than `timeout`.
pub fn run_cli(args: &[&str], stdin: &str, env: &[(&str, &str)], timeout: Duration) -> CliOutput {
    let mut cmd = Command::new(strom_bin());
    cmd.args(args)
        .env_remove("STROM_LOG")
        .env_remove("STROM_GROUP_FILE")
        .env_remove("STROM_ADDRESS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawning strom");
    let mut input = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout is piped")));
    let err = reader(Box::new(child.stderr.take().expect("stderr is piped")));
    let Some(status) = wait_bounded(&mut child, timeout) else {
        panic!(
            "`strom {}` did not finish within {timeout:?}; stderr:\n{}",
            args.join(" "),
            err.join().unwrap_or_default()
        );
    };
    let _ = writer.join();
    CliOutput {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// One consumed event: raw metadata and the whole data part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub meta: Vec<u8>,
    pub data: Vec<u8>,
}

/// What a consumer read: events by `(partition, offset)`, and per partition
/// the offset reading started at and the end it read up to.
pub struct ReadResult {
    pub events: BTreeMap<(u32, u64), Stored>,
    pub start: BTreeMap<u32, u64>,
    pub end: BTreeMap<u32, u64>,
}

impl ReadResult {
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// Reads every partition of `topic` from the beginning under consumer
/// `name`, up to the next offsets the server reports now.
pub fn read_all(driver: &Driver, topic: &str, name: &str, timeout: Duration) -> ReadResult {
    read_from(driver, topic, name, StartPos::Beginning, timeout)
}

/// Reads every partition of `topic` from `start` (`Beginning` or
/// `Committed`) under consumer `name`, up to the next offsets the server
/// reports now. Asserts that offsets come dense and in order per partition,
/// starting where they should, and that nothing comes past the end.
/// Bounded by `timeout`.
pub fn read_from(
    driver: &Driver,
    topic: &str,
    name: &str,
    start: StartPos,
    timeout: Duration,
) -> ReadResult {
    let t = driver.open_topic(topic).expect("opening the topic");
    let info = t.describe().expect("describing the topic");
    let mut begin = BTreeMap::new();
    let mut end = BTreeMap::new();
    for p in &info.partitions {
        let from = match start {
            StartPos::Beginning => p.first_offset,
            StartPos::Committed => driver
                .consumer_offsets(topic, p.id)
                .expect("reading committed offsets")
                .into_iter()
                .find(|(n, _)| n == name)
                .map_or(p.first_offset, |(_, o)| o.max(p.first_offset)),
            _ => panic!("read_from supports Beginning and Committed"),
        };
        begin.insert(p.id, from);
        end.insert(p.id, p.next_offset);
    }
    let consumer = t
        .consumer_with(
            name,
            ConsumerOptions {
                start,
                ..Default::default()
            },
        )
        .expect("creating a consumer");
    let mut next = begin.clone();
    let mut events = BTreeMap::new();
    let done = |next: &BTreeMap<u32, u64>| next.iter().all(|(p, n)| *n >= end[p]);
    let deadline = Instant::now() + timeout;
    while !done(&next) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "reading {topic} did not reach the end within {timeout:?}: at {next:?}, want {end:?}"
        );
        match consumer.pull_timeout(left) {
            Ok(Next::Event(ev)) => {
                let due = next.get_mut(&ev.partition).expect("a known partition");
                assert_eq!(
                    ev.offset, *due,
                    "partition {} delivered offset {} where {due} was due",
                    ev.partition, ev.offset
                );
                *due += 1;
                assert_eq!(ev.data_size(), ev.fetched_len(), "whole data fetched");
                events.insert(
                    (ev.partition, ev.offset),
                    Stored {
                        meta: ev.raw().to_vec(),
                        data: ev.data_vec(),
                    },
                );
            }
            Ok(Next::EndOfStream) => break,
            Err(e) if e.code() == strom_client::ErrorCode::TIMEOUT => continue,
            Err(e) => panic!("consuming {topic} failed: {e}"),
        }
    }
    assert!(
        done(&next),
        "stream of {topic} ended early: at {next:?}, want {end:?}"
    );
    if let Ok(Next::Event(ev)) = consumer.pull_timeout(Duration::from_millis(200)) {
        panic!(
            "event {}/{} beyond the end the server reported ({end:?})",
            ev.partition, ev.offset
        );
    }
    ReadResult {
        events,
        start: begin,
        end,
    }
}

/// Waits (up to 30 s, polling) until `ok` holds; panics naming `what`.
pub fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The member id a server that joined a group was given (its data dir's
/// `member-id`), once it has one.
pub fn member_id(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("member-id"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How many members the master reports alive (0 if it cannot be asked).
pub fn live_members(d: &Driver) -> usize {
    d.members()
        .map(|m| m.iter().filter(|m| m.alive).count())
        .unwrap_or(0)
}

/// A small deterministic PRNG (xorshift64*), so failures can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn from_time() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let seed = nanos ^ ((std::process::id() as u64) << 32);
        eprintln!("rng seed {seed}");
        Rng::new(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Event `i`'s metadata and data part: distinct per event, with sizes from
/// 0 to about 100 KiB.
pub fn event_payload(tag: &str, i: u64) -> (Vec<u8>, Vec<u8>) {
    let size = match i % 10 {
        0 => 0,
        1 => 1,
        2 => 100 * 1024 + (i as usize % 7),
        3 => 4096,
        4 => 65_537,
        _ => (i as usize * 37) % 2000,
    };
    // Larger payloads are rarer so a run stays quick.
    let size = if size > 4096 && i % 20 >= 10 {
        size / 64
    } else {
        size
    };
    let meta = format!("{{\"tag\":\"{tag}\",\"i\":{i},\"size\":{size}}}").into_bytes();
    let data = Rng::new(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xABCD).bytes(size);
    (meta, data)
}
