//! `strom cluster up|down`: a local launcher for laptops and tests. `up`
//! starts N server processes as ranks 0..N of one group (the same path as
//! mpirun/srun, through STROM_RANK/STROM_SIZE), waits for the group file,
//! and records the processes in `DIR/cluster.json` for `down`. The ranks
//! share the group's cluster secret through `<group file>.secret` (0600).
//!
//! With three servers or more, `up` starts a metadata quorum of three
//! voters by default (`--meta-voters`), so the group keeps its registry
//! when any one member dies, member 0 included; options after `--` go to
//! every `strom server`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::launch_auth::{user_name, write_token};
use anyhow::Context;
use clap::Subcommand;
use strom_server::member_auth::{self, ClusterSecret};

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start N server processes forming one group.
    Up {
        #[arg(long, default_value_t = 3)]
        servers: u32,
        /// Parent data directory; member i keeps its data in DIR/rank-i.
        #[arg(long)]
        data_dir: PathBuf,
        /// Address each member binds (port 0 picks free ports).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Members that keep the topic registry with Raft: 1, 3 or 5.
        /// Default: 3 with three servers or more (the group then survives
        /// the death of any one member, member 0 included), else 1.
        #[arg(long, value_name = "N")]
        meta_voters: Option<u32>,
        /// Start the servers with --auth (docs/security.md) and write a
        /// token for you, a super user, to DIR/token (0600). On by itself
        /// when --listen is not a loopback address.
        #[arg(long)]
        auth: bool,
        /// Options passed to every `strom server`, after `--` (for example
        /// `-- --http-listen 127.0.0.1:0`).
        #[arg(last = true, value_name = "SERVER OPTIONS")]
        server_args: Vec<String>,
    },
    /// Stop the group started by `up` on this data directory.
    Down {
        #[arg(long)]
        data_dir: PathBuf,
        /// Seconds each member gets to exit after SIGTERM before SIGKILL.
        #[arg(long, default_value_t = 15.0)]
        timeout: f64,
    },
}

/// What `up` records for `down`: each member's pid and the kernel's start
/// time for it (so a pid reused by another process is never signalled).
struct ClusterFile {
    pids: Vec<u32>,
    start_times: Vec<Option<u64>>,
    data_dir: Option<PathBuf>,
    group_file: PathBuf,
}

impl ClusterFile {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "pids": self.pids,
            "start_times": self.start_times,
            "data_dir": self.data_dir,
            "group_file": self.group_file,
        })
    }

    fn from_json(v: &serde_json::Value) -> Option<Self> {
        let pids: Vec<u32> = v["pids"]
            .as_array()?
            .iter()
            .map(|p| p.as_u64().and_then(|p| u32::try_from(p).ok()))
            .collect::<Option<Vec<u32>>>()?;
        let start_times = (0..pids.len())
            .map(|i| v["start_times"].get(i).and_then(|t| t.as_u64()))
            .collect();
        Some(ClusterFile {
            pids,
            start_times,
            data_dir: v["data_dir"].as_str().map(PathBuf::from),
            group_file: PathBuf::from(v["group_file"].as_str()?),
        })
    }
}

pub fn run(cmd: ClusterCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::Up {
            servers,
            data_dir,
            listen,
            meta_voters,
            auth,
            server_args,
        } => {
            let launch = Launch {
                servers,
                meta_voters: voters(servers, meta_voters)?,
                auth: auth || !strom_server::local_only(&listen),
                listen,
                server_args,
            };
            up(&launch, &data_dir, group_file)
        }
        ClusterCmd::Down { data_dir, timeout } => down(&data_dir, Duration::from_secs_f64(timeout)),
    }
}

/// The group's cluster secret, written beside the group file (0600) for
/// every rank: the one its data dirs already hold (a group started again),
/// else a new one. Returns the file's path.
fn cluster_secret(dir: &Path, group: &Path) -> anyhow::Result<PathBuf> {
    let kept = [dir.join("rank-0"), dir.to_path_buf()]
        .into_iter()
        .map(|d| d.join(member_auth::SECRET_FILE))
        .find(|f| f.exists());
    let secret = match kept {
        Some(f) => ClusterSecret::read(&f)?,
        None => ClusterSecret::generate()?,
    };
    let file = member_auth::beside(group);
    secret.write(&file)?;
    Ok(file)
}

/// What `up` starts.
struct Launch {
    servers: u32,
    meta_voters: u32,
    /// Servers with --auth, and a token for the launching user.
    auth: bool,
    listen: String,
    server_args: Vec<String>,
}

