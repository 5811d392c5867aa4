//! The progress thread parks when idle. A test binary of its own, so no
//! other test's busy endpoints run in the process while it measures.

use strom_ofi::{Endpoint, EndpointConfig, ProviderSpec};

fn open(provider: &str) -> (Endpoint, ()) {
    let cfg = EndpointConfig::new(ProviderSpec::new(provider));
    let ep = Endpoint::open(&cfg, Box::new(|_: &[u8]| {}))
        .unwrap_or_else(|e| panic!("provider {provider} must be available here: {e}"));
    (ep, ())
}

/// CPU ticks (user + system) of this process's threads named `name`.
fn thread_ticks(name: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.trim().starts_with(name) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the ")" that ends the command: utime is the 12th, stime the 13th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        total += f.get(10).unwrap_or(&0) + f.get(11).unwrap_or(&0);
    }
    total
}

#[test]
fn an_idle_progress_thread_does_not_burn_a_core() {
    let (_a, _in) = open("tcp;ofi_rxm");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = thread_ticks("strom-ofi-progr");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = thread_ticks("strom-ofi-progr") - before;
    // Ticks are 10 ms: a busy thread would use about 200 in 2 s (more
    // with other tests' progress threads counted too).
    assert!(used < 40, "progress threads used {used} ticks in 2 s");
}
