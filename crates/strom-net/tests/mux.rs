//! `MuxConn` against a small fake peer built from strom-net's own frame
//! I/O, over TCP (bulk inline) and over the in-process transport (bulk out
//! of band). The opcodes below are this test's own, not Strom messages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strom_net::{spawn_writer, Conn, MemTransport, MuxConn, NetError, OutFrame, Reply, Transports};
use strom_proto::{FrameKind, ProtoError};
use tokio::sync::mpsc;

/// Answers with the request's body.
const ECHO: u16 = 1;
/// Body: u64 n. Answers with n bulk bytes `i as u8`.
const DATA: u16 = 2;
/// Answers with the request's body after 300 ms.
const SLOW: u16 = 3;
/// Body: u64 stream. Answers, then pushes bodies "0", "1", "2" on it.
const PUSH: u16 = 4;
/// Body: u64 n. Answers with n + 1 bulk bytes (a mismatch).
const TOO_MUCH: u16 = 5;
/// Closes the connection without answering.
const HANG_UP: u16 = 6;
/// Answers with the request's bulk length (u64) as the body.
const UPLOAD: u16 = 7;

fn u64_body(n: u64) -> Bytes {
    Bytes::copy_from_slice(&n.to_le_bytes())
}

fn frame(opcode: u16, body: Bytes) -> OutFrame {
    OutFrame {
        version: strom_proto::PROTOCOL_VERSION,
        kind: FrameKind::Request,
        opcode,
        id: 0,
        body,
        body_rest: Vec::new(),
        bulk: Vec::new(),
        hold: None,
    }
}

fn answer(kind: FrameKind, id: u64, body: Bytes, bulk: Vec<Bytes>) -> OutFrame {
    OutFrame {
        version: strom_proto::PROTOCOL_VERSION,
        kind,
        opcode: 0,
        id,
        body,
        body_rest: Vec::new(),
        bulk,
        hold: None,
    }
}

async fn serve(conn: Conn) {
    let writer = spawn_writer(conn.writer, conn.direct, conn.peer, |_| {});
    // Set on HANG_UP: late answers are dropped, so the connection closes.
    let hung_up = Arc::new(AtomicBool::new(false));
    let mut reader = conn.reader;
    while let Ok(Some((h, body))) = reader.next().await {
        let arg = body
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0);
        let bulk = reader.read_bulk().await.unwrap();
        let resp = match h.opcode {
            ECHO => answer(FrameKind::Response, h.id, body, vec![]),
            DATA | TOO_MUCH => {
                let n = arg + u64::from(h.opcode == TOO_MUCH);
                let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
                answer(FrameKind::Response, h.id, body, vec![data.into()])
            }
            SLOW => {
                let (w, hung_up) = (writer.clone(), hung_up.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if hung_up.load(Ordering::Acquire) {
                        return;
                    }
                    let _ = w
                        .send(answer(FrameKind::Response, h.id, body, vec![]))
                        .await;
                });
                continue;
            }
            PUSH => {
                let _ = writer
                    .send(answer(FrameKind::Response, h.id, body, vec![]))
                    .await;
                for i in 0..3u8 {
                    let push = answer(FrameKind::Push, arg, Bytes::from(vec![b'0' + i]), vec![]);
                    let _ = writer.send(push).await;
                }
                continue;
            }
            HANG_UP => {
                hung_up.store(true, Ordering::Release);
                return;
            }
            UPLOAD => {
                let len: u64 = bulk.iter().map(|b| b.len() as u64).sum();
                answer(FrameKind::Response, h.id, u64_body(len), vec![])
            }
            _ => return,
        };
        if writer.send(resp).await.is_err() {
            return;
        }
    }
}

/// A fake peer listening on `url`; returns the address to connect to.
async fn fake_peer(transports: &Transports, url: &str) -> String {
    let mut listener = transports.listen(url).await.unwrap();
    let addr = listener.local_addr();
    tokio::spawn(async move {
        while let Ok(c) = listener.accept().await {
            tokio::spawn(serve(c));
        }
    });
    addr
}

/// Both transports, each with a fake peer and a connection to it.
async fn connections() -> Vec<Arc<MuxConn>> {
    let tcp = Transports::default();
    let mem = Transports::default().with("mem", Arc::new(MemTransport::default()));
    let mut out = Vec::new();
    for (t, url) in [(tcp, "127.0.0.1:0"), (mem, "mem://peer")] {
        let addr = fake_peer(&t, url).await;
        let conn = t.connect(&addr).await.unwrap();
        out.push(MuxConn::start(conn, &addr));
    }
    out
}

