//! `strom cluster up` groups for the process-level tests: start one in a
//! temp dir, find a member's pid by its address, stop it, and kill every
//! member when the test ends.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::procs::CLI_TIMEOUT;
use super::{ok, run_cli, strom_bin, CliOutput, JoinedMember};

/// `strom cluster up` in `dir`: the group file, and the pid and address of
/// each rank (from its log).
pub struct Cluster {
    pub dir: std::path::PathBuf,
    pub group_file: String,
    pub pids: Vec<i32>,
}

pub fn cluster_up(dir: &Path, servers: u32) -> Cluster {
    cluster_up_with(dir, servers, &[])
}

/// [`cluster_up`] with more arguments for `cluster up`.
pub fn cluster_up_with(dir: &Path, servers: u32, more: &[&str]) -> Cluster {
    let d = dir.to_str().expect("utf-8");
    let n = servers.to_string();
    let mut args = vec!["cluster", "up", "--servers", &n, "--data-dir", d];
    args.extend_from_slice(more);
    let out = ok(run_cli(&args, "", &[], CLI_TIMEOUT), "cluster up");
    let group_file = out.stdout.trim().to_string();
    let rec: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).expect("cluster.json"))
            .expect("cluster.json is JSON");
    let pids = rec["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .map(|p| p.as_i64().expect("pid") as i32)
        .collect();
    Cluster {
        dir: dir.to_path_buf(),
        group_file,
        pids,
    }
}

impl Cluster {
    /// The pid of the member listening on `addr` (from the members' logs).
    pub fn pid_of(&self, addr: &str) -> i32 {
        let deadline = Instant::now() + CLI_TIMEOUT;
        loop {
            for (rank, pid) in self.pids.iter().enumerate() {
                let log = std::fs::read_to_string(self.dir.join(format!("server-{rank}.log")))
                    .unwrap_or_default();
                if log.contains(&format!("listening on {addr}")) {
                    return *pid;
                }
            }
            assert!(Instant::now() < deadline, "no member log names {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills rank `rank` with SIGKILL (its pid from `up`, or `pid`) and
    /// waits until it is gone.
    pub fn kill(&self, pid: i32) {
        // SAFETY: kill(2) on a server this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        while running(pid) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts rank `rank` again as docs/operations.md says: `strom server
    /// --join GROUP_FILE --data-dir DIR/rank-N`, on a free port; its log
    /// is `DIR/restart-N.log`.
    pub fn restart(&self, rank: usize) -> JoinedMember {
        let log = std::fs::File::create(self.dir.join(format!("restart-{rank}.log")))
            .expect("creating the restart log");
        let child = std::process::Command::new(strom_bin())
            .args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--join",
                &self.group_file,
            ])
            .arg("--data-dir")
            .arg(self.dir.join(format!("rank-{rank}")))
            .env_remove("STROM_GROUP_FILE")
            .env_remove("STROM_RANK")
            .env_remove("STROM_SIZE")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning the member");
        JoinedMember(child)
    }

    /// The last lines of every member's log (`server-N.log`,
    /// `restart-N.log`), for a failure's message.
    pub fn logs(&self) -> String {
        let mut names: Vec<_> = std::fs::read_dir(&self.dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "log"));
        names.sort();
        let mut out = String::new();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            out += &format!("==> {} <==\n{}\n", p.display(), tail.join("\n"));
        }
        out
    }

    pub fn down(&self) -> CliOutput {
        run_cli(
            &[
                "cluster",
                "down",
                "--data-dir",
                self.dir.to_str().expect("utf-8"),
            ],
            "",
            &[],
            CLI_TIMEOUT,
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: kill(2) on a pid this test started; no memory involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A live process, not a zombie waiting for its parent.
pub fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
