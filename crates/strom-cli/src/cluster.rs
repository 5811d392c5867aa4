//! `strom cluster up|down`: a local launcher for laptops and tests. `up`
//! starts N server processes as ranks 0..N of one group (the same path as
//! mpirun/srun, through STROM_RANK/STROM_SIZE), waits for the group file,
//! and records the processes in `DIR/cluster.json` for `down`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;

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
    },
    /// Stop the group started by `up` on this data directory.
    Down {
        #[arg(long)]
        data_dir: PathBuf,
    },
}

struct ClusterFile {
    pids: Vec<u32>,
    group_file: PathBuf,
}

impl ClusterFile {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "pids": self.pids, "group_file": self.group_file })
    }

    fn from_json(v: &serde_json::Value) -> Option<Self> {
        let pids = v["pids"]
            .as_array()?
            .iter()
            .map(|p| p.as_u64().and_then(|p| u32::try_from(p).ok()))
            .collect::<Option<Vec<u32>>>()?;
        Some(ClusterFile {
            pids,
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
        } => up(servers, &data_dir, &listen, group_file),
        ClusterCmd::Down { data_dir } => down(&data_dir),
    }
}

fn up(servers: u32, dir: &Path, listen: &str, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    anyhow::ensure!(servers >= 1, "--servers must be at least 1");
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
    let exe = std::env::current_exe().context("finding the strom executable")?;
    let mut pids = Vec::new();
    for rank in 0..servers {
        let log = std::fs::File::create(dir.join(format!("server-{rank}.log")))?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["server", "--listen", listen])
            .arg("--data-dir")
            .arg(&dir)
            .arg("--group-file")
            .arg(&group)
            .env("STROM_RANK", rank.to_string())
            .env("STROM_SIZE", servers.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().context("starting a server process")?;
        pids.push(child.id());
    }
    let file = ClusterFile {
        pids,
        group_file: group.clone(),
    };
    std::fs::write(&record, serde_json::to_vec_pretty(&file.to_json())?)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !group.exists() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the group did not form within 30 s; see {}/server-*.log",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("cluster of {servers} servers is up; group file:");
    println!("{}", group.display());
    Ok(())
}

fn signal(pid: u32, sig: &str) -> bool {
    std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn down(dir: &Path) -> anyhow::Result<()> {
    let record = dir.join("cluster.json");
    let text = std::fs::read(&record)
        .with_context(|| format!("no cluster recorded in {}", record.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).context("cluster.json is not valid JSON")?;
    let file = ClusterFile::from_json(&v).context("cluster.json lacks pids or group_file")?;
    for &pid in &file.pids {
        signal(pid, "-TERM");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for &pid in &file.pids {
        while signal(pid, "-0") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if signal(pid, "-0") {
            eprintln!("server {pid} did not stop in time; killing it");
            signal(pid, "-KILL");
        }
    }
    std::fs::remove_file(&record)?;
    let _ = std::fs::remove_file(&file.group_file);
    let _ = std::fs::remove_file(strom_server::rendezvous_file(&file.group_file));
    eprintln!("cluster stopped ({} servers)", file.pids.len());
    Ok(())
}