#[tokio::test]
async fn responses_reach_their_callers_in_whatever_order_they_come() {
    for c in connections().await {
        let slow = c
            .send(frame(SLOW, "slow".into()), vec![], vec![])
            .await
            .unwrap();
        let fast = c
            .send(frame(ECHO, "fast".into()), vec![], vec![])
            .await
            .unwrap();
        assert_eq!(c.in_flight(), 2);
        let fast = fast.wait().await.unwrap();
        assert_eq!(fast.body, "fast");
        assert_eq!(c.in_flight(), 1, "{}: the slow call is still out", c.peer());
        assert_eq!(slow.wait().await.unwrap().body, "slow");
    }
}

#[tokio::test]
async fn many_concurrent_calls_share_one_connection() {
    for c in connections().await {
        let calls = (0..64u64).map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.call(frame(ECHO, u64_body(i))).await })
        });
        for (i, call) in calls.enumerate() {
            let reply = call.await.unwrap().unwrap();
            assert_eq!(reply.body, u64_body(i as u64));
        }
    }
}

#[tokio::test]
async fn bulk_lands_in_the_lent_buffers_following_the_plan() {
    for c in connections().await {
        let buffers = vec![vec![0xffu8; 6], vec![0xffu8; 4]];
        // 3 bytes at 2.. of the first buffer, then 4 at 0.. of the second.
        let plan = vec![(0, 2, 3), (1, 0, 4)];
        let w = c
            .send(frame(DATA, u64_body(7)), buffers, plan)
            .await
            .unwrap();
        let reply = w.wait().await.unwrap();
        assert!(reply.filled());
        assert_eq!(reply.buffers[0], [0xff, 0xff, 0, 1, 2, 0xff]);
        assert_eq!(reply.buffers[1], [3, 4, 5, 6]);
        // The connection carries on.
        assert_eq!(
            c.call(frame(ECHO, "after".into())).await.unwrap().body,
            "after"
        );
    }
}

/// A fetch of many small events (read together, then copied into place)
/// with a large one among them (read straight into its buffer), and more
/// small ones than one gathered read takes: every byte where the plan says.
#[tokio::test]
async fn many_small_pieces_and_a_large_one_land_where_the_plan_says() {
    for c in connections().await {
        let mut sizes = vec![1000usize; 150];
        sizes.push(40 << 10);
        sizes.extend(std::iter::repeat_n(2000, 200));
        // Every piece at offset 1 of its own buffer, but the second one
        // shares the first's buffer (after it).
        let mut buffers: Vec<Vec<u8>> = Vec::new();
        let mut plan = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            if i == 1 {
                buffers[0].resize(1 + sizes[0] + len, 0xff);
                plan.push((0, 1 + sizes[0], len));
                continue;
            }
            plan.push((buffers.len(), 1, len));
            buffers.push(vec![0xffu8; len + 1]);
        }
        let total: usize = sizes.iter().sum();
        let w = c
            .send(frame(DATA, u64_body(total as u64)), buffers, plan.clone())
            .await
            .unwrap();
        let reply = w.wait().await.unwrap();
        assert!(reply.filled());
        let mut at = 0usize;
        for &(b, start, len) in &plan {
            let got = &reply.buffers[b][start..start + len];
            assert!(
                got.iter().enumerate().all(|(k, &v)| v == (at + k) as u8),
                "{}: piece of {len} bytes at {at} into buffer {b}",
                c.peer()
            );
            assert_eq!(reply.buffers[b][0], 0xff, "byte before the piece");
            at += len;
        }
    }
}

#[tokio::test]
async fn an_answer_without_bulk_hands_the_lent_buffers_back_unfilled() {
    for c in connections().await {
        let w = c.send(
            frame(ECHO, "refused".into()),
            vec![vec![9u8; 4]],
            vec![(0, 0, 4)],
        );
        let reply: Reply<Vec<u8>> = w.await.unwrap().wait().await.unwrap();
        assert!(!reply.filled());
        assert_eq!(reply.buffers, [vec![9u8; 4]]);
        assert!(!c.is_dead());
    }
}

