//! A blocked `pull` spins briefly before it sleeps (for latency), and only
//! briefly: an idle consumer does not burn a core.

use std::time::{Duration, Instant};

use strom_client::{ConsumerOptions, Driver, ErrorCode, Next, StartPos, TopicSpec};

/// CPU time this thread has used (user + system), from /proc.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    // Fields after the command name (which may hold spaces) start at ")".
    let rest = &stat[stat.rfind(')').expect("stat has a command") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz.max(1))
}

#[test]
fn an_idle_consumer_spins_only_briefly_and_then_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("idle", 1)).unwrap();
    let c = t
        .consumer_with(
            "c",
            ConsumerOptions {
                spin: Duration::from_millis(2),
                ..Default::default()
            },
        )
        .unwrap();
    let (cpu0, t0) = (thread_cpu(), Instant::now());
    for _ in 0..4 {
        match c.pull_timeout(Duration::from_millis(150)) {
            Err(e) if e.code() == ErrorCode::TIMEOUT => {}
            Err(e) => panic!("expected a timeout, got {e}"),
            Ok(_) => panic!("nothing was pushed"),
        }
    }
    let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
    assert!(
        wall >= Duration::from_millis(590),
        "the pulls waited ({wall:?})"
    );
    assert!(
        cpu < Duration::from_millis(150),
        "waiting {wall:?} used {cpu:?} of CPU: the consumer kept spinning"
    );
}

#[test]
fn with_or_without_a_spin_every_event_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("s", 1)).unwrap();
    let p = t.producer().unwrap();
    for i in 0..100 {
        p.push(format!("{{\"i\": {i}}}"), vec![i as u8; 10])
            .unwrap();
    }
    p.close().unwrap();
    for (name, spin) in [("zero", Duration::ZERO), ("long", Duration::from_millis(5))] {
        let opts = ConsumerOptions {
            spin,
            start: StartPos::Beginning,
            ..Default::default()
        };
        let c = t.consumer_with(name, opts).unwrap();
        let mut n = 0u8;
        while let Next::Event(e) = c.pull_timeout(Duration::from_secs(10)).unwrap() {
            assert_eq!(e.data_vec(), vec![n; 10]);
            n += 1;
        }
        assert_eq!(n, 100, "spin {spin:?}");
    }
}
