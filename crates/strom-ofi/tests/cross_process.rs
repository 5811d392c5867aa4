//! Two processes: the test binary runs itself again as the peer (the same
//! test, with the parent's region in an environment variable). The child
//! reads the parent's region, writes into it, and reports back with a
//! message; over `tcp;ofi_rxm` and `shm` (which reads with CMA across
//! processes).

use strom_ofi::{Access, Endpoint, EndpointConfig, ProviderSpec, RemoteRegion};
use tokio::sync::mpsc;

const CHILD: &str = "STROM_OFI_TEST_CHILD";
const LEN: usize = 3 << 20;

fn open(provider: &str) -> (Endpoint, mpsc::UnboundedReceiver<Vec<u8>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let cfg = EndpointConfig::new(ProviderSpec::new(provider));
    let ep = Endpoint::open(&cfg, Box::new(move |m: &[u8]| drop(tx.send(m.to_vec()))))
        .unwrap_or_else(|e| panic!("provider {provider} must be available here: {e}"));
    (ep, rx)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i % 253) as u8).collect()
}

async fn child(provider: &str, arg: &str) {
    let f: Vec<&str> = arg.split(' ').collect();
    let (ep, _in) = open(provider);
    let parent = ep.insert_peer(&unhex(f[0])).unwrap();
    let region = RemoteRegion {
        addr: f[1].parse().unwrap(),
        key: f[2].parse().unwrap(),
        len: f[3].parse().unwrap(),
    };
    let mut got = vec![0u8; LEN];
    ep.read(parent, &mut got, region).await.unwrap();
    let ok = got == pattern();
    ep.write(parent, &[0xab; 4096], region).await.unwrap();
    let report = if ok {
        b"read ok".as_slice()
    } else {
        b"read bad"
    };
    ep.send(parent, report).await.unwrap().await.unwrap();
}

async fn across_processes(provider: &str, test: &str) {
    if let Ok(arg) = std::env::var(CHILD) {
        return child(provider, &arg).await;
    }
    let (ep, mut inbox) = open(provider);
    let region = ep.register(pattern(), Access::RemoteReadWrite).unwrap();
    let r = region.remote();
    let arg = format!("{} {} {} {}", hex(ep.name()), r.addr, r.key, r.len);
    let exe = std::env::current_exe().unwrap();
    let status = tokio::task::spawn_blocking({
        let test = test.to_string();
        move || {
            std::process::Command::new(exe)
                .args([test.as_str(), "--exact", "--nocapture"])
                .env(CHILD, arg)
                .status()
        }
    });
    let report = inbox.recv().await.unwrap();
    assert_eq!(report, b"read ok", "the child read the region");
    assert!(
        region.as_slice()[..4096].iter().all(|&x| x == 0xab),
        "the child wrote"
    );
    assert_eq!(region.as_slice()[4096..], pattern()[4096..]);
    assert!(status.await.unwrap().unwrap().success(), "the child passed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_across_processes() {
    across_processes("tcp;ofi_rxm", "tcp_across_processes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_across_processes() {
    across_processes("shm", "shm_across_processes").await;
}