#[tokio::test]
async fn a_bulk_mismatch_fails_its_request_and_ends_the_connection() {
    for c in connections().await {
        let slow = c
            .send(frame(SLOW, "x".into()), vec![], vec![])
            .await
            .unwrap();
        let w = c.send(
            frame(TOO_MUCH, u64_body(4)),
            vec![vec![0u8; 4]],
            vec![(0, 0, 4)],
        );
        let e = w.await.unwrap().wait().await.err().unwrap();
        assert!(
            matches!(
                e,
                NetError::BulkMismatch {
                    announced: 5,
                    expected: 4
                }
            ),
            "{e}"
        );
        let e = slow.wait().await.err().unwrap();
        assert!(matches!(e, NetError::Lost { .. }), "{e}");
        assert!(c.is_dead());
        assert!(c.call(frame(ECHO, "late".into())).await.is_err());
    }
}

#[tokio::test]
async fn a_fill_plan_that_does_not_fit_fails_only_its_request() {
    for c in connections().await {
        let w = c.send(
            frame(DATA, u64_body(8)),
            vec![vec![0u8; 4]],
            vec![(0, 0, 8)],
        );
        let e = w.await.unwrap().wait().await.err().unwrap();
        assert!(matches!(e, NetError::FillPlan { buffers: 1 }), "{e}");
        assert_eq!(c.call(frame(ECHO, "ok".into())).await.unwrap().body, "ok");
    }
}

#[tokio::test]
async fn pushes_reach_their_stream_handler_in_order() {
    for c in connections().await {
        let (tx, mut rx) = mpsc::unbounded_channel();
        c.open_stream(
            77,
            Box::new(move |h, body| {
                assert_eq!(h.kind, FrameKind::Push);
                let _ = tx.send(body);
                Ok(())
            }),
        );
        c.call(frame(PUSH, u64_body(77))).await.unwrap();
        for want in ["0", "1", "2"] {
            assert_eq!(rx.recv().await.unwrap(), want);
        }
        c.close_stream(77);
        assert!(rx.recv().await.is_none(), "closing drops the handler");
    }
}

#[tokio::test]
async fn a_push_handler_error_ends_the_connection() {
    for c in connections().await {
        c.open_stream(5, Box::new(|_, _| Err(ProtoError::Trailing(1).into())));
        let _ = c.call(frame(PUSH, u64_body(5))).await;
        let slow = c.send(frame(SLOW, "x".into()), vec![], vec![]).await;
        if let Ok(w) = slow {
            assert!(w.wait().await.is_err());
        }
        assert!(c.is_dead());
    }
}

