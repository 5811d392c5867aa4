//! CPU seconds a benchmark run costs, client plus server, per GB moved.
//!
//! The client side is `getrusage(RUSAGE_SELF)` of the bench process (every
//! worker thread, live or ended) over the measured phase, plus, with
//! `--procs`, what each worker process reports of its own over the span it
//! times. The server side is utime + stime of `/proc/PID/stat` of each
//! local server process at the start and end of the phase. When the server
//! is embedded in the bench process, one process holds both sides: with
//! thread workers the client figure is the total (`in-process`), with
//! `--procs` the bench process's own CPU is the server's (`bench-process`).
//! Nothing is counted twice, and a server this process cannot see is
//! reported as unknown rather than as zero.

use serde_json::Value;

/// Where the server of a run runs, as far as its CPU is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerCpu {
    /// In this process (the embedded server).
    InProcess,
    /// Separate local processes (a group's members, a Kafka JVM, a
    /// redis-server) whose `/proc/PID/stat` this process can read.
    Pids(Vec<u32>),
    /// Not local, or not visible from here.
    Unknown,
}

impl ServerCpu {
    /// From the server pids a target found (empty: unknown).
    pub fn of(pids: Vec<u32>) -> ServerCpu {
        if pids.is_empty() {
            ServerCpu::Unknown
        } else if pids.contains(&std::process::id()) {
            ServerCpu::InProcess
        } else {
            ServerCpu::Pids(pids)
        }
    }

    /// The CPU used so far, at the start or end of a phase.
    pub fn mark(&self) -> Mark {
        let server = match self {
            ServerCpu::Pids(pids) => pids.iter().map(|&p| proc_cpu_s(p)).sum(),
            _ => None,
        };
        Mark {
            own: self_cpu_s(),
            server,
        }
    }

    /// What a phase cost from `start` to now. `children_s`: the worker
    /// processes' own CPU over their timed spans (`--procs`), `None` when
    /// the workers were threads of this process.
    pub fn since(&self, start: &Mark, children_s: Option<f64>) -> CpuUse {
        let end = self.mark();
        let own = (end.own - start.own).max(0.0);
        let (client_s, server_s, source) = match (self, children_s) {
            (ServerCpu::InProcess, None) => (own, None, Source::InProcess),
            (ServerCpu::InProcess, Some(c)) => (c, Some(own), Source::BenchProcess),
            (ServerCpu::Pids(_), c) => match (start.server, end.server) {
                (Some(a), Some(b)) => (own + c.unwrap_or(0.0), Some(b - a), Source::ProcStat),
                // A server that exited (or turned unreadable) mid-run.
                _ => (own + c.unwrap_or(0.0), None, Source::Unknown),
            },
            (ServerCpu::Unknown, c) => (own + c.unwrap_or(0.0), None, Source::Unknown),
        };
        let pids = match (self, source) {
            (ServerCpu::Pids(p), Source::ProcStat) => p.clone(),
            _ => Vec::new(),
        };
        CpuUse {
            client_s,
            server_s: server_s.map(|s| s.max(0.0)),
            source,
            pids,
        }
    }
}

/// CPU seconds used so far by this process and by the server processes.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    own: f64,
    server: Option<f64>,
}

/// How the server's CPU was found (JSON `server_cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Source {
    /// `/proc/PID/stat` of the server processes.
    ProcStat,
    /// The server is embedded beside thread workers: the client figure is
    /// both.
    InProcess,
    /// The server is embedded in the bench process, the workers are child
    /// processes: the bench process's CPU is the server's (and the idle
    /// coordinator's).
    BenchProcess,
    /// No local server process visible from here.
    #[default]
    Unknown,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::ProcStat => "proc-stat",
            Source::InProcess => "in-process",
            Source::BenchProcess => "bench-process",
            Source::Unknown => "unknown",
        }
    }
}

/// CPU seconds one measured phase (or several, summed) cost.
#[derive(Clone, Debug, Default)]
pub struct CpuUse {
    pub client_s: f64,
    /// `None` when unknown, or when it is inside `client_s` (in-process).
    pub server_s: Option<f64>,
    pub source: Source,
    /// The server processes read (`proc-stat` only).
    pub pids: Vec<u32>,
}

impl CpuUse {
    /// Client plus server, when both are known.
    pub fn total_s(&self) -> Option<f64> {
        match self.source {
            Source::InProcess => Some(self.client_s),
            _ => self.server_s.map(|s| self.client_s + s),
        }
    }

    /// Client plus server CPU seconds per 10^9 bytes moved.
    pub fn per_gb(&self, bytes: u64) -> Option<f64> {
        let total = self.total_s()?;
        (bytes > 0).then(|| total / (bytes as f64 / 1e9))
    }

