//! A forging client for the fault loops (docs/safety.md, "What members
//! trust"): from outside the group, with no cluster secret, it keeps sending
//! every kind of member-to-member request to every member the group file
//! names: follower fetches claiming to be caught up far past the log end,
//! in-sync reports naming every member, drops, joins that take over a
//! member's id, role changes, Raft RPCs. Each must be refused with
//! `NOT_A_MEMBER`; an answer of any other kind is counted as accepted, and
//! the loop fails on it. Members that are down or paused are skipped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use strom_proto::{ErrorCode, GroupFile, ReplicaRole, Request, Response, TopicSpec};

use super::raw::{request_frame, responses};
use super::Rng;

/// What the forger did: requests answered `NOT_A_MEMBER`, and any other
/// answer (which it should never get).
#[derive(Default, Debug)]
pub struct Forged {
    pub refused: u64,
    pub accepted: Vec<String>,
}

pub struct Forger {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    forged: Arc<Mutex<Forged>>,
}

/// The member requests it forges, against `topic` with `partitions`
/// partitions, impersonating member `id` (one of the group's).
fn forgeries(rng: &mut Rng, topic: &str, partitions: u32, id: u32, ids: &[u32]) -> Request {
    let partition = rng.below(u64::from(partitions)) as u32;
    let epoch = 1 + rng.below(8);
    let topic = topic.to_string();
    match rng.below(12) {
        0..=2 => Request::ReplicaFetch {
            topic,
            partition,
            epoch,
            follower: id,
            from: 1 << 40,
            last_epoch: epoch,
            max_bytes: 1 << 16,
        },
        3 => Request::ReportIsr {
            topic,
            partition,
            epoch,
            isr: ids.to_vec(),
        },
        4 => Request::DropPartitions { topic },
        5 => Request::Join {
            member: Some(id),
            addr: "127.0.0.1:9".into(),
            addrs: vec![],
            restarted: false,
        },
        6 => Request::SetReplicaRoles {
            topic,
            roles: vec![ReplicaRole {
                partition,
                epoch: epoch + 100,
                leader: id,
                leader_addr: "127.0.0.1:9".into(),
                followers: vec![],
                isr: vec![id],
            }],
        },
        7 => Request::ReleasePartitions {
            topic,
            topic_id: 1 + rng.below(4),
            partitions: vec![partition],
        },
        8 => Request::HostPartitions {
            topic_id: 1 + rng.below(4),
            spec: TopicSpec::new(&topic, partitions),
            partitions: vec![partition],
            sealed: true,
        },
        9 => Request::Heartbeat {
            member: id,
            addr: "127.0.0.1:9".into(),
            addrs: vec![],
        },
        10 => Request::MetaRpc {
            rpc: Bytes::from(rng.bytes(24)),
        },
        _ => Request::DropConsumerGroup {
            topic,
            group: "forged".into(),
        },
    }
}

/// Sends `req` to `addr` on a fresh connection; `None` if the member is
/// down or did not answer in time (paused).
fn send(addr: &str, req: &Request) -> Option<Response> {
    let sock = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    s.write_all(&request_frame(5, req, b"")).ok()?;
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Some((_, r)) = responses(&got).into_iter().find(|(id, _)| *id == 5) {
            return Some(r);
        }
        match s.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
    None
}

impl Forger {
    /// Starts forging against the members `group_file` names, every few
    /// milliseconds, until [`Forger::stop`].
    pub fn start(group_file: PathBuf, topic: &str, partitions: u32, seed: u64) -> Forger {
        let stop = Arc::new(AtomicBool::new(false));
        let forged = Arc::new(Mutex::new(Forged::default()));
        let (s, f, topic) = (stop.clone(), forged.clone(), topic.to_string());
        let thread = std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0x5eed_f0e9);
            while !s.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(10 + rng.below(40)));
                let Some(g) = std::fs::read(&group_file)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<GroupFile>(&b).ok())
                else {
                    continue;
                };
                let ids: Vec<u32> = g.members.iter().map(|m| m.id).collect();
                if ids.is_empty() {
                    continue;
                }
                let target = &g.members[rng.below(ids.len() as u64) as usize];
                let id = ids[rng.below(ids.len() as u64) as usize];
                let req = forgeries(&mut rng, &topic, partitions, id, &ids);
                match send(&target.addr, &req) {
                    None => {}
                    Some(Response::Error { code, .. }) if code == ErrorCode::NOT_A_MEMBER => {
                        f.lock().unwrap().refused += 1;
                    }
                    Some(other) => f.lock().unwrap().accepted.push(format!(
                        "member {} at {} answered forged opcode {} with {other:?}",
                        target.id,
                        target.addr,
                        req.opcode()
                    )),
                }
            }
        });
        Forger {
            stop,
            thread: Some(thread),
            forged,
        }
    }

    /// Stops forging and returns what happened.
    pub fn stop(mut self) -> Forged {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.forged.lock().unwrap())
    }
}

impl Drop for Forger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