#[tokio::test]
async fn requests_sent_from_other_threads_complete_through_callbacks() {
    for c in connections().await {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let threads: Vec<_> = (0..4u64)
            .map(|i| {
                let (c, tx) = (c.clone(), tx.clone());
                std::thread::spawn(move || {
                    let mut f = frame(UPLOAD, Bytes::new());
                    f.bulk = vec![Bytes::from(vec![1u8; 1000 * (i as usize + 1)])];
                    let done: strom_net::mux::Callback<Vec<u8>> = Box::new(move |r| {
                        let _ = tx.send(r.map(|reply| reply.body));
                    });
                    if let Err((f, done)) = c.try_send_with(f, done) {
                        // Queue full: the caller falls back to waiting for room.
                        let c = c.clone();
                        tokio::runtime::Builder::new_current_thread()
                            .build()
                            .unwrap()
                            .block_on(async move { c.send_with(f, done).await });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut lens = Vec::new();
        for _ in 0..4 {
            let body = rx.recv().await.unwrap().unwrap();
            lens.push(u64::from_le_bytes(body[..8].try_into().unwrap()));
        }
        lens.sort();
        assert_eq!(lens, [1000, 2000, 3000, 4000]);
    }
}

#[tokio::test]
async fn losing_the_connection_fails_every_pending_request_and_drops_streams() {
    for c in connections().await {
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        c.open_stream(
            9,
            Box::new(move |_, b| {
                let _ = tx.send(b);
                Ok(())
            }),
        );
        let slow = c
            .send(frame(SLOW, "x".into()), vec![], vec![])
            .await
            .unwrap();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        c.send_with(
            frame(SLOW, "y".into()),
            Box::new(move |r| {
                let _ = done_tx.send(r.is_err());
            }),
        )
        .await;
        c.send_oneway(frame(HANG_UP, Bytes::new())).unwrap();
        let e = slow.wait().await.err().unwrap();
        assert!(matches!(&e, NetError::Lost { .. }), "{e}");
        assert_eq!(e.code(), strom_proto::ErrorCode::CONNECTION_CLOSED);
        assert!(done_rx.await.unwrap(), "the callback got the loss");
        assert!(rx.recv().await.is_none(), "stream handler dropped");
        assert!(c.is_dead());
    }
}

#[tokio::test]
async fn a_frame_too_large_for_the_connection_fails_alone() {
    let t = Transports::tcp(4096);
    let addr = fake_peer(&t, "127.0.0.1:0").await;
    let c: Arc<MuxConn> = MuxConn::start(t.connect(&addr).await.unwrap(), &addr);
    let e = c
        .call(frame(ECHO, Bytes::from(vec![0u8; 5000])))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), strom_proto::ErrorCode::FRAME_TOO_LARGE, "{e}");
    assert_eq!(
        c.call(frame(ECHO, "small".into())).await.unwrap().body,
        "small"
    );
}

#[tokio::test]
async fn a_cancelled_request_is_forgotten_and_its_late_answer_skipped() {
    for c in connections().await {
        let w = c
            .send(frame(SLOW, "x".into()), vec![], vec![])
            .await
            .unwrap();
        assert!(c.cancel(w.id()));
        assert!(w.wait().await.is_err());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            c.call(frame(ECHO, "next".into())).await.unwrap().body,
            "next"
        );
        assert_eq!(c.in_flight(), 0);
    }
}

/// A frame whose body ends in separate pieces (a batch's metadata section)
/// arrives as one body, whether the sending thread writes it straight to
/// the socket or the writer task does, with pieces small enough to be
/// coalesced and pieces large enough to be written as they are.
#[tokio::test]
async fn a_body_sent_in_pieces_arrives_whole() {
    for c in connections().await {
        let calls = (0..32u64).map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut f = frame(ECHO, u64_body(i));
                f.body_rest = vec![
                    Bytes::from_static(b"-small-"),
                    Bytes::from(vec![i as u8; (40 << 10) + i as usize]),
                    Bytes::from(vec![7u8; i as usize]),
                ];
                let mut want = f.body.to_vec();
                f.body_rest.iter().for_each(|p| want.extend_from_slice(p));
                (c.call(f).await.unwrap().body, want)
            })
        });
        for call in calls {
            let (got, want) = call.await.unwrap();
            assert_eq!(got.len(), want.len(), "{}", c.peer());
            assert!(
                got == want,
                "{}: the body's pieces arrived changed",
                c.peer()
            );
        }
    }
}

