//! A blocked `pull` spins briefly before it sleeps (for latency), and only
//! briefly: an idle consumer does not burn a core.

use std::time::{Duration, Instant};

use strom_client::{
    default_spin, ConsumerOptions, Driver, ErrorCode, Next, StartPos, TopicSpec, DEFAULT_SPIN,
    LATENCY_SPIN, SPARE_CORES, SPIN_ENV,
};

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
    // The longest default spin (where cores are spare): long enough to
    // bridge the gaps of a steady stream, and still only one spin per pull
    // when nothing comes.
    let opts = ConsumerOptions {
        spin: LATENCY_SPIN,
        ..Default::default()
    };
    let c = t.consumer_with("c", opts).unwrap();
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

/// Busy-polling connections (server `busy_poll_us`, client
/// `Transports::with_busy_poll`) deliver every event, in order, also after
/// an idle gap longer than the window, when the readers park again.
#[test]
fn busy_polling_connections_deliver_every_event_across_idle_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let window = Duration::from_micros(500);
    let config = strom_server::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        busy_poll_us: window.as_micros() as u64,
        rank: Some(0),
        size: Some(1),
        ..Default::default()
    };
    let transports = strom_net::Transports::default().with_busy_poll(window);
    assert_eq!(transports.busy_poll(), window);
    let d = Driver::embedded_over(config, transports).unwrap();
    let t = d.create_topic(TopicSpec::new("bp", 2)).unwrap();
    let c = t
        .consumer_with(
            "c",
            ConsumerOptions {
                start: StartPos::Beginning,
                spin: Duration::ZERO,
                ..Default::default()
            },
        )
        .unwrap();
    let p = t.producer().unwrap();
    let mut seen = [0u32; 2];
    for round in 0..3u32 {
        for i in 0..200u32 {
            let n = round * 200 + i;
            p.push_with(
                format!("{{\"n\": {n}}}"),
                n.to_le_bytes().repeat(64),
                Some(n % 2),
                &[],
            )
            .unwrap();
        }
        p.flush().unwrap();
        for _ in 0..200 {
            let Next::Event(e) = c.pull_timeout(Duration::from_secs(10)).unwrap() else {
                panic!("end of stream before every event arrived");
            };
            let part = e.meta().partition as usize;
            let n = seen[part] * 2 + part as u32;
            assert_eq!(e.data_vec(), n.to_le_bytes().repeat(64), "partition {part}");
            seen[part] += 1;
        }
        // Longer than the window: every reader parks before the next round.
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen, [300, 300]);
}

/// The default spin is long only where cores are spare, and the
/// environment overrides it (for programs that cannot set options).
#[test]
fn the_default_spin_follows_the_cores_and_the_environment() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::remove_var(SPIN_ENV);
    let want = if cores >= SPARE_CORES {
        LATENCY_SPIN
    } else {
        DEFAULT_SPIN
    };
    assert_eq!(default_spin(), want, "{cores} cores");
    assert_eq!(ConsumerOptions::default().spin, want);
    std::env::set_var(SPIN_ENV, "750");
    assert_eq!(default_spin(), Duration::from_micros(750));
    std::env::set_var(SPIN_ENV, "not a number");
    assert_eq!(default_spin(), want, "a malformed value is ignored");
    std::env::remove_var(SPIN_ENV);
}