/// The metadata voters of a group of `servers`: `asked`, checked, or the
/// default (3 from three servers on, else 1).
fn voters(servers: u32, asked: Option<u32>) -> anyhow::Result<u32> {
    anyhow::ensure!(servers >= 1, "--servers must be at least 1");
    let n = asked.unwrap_or(if servers >= 3 { 3 } else { 1 });
    anyhow::ensure!(
        [1, 3, 5].contains(&n),
        "--meta-voters must be 1, 3 or 5, not {n}"
    );
    anyhow::ensure!(
        n <= servers,
        "--meta-voters {n} needs at least {n} servers; --servers is {servers}"
    );
    Ok(n)
}

fn up(launch: &Launch, dir: &Path, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let servers = launch.servers;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let record = dir.join("cluster.json");
    anyhow::ensure!(
        !record.exists(),
        "a cluster already runs on {} (see {}); run `strom cluster down --data-dir {}` first",
        dir.display(),
        record.display(),
        dir.display()
    );
    let group = group_file.unwrap_or_else(|| dir.join("group.json"));
    let _ = std::fs::remove_file(&group);
    let _ = std::fs::remove_file(strom_server::rendezvous_file(&group));
    let secret = cluster_secret(&dir, &group)?;
    let user = user_name();
    let token = match launch.auth {
        true => {
            let path = dir.join("token");
            write_token(&path, &secret, &user)?;
            Some(path)
        }
        false => None,
    };
    let exe = std::env::current_exe().context("finding the strom executable")?;
    let mut pids = Vec::new();
    let mut start_times = Vec::new();
    for rank in 0..servers {
        let log = std::fs::File::create(dir.join(format!("server-{rank}.log")))?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["server", "--listen", &launch.listen])
            .arg("--meta-voters")
            .arg(launch.meta_voters.to_string())
            .args(&launch.server_args)
            .arg("--data-dir")
            .arg(&dir)
            .arg("--group-file")
            .arg(&group)
            .arg("--cluster-secret-file")
            .arg(&secret)
            .args(match launch.auth {
                true => vec![
                    "--auth".to_string(),
                    "--super-user".into(),
                    format!("User:{user}"),
                ],
                false => vec![],
            })
            .env("STROM_RANK", rank.to_string())
            .env("STROM_SIZE", servers.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().context("starting a server process")?;
        pids.push(child.id());
        start_times.push(proc_stat(child.id()).map(|s| s.start_time));
    }
    let file = ClusterFile {
        pids,
        start_times,
        data_dir: Some(dir.clone()),
        group_file: group.clone(),
    };
    std::fs::write(&record, serde_json::to_vec_pretty(&file.to_json())?)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !group.exists() {
        if let Some(rank) = file.pids.iter().position(|p| !running(*p)) {
            let log = dir.join(format!("server-{rank}.log"));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            anyhow::bail!(
                "rank {rank} exited before the group formed: {} (see {})",
                text.lines().last().unwrap_or("no output"),
                log.display()
            );
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the group did not form within 30 s; see {}/server-*.log",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    if launch.meta_voters > 1 {
        let t = token.as_ref().map(std::fs::read_to_string).transpose()?;
        wait_for_voters(&group, t, launch.meta_voters, deadline)
            .with_context(|| format!("see {}/server-*.log", dir.display()))?;
    }
    match launch.meta_voters {
        1 if servers >= 2 => eprintln!(
            "cluster of {servers} servers is up, the registry on member 0 alone (no metadata quorum: losing member 0 stops topic changes); group file:"
        ),
        1 => eprintln!("cluster of {servers} server is up; group file:"),
        v => eprintln!(
            "cluster of {servers} servers is up, the registry on a quorum of {v} voters (survives {} of them dying); group file:",
            (v - 1) / 2
        ),
    }
    if let Some(t) = &token {
        eprintln!(
            "authentication is on; your token (User:{user}, a super user) is in {}: export STROM_TOKEN_FILE={}",
            t.display(),
            t.display()
        );
    }
    println!("{}", group.display());
    Ok(())
}

/// Waits until the metadata quorum has its `voters` (the leader adds them
/// as members join, just after the group file appears), so that the group
/// survives a member's death once `up` returns.
fn voters_in(d: &strom_client::Driver) -> anyhow::Result<usize> {
    Ok(d.members()?
        .iter()
        .filter(|m| m.role == "leader" || m.role == "voter")
        .count())
}

fn wait_for_voters(
    group: &Path,
    token: Option<String>,
    voters: u32,
    deadline: Instant,
) -> anyhow::Result<()> {
    let token = token.map(|t| t.trim().to_string());
    let d = strom_client::Driver::connect_as(group, Default::default(), token)?;
    loop {
        let have = voters_in(&d)?;
        if have >= voters as usize {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the metadata quorum has {have} of its {voters} voters after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fields of `/proc/PID/stat` that `down` needs.
struct ProcStat {
    state: char,
    start_time: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        // Field 22 of stat(5); `fields` starts at field 3.
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Running: present and not a zombie waiting to be reaped.
fn running(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X'))
}

/// Why `pid` is not (or no longer) the member recorded, if it is not.
fn not_ours(pid: u32, start_time: Option<u64>, data_dir: Option<&Path>) -> Option<String> {
    let stat = proc_stat(pid)?;
    if start_time.is_some_and(|t| t != stat.start_time) {
        return Some("started after the member did (the pid was reused)".into());
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let is_server = args.get(1).is_some_and(|a| a == "server");
    let same_dir = data_dir.is_none_or(|d| {
        args.windows(2)
            .any(|w| w[0] == "--data-dir" && Path::new(&w[1]) == d)
    });
    if is_server && same_dir {
        None
    } else {
        Some(format!("runs `{}`", args.join(" ").trim()))
    }
}

fn kill(pid: u32, sig: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) with a pid checked to be our server; no memory involved.
    if unsafe { libc::kill(pid as i32, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Waits until none of `pids` runs or `deadline` passes; those still running.
fn wait_gone(pids: Vec<(usize, u32)>, deadline: Instant) -> Vec<(usize, u32)> {
    let mut left = pids;
    loop {
        left.retain(|(_, pid)| running(*pid));
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn down(dir: &Path, timeout: Duration) -> anyhow::Result<()> {
    let record = dir.join("cluster.json");
    let text = std::fs::read(&record)
        .with_context(|| format!("no cluster recorded in {}", record.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).context("cluster.json is not valid JSON")?;
    let file = ClusterFile::from_json(&v).context("cluster.json lacks pids or group_file")?;
    let mut signalled = Vec::new();
    let mut failed = 0;
    for (rank, &pid) in file.pids.iter().enumerate() {
        if !running(pid) {
            eprintln!("rank {rank} (pid {pid}) was not running");
            continue;
        }
        if let Some(why) = not_ours(pid, file.start_times[rank], file.data_dir.as_deref()) {
            eprintln!(
                "rank {rank}: pid {pid} is not this cluster's server any more ({why}); left alone"
            );
            continue;
        }
        match kill(pid, libc::SIGTERM) {
            Ok(()) => signalled.push((rank, pid)),
            Err(e) => {
                eprintln!("rank {rank} (pid {pid}): cannot send SIGTERM: {e}");
                failed += 1;
            }
        }
    }
    let stubborn = wait_gone(signalled.clone(), Instant::now() + timeout);
    for (rank, pid) in &signalled {
        if !stubborn.contains(&(*rank, *pid)) {
            eprintln!("stopped rank {rank} (pid {pid})");
        }
    }
    let mut killed = Vec::new();
    for (rank, pid) in stubborn {
        // Still the same process: it was ours a moment ago and never exited.
        match kill(pid, libc::SIGKILL) {
            Ok(()) => killed.push((rank, pid)),
            Err(e) => {
                eprintln!("rank {rank} (pid {pid}): cannot send SIGKILL: {e}");
                failed += 1;
            }
        }
    }
    let survivors = wait_gone(killed.clone(), Instant::now() + Duration::from_secs(5));
    for (rank, pid) in &killed {
        if survivors.contains(&(*rank, *pid)) {
            eprintln!("rank {rank} (pid {pid}) still runs after SIGKILL");
            failed += 1;
        } else {
            eprintln!(
                "killed rank {rank} (pid {pid}): it did not exit within {timeout:?} of SIGTERM"
            );
        }
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} member(s) could not be stopped; {} is kept so `down` can be retried",
            record.display()
        );
    }
    std::fs::remove_file(&record)?;
    let _ = std::fs::remove_file(&file.group_file);
    let _ = std::fs::remove_file(strom_server::rendezvous_file(&file.group_file));
    let _ = std::fs::remove_file(member_auth::beside(&file.group_file));
    eprintln!(
        "cluster stopped: {} stopped, {} killed, {} not running or not ours",
        signalled.len() - killed.len(),
        killed.len(),
        file.pids.len() - signalled.len()
    );
    Ok(())
}