/// A connection whose runtime is not running: only a thread that reads
/// it itself ([`MuxConn::read_here`]) can route its frames. The reader
/// task ran up to its first wait, so it has handed the frame reader over.
fn idle_runtime_connection() -> (
    tokio::runtime::Runtime,
    Arc<MuxConn>,
    tokio::runtime::Runtime,
) {
    let peer_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = peer_rt.block_on(fake_peer(&Transports::default(), "127.0.0.1:0"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = rt.block_on(async {
        let conn = Transports::default().connect(&addr).await.unwrap();
        let c: Arc<MuxConn> = MuxConn::start(conn, &addr);
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        c
    });
    (rt, c, peer_rt)
}

#[test]
fn a_waiting_thread_routes_its_connections_frames_itself() {
    let (_rt, c, _peer) = idle_runtime_connection();
    let me = std::thread::current().id();
    let (tx, rx) = std::sync::mpsc::channel();
    let pushes = tx.clone();
    c.open_stream(
        9,
        Box::new(move |_, body| {
            let _ = pushes.send((std::thread::current().id(), body));
            Ok(())
        }),
    );
    let answered = Arc::new(std::sync::Mutex::new(None));
    let a = answered.clone();
    let done: strom_net::mux::Callback<Vec<u8>> = Box::new(move |r| {
        *a.lock().unwrap() = Some((std::thread::current().id(), r.is_ok()));
    });
    assert!(c.try_send_with(frame(PUSH, u64_body(9)), done).is_ok());
    let bell = Arc::new(strom_net::Bell::new().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < 3 {
        bell.arm();
        let r = c.read_here(&bell, Some(deadline));
        bell.quiet();
        assert_eq!(r, strom_net::ReadHere::Read, "got {got:?} so far");
        got.extend(rx.try_iter());
    }
    assert_eq!(*answered.lock().unwrap(), Some((me, true)));
    for (i, (on, body)) in got.iter().enumerate() {
        assert_eq!(*on, me, "push {i} was routed on another thread");
        assert_eq!(body.as_ref(), [b'0' + i as u8]);
    }
}

#[test]
fn a_thread_reading_its_connection_stops_at_the_bell_and_at_its_deadline() {
    let (_rt, c, _peer) = idle_runtime_connection();
    let bell = Arc::new(strom_net::Bell::new().unwrap());
    let t = std::time::Instant::now();
    bell.arm();
    let r = c.read_here(&bell, Some(t + Duration::from_millis(50)));
    assert_eq!(r, strom_net::ReadHere::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(50));
    bell.quiet();

    bell.arm();
    let ringer = {
        let bell = bell.clone();
        std::thread::spawn(move || bell.ring())
    };
    // No deadline: only the bell can end this wait.
    assert_eq!(c.read_here(&bell, None), strom_net::ReadHere::Rang);
    bell.quiet();
    ringer.join().unwrap();
    // A quiet bell does not ring.
    bell.ring();
    let r = c.read_here(
        &bell,
        Some(std::time::Instant::now() + Duration::from_millis(20)),
    );
    assert_eq!(r, strom_net::ReadHere::TimedOut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_reads_again_once_a_waiting_thread_is_done() {
    // A thread reads for a while (and gives up at its deadline), then the
    // reader task routes the answers as before.
    let t = Transports::default();
    let addr = fake_peer(&t, "127.0.0.1:0").await;
    let c: Arc<MuxConn> = MuxConn::start(t.connect(&addr).await.unwrap(), &addr);
    let c2 = c.clone();
    let r = tokio::task::spawn_blocking(move || {
        let bell = Arc::new(strom_net::Bell::new().unwrap());
        bell.arm();
        c2.read_here(
            &bell,
            Some(std::time::Instant::now() + Duration::from_millis(30)),
        )
    })
    .await
    .unwrap();
    assert!(matches!(
        r,
        strom_net::ReadHere::TimedOut | strom_net::ReadHere::Rang
    ));
    for i in 0..20u64 {
        let reply = c.call(frame(ECHO, u64_body(i))).await.unwrap();
        assert_eq!(reply.body, u64_body(i));
    }
}

/// The inode of this process's TCP socket connected to `port`, from
/// `/proc/net/tcp` (`rem_address` is `HEXIP:HEXPORT`, the inode is the
/// tenth column).
fn socket_to(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let row = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols[2].ends_with(&format!(":{port:04X}")))
        .expect("the connection's socket");
    row[9].parse().unwrap()
}

const EPOLLIN: u32 = 0x1;
const EPOLLOUT: u32 = 0x4;

/// Entries of this process's epoll instances that watch the socket
/// `inode` for any of `events` (`EPOLLIN`: bytes to read, `EPOLLOUT`:
/// room to write), from `/proc/self/fdinfo`. An instance may have two
/// descriptors: entries are counted once.
fn watching(inode: u64, events: u32) -> usize {
    let events_wanted = events;
    let mut entries = std::collections::HashSet::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let is_epoll = std::fs::read_link(fd.path())
            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:[eventpoll]");
        let info = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ));
        let (true, Ok(info)) = (is_epoll, info) else {
            continue;
        };
        // tfd: 7 events: 80002019 data: 7fbe34001080 pos:0 ino:4bd sdev:8
        entries.extend(
            info.lines()
                .filter(|l| l.starts_with("tfd:"))
                .filter(|l| {
                    let cols: Vec<_> = l.split_whitespace().collect();
                    let events = cols.get(3).and_then(|e| u32::from_str_radix(e, 16).ok());
                    let ino = cols
                        .iter()
                        .find_map(|c| c.strip_prefix("ino:"))
                        .and_then(|i| u64::from_str_radix(i, 16).ok());
                    events.is_some_and(|e| e & events_wanted != 0) && ino == Some(inode)
                })
                .map(str::to_string),
        );
    }
    entries.len()
}

#[test]
fn the_runtime_does_not_watch_a_socket_a_waiting_thread_reads() {
    // While a thread waits on its connection, the runtime is not woken by
    // what arrives for it (the thread reads that): the socket leaves the
    // runtime's watch for bytes, and comes back when the thread is done.
    let (_rt, c, _peer) = idle_runtime_connection();
    let port: u16 = c.peer().rsplit_once(':').unwrap().1.parse().unwrap();
    let inode = socket_to(port);
    assert_eq!(watching(inode, EPOLLIN), 1, "watched by the runtime");
    let bell = Arc::new(strom_net::Bell::new().unwrap());
    let reader = {
        let (c, bell) = (c.clone(), bell.clone());
        bell.arm();
        std::thread::spawn(move || {
            c.read_here(
                &bell,
                Some(std::time::Instant::now() + Duration::from_secs(30)),
            )
        })
    };
    let t = std::time::Instant::now();
    while watching(inode, EPOLLIN) != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the socket stayed watched while a thread read it"
        );
        std::thread::yield_now();
    }
    bell.ring();
    assert_eq!(reader.join().unwrap(), strom_net::ReadHere::Rang);
    assert_eq!(watching(inode, EPOLLIN), 1, "watched again afterwards");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_the_socket_holds_waits_for_room_that_is_watched_only_then() {
    // 24 MiB each way overfill both sockets, so each writer waits for
    // room; an idle connection has no watch for room (on a Unix socket it
    // would wake the runtime whenever the peer reads).
    let t = Transports::default();
    let addr = fake_peer(&t, "127.0.0.1:0").await;
    let c: Arc<MuxConn> = MuxConn::start(t.connect(&addr).await.unwrap(), &addr);
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let inode = socket_to(port);
    let body = Bytes::from(
        (0..24u32 << 20)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let reply = c.call(frame(ECHO, body.clone())).await.unwrap();
    assert!(reply.body == body, "the echoed body arrived changed");
    assert_eq!(watching(inode, EPOLLOUT), 0, "watched for room while idle");
    assert_eq!(watching(inode, EPOLLIN), 1, "watched for bytes");
}

#[test]
fn frames_that_come_while_a_waiting_thread_gives_the_reader_back_are_not_stranded() {
    // Each round: the peer answers and pushes three frames back to back;
    // this thread reads until the first push is routed, then leaves the
    // rest to the runtime. Frames that arrive while the thread hands the
    // reader back wake the reader task, which may run (and find the
    // reader still taken) before the thread lets go: they must still be
    // routed, by one or the other, with no more bytes coming to wake
    // anyone (the peer waits for the next round's request).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(fake_peer(&Transports::default(), "127.0.0.1:0"));
    let c: Arc<MuxConn> = rt.block_on(async {
        MuxConn::start(Transports::default().connect(&addr).await.unwrap(), &addr)
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let bell = Arc::new(strom_net::Bell::new().unwrap());
    // As a consumer's deliveries do: queue, then ring the waiting thread.
    let ring = bell.clone();
    c.open_stream(
        9,
        Box::new(move |_, body| {
            let _ = tx.send(body);
            ring.ring();
            Ok(())
        }),
    );
    // A thread that routes with nothing there waits for the next frame,
    // which never comes here: fail then, rather than hang.
    let (beat, beats) = std::sync::mpsc::channel::<u32>();
    std::thread::spawn(move || loop {
        match beats.recv_timeout(Duration::from_secs(20)) {
            Ok(_) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                eprintln!("read_here has not returned for 20 s (past its 5 s deadline): it waits for a frame that is not coming");
                std::process::exit(101);
            }
        }
    });
    for round in 0..3000 {
        let _ = beat.send(round);
        let done: strom_net::mux::Callback<Vec<u8>> = Box::new(|_| {});
        assert!(c.try_send_with(frame(PUSH, u64_body(9)), done).is_ok());
        let mut got = 0;
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while got == 0 {
            assert!(std::time::Instant::now() < until, "round {round}: no push");
            // Armed before the queue is looked at, as read_here requires:
            // a push routed by the runtime in between rings it.
            bell.arm();
            got += rx.try_iter().count();
            if got == 0 {
                c.read_here(
                    &bell,
                    Some(std::time::Instant::now() + Duration::from_secs(5)),
                );
                got += rx.try_iter().count();
            }
            bell.quiet();
        }
        while got < 3 {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("round {round}: push {got} stranded in the socket"));
            got += 1;
        }
    }
}