    /// Several phases summed (the rounds of `bench transport`); the server
    /// figure stays known only if every phase measured it the same way.
    pub fn sum<'a>(phases: impl IntoIterator<Item = &'a CpuUse>) -> CpuUse {
        let mut phases = phases.into_iter();
        let Some(mut acc) = phases.next().cloned() else {
            return CpuUse::default();
        };
        for p in phases {
            acc.client_s += p.client_s;
            if acc.source == p.source {
                acc.server_s = acc.server_s.zip(p.server_s).map(|(a, b)| a + b);
                for pid in &p.pids {
                    if !acc.pids.contains(pid) {
                        acc.pids.push(*pid);
                    }
                }
            } else {
                acc.server_s = None;
                acc.source = Source::Unknown;
                acc.pids.clear();
            }
        }
        acc
    }

    /// `client_cpu_s`, `server_cpu_s` (absent when unknown or in-process),
    /// `cpu_s_per_gb` (absent when the server's is unknown), `server_cpu`
    /// and `server_cpu_pids` into a report.
    pub fn write_json(&self, bytes: u64, out: &mut Value) {
        out["client_cpu_s"] = self.client_s.into();
        if let Some(s) = self.server_s {
            out["server_cpu_s"] = s.into();
        }
        if let Some(g) = self.per_gb(bytes) {
            out["cpu_s_per_gb"] = g.into();
        }
        out["server_cpu"] = self.source.name().into();
        if !self.pids.is_empty() {
            out["server_cpu_pids"] = self.pids.clone().into();
        }
    }

    /// The human summary's line.
    pub fn line(&self, bytes: u64) -> String {
        let per_gb = |total: Option<f64>| match (total, bytes) {
            (Some(t), b) if b > 0 => format!("{:.2}", t / (b as f64 / 1e9)),
            _ => "-".to_string(),
        };
        let c = self.client_s;
        match (self.source, self.server_s) {
            (Source::InProcess, _) => format!(
                "CPU: client and embedded server {c:.2} s (one process) = {} CPU-s per GB",
                per_gb(self.total_s())
            ),
            (Source::BenchProcess, Some(s)) => format!(
                "CPU: client {c:.2} s (worker processes), server {s:.2} s (embedded in the \
                 bench process) = {} CPU-s per GB",
                per_gb(self.total_s())
            ),
            (_, Some(s)) => format!(
                "CPU: client {c:.2} s, server {s:.2} s = {} CPU-s per GB",
                per_gb(self.total_s())
            ),
            (_, None) => format!(
                "CPU: client {c:.2} s, server unknown (no local server process readable) = {} \
                 client CPU-s per GB",
                per_gb(Some(c))
            ),
        }
    }
}

/// User + system CPU seconds of this process so far, every thread (ended
/// ones included).
pub fn self_cpu_s() -> f64 {
    // SAFETY: getrusage(2) fills the zeroed struct we own; no pointer kept.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds of process `pid` so far (all its threads),
/// from `/proc/PID/stat`; `None` when it is gone or unreadable.
pub fn proc_cpu_s(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (utime, stime) = stat_cpu_ticks(&text)?;
    // SAFETY: sysconf(3) has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| (utime + stime) as f64 / hz as f64)
}

/// utime and stime (fields 14 and 15, clock ticks) of a `/proc/PID/stat`
/// line. The command name (field 2) sits in parentheses and may itself hold
/// spaces and parentheses, so the fields are counted after the last `)`.
pub fn stat_cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first, so 14 and 15 are the
    // 12th and 13th.
    let mut f = after.split_ascii_whitespace().skip(11);
    let utime = f.next()?.parse().ok()?;
    let stime = f.next()?.parse().ok()?;
    Some((utime, stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (a) (b c)) x) S 1 4242 4242 0 -1 4194560 1234 0 5 0 \
                    731 269 0 0 20 0 9 0 123456 1000000 250 18446744073709551615\n";
        assert_eq!(stat_cpu_ticks(line), Some((731, 269)));
    }

    #[test]
    fn stat_of_a_plain_name_and_of_this_process_parse() {
        let line = "7 (strom) R 1 7 7 0 -1 0 0 0 0 0 12 34 0 0 20 0 1 0 99 0 0";
        assert_eq!(stat_cpu_ticks(line), Some((12, 34)));
        assert!(proc_cpu_s(std::process::id()).is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn truncated_or_garbled_stat_is_none() {
        assert_eq!(stat_cpu_ticks(""), None);
        assert_eq!(stat_cpu_ticks("12 (no close paren S 1 2 3"), None);
        assert_eq!(stat_cpu_ticks("12 (x) S 1 2 3 4 5 6 7 8 9 10"), None);
        assert_eq!(stat_cpu_ticks("12 (x) S 1 2 3 4 5 6 7 8 9 10 -1 2"), None);
    }

    #[test]
    fn in_process_server_is_counted_once() {
        let u = CpuUse {
            client_s: 2.0,
            server_s: None,
            source: Source::InProcess,
            pids: Vec::new(),
        };
        assert_eq!(u.per_gb(1_000_000_000), Some(2.0));
        let mut v = Value::Object(Default::default());
        u.write_json(500_000_000, &mut v);
        assert_eq!(v["cpu_s_per_gb"].as_f64(), Some(4.0));
        assert!(v.get("server_cpu_s").is_none(), "{v}");
        assert_eq!(v["server_cpu"], "in-process");
    }

    #[test]
    fn unknown_server_gives_no_total() {
        let u = CpuUse {
            client_s: 1.0,
            ..Default::default()
        };
        let mut v = Value::Object(Default::default());
        u.write_json(1_000_000_000, &mut v);
        assert!(v.get("cpu_s_per_gb").is_none(), "{v}");
        assert_eq!(v["server_cpu"], "unknown");
    }

    #[test]
    fn separate_server_adds_both_sides() {
        let round = CpuUse {
            client_s: 1.0,
            server_s: Some(0.5),
            source: Source::ProcStat,
            pids: vec![7],
        };
        let u = CpuUse::sum([&round, &round]);
        assert_eq!(u.total_s(), Some(3.0));
        assert_eq!(u.per_gb(2_000_000_000), Some(1.5));
        assert_eq!(u.pids, [7]);
        let unknown = CpuUse {
            client_s: 1.0,
            ..Default::default()
        };
        assert_eq!(CpuUse::sum([&round, &unknown]).total_s(), None);
    }
}
