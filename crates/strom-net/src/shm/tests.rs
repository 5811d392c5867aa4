//! Tests of the shm transport: frames, data parts both ways, fallback.

use super::*;
use crate::{OutFrame, Transports};
use bytes::Bytes;
use strom_proto::{FrameKind, Request};

#[tokio::test]
async fn auto_binds_a_private_socket_that_carries_frames_and_is_removed_on_drop() {
    let t = Transports::default();
    let mut listener = t.listen("shm://auto").await.unwrap();
    let addr = listener.local_addr();
    let path = PathBuf::from(sock_path(&addr));
    let dir = path.parent().unwrap().to_path_buf();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "the socket dir is private");
    }
    let client = tokio::spawn({
        let t = t.clone();
        let addr = addr.clone();
        async move {
            let mut c = t.connect(&addr).await.unwrap();
            let payload = Bytes::from(vec![7u8; 100_000]);
            let f = OutFrame::request(2, 9, &Request::Limits).with_bulk(vec![payload]);
            c.writer.write(&f).await.unwrap();
            c.writer.flush().await.unwrap();
            c
        }
    });
    let mut server = listener.accept().await.unwrap();
    let (header, _) = server.reader.next().await.unwrap().unwrap();
    assert_eq!(
        (header.kind, header.id, header.bulk_len),
        (FrameKind::Request, 9, 100_000)
    );
    let bulk = server.reader.read_bulk().await.unwrap();
    assert!(bulk.iter().flat_map(|b| b.iter()).all(|&b| b == 7));
    drop(client.await.unwrap());
    drop(listener);
    assert!(
        !path.exists() && !dir.exists(),
        "socket and dir are removed"
    );
}

#[tokio::test]
async fn connecting_to_a_missing_socket_names_the_address() {
    let dir = std::env::temp_dir().join(format!("strom-shm-missing-{}", std::process::id()));
    let addr = format!("shm://{}/nope.sock", dir.display());
    let e = match Transports::default().connect(&addr).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("nothing listens there"),
    };
    assert!(e.contains("nope.sock"), "{e}");
}

/// A connected (client, server) pair over a fresh `shm://auto` listener of
/// `t`.
async fn pair(t: ShmTransport) -> (Conn, Conn, Box<dyn Listener>) {
    let mut listener = t.listen("auto").await.unwrap();
    let addr = listener.local_addr();
    let path = addr.strip_prefix("shm://").unwrap().to_string();
    assert!(
        path.contains("?node="),
        "the address names its node: {addr}"
    );
    let (c, s) = tokio::join!(t.connect(&path), listener.accept());
    (c.unwrap(), s.unwrap(), listener)
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<_>>(),
    )
}

/// Sends frames with the given payloads (each split into `pieces` chunks)
/// and reads them back on the other side through `read_into`, `read` and
/// `skip` in turn; returns what `read_into`/`read` got, in order.
async fn round_trip(a: &mut Conn, b: &mut Conn, payloads: &[Bytes], pieces: usize) {
    for (i, p) in payloads.iter().enumerate() {
        let step = p.len().div_ceil(pieces).max(1);
        let chunks: Vec<Bytes> = (0..p.len())
            .step_by(step)
            .map(|at| p.slice(at..(at + step).min(p.len())))
            .collect();
        let f = OutFrame::request(2, i as u64, &Request::Limits).with_bulk(chunks);
        a.writer.write(&f).await.unwrap();
    }
    a.writer.flush().await.unwrap();
    for (i, p) in payloads.iter().enumerate() {
        let (h, _) = b.reader.next().await.unwrap().unwrap();
        assert_eq!((h.id, h.bulk_len), (i as u64, p.len() as u64));
        match i % 3 {
            0 => {
                let mut dst = vec![0u8; p.len()];
                let half = p.len() / 2;
                b.reader.read_bulk_into(&mut dst[..half]).await.unwrap();
                b.reader.read_bulk_into(&mut dst[half..]).await.unwrap();
                assert!(dst == p[..], "payload {i} via read_bulk_into");
            }
            1 => {
                let got: Vec<u8> = b.reader.read_bulk().await.unwrap().concat();
                assert!(got == p[..], "payload {i} via read_bulk");
            }
            _ => b.reader.skip_bulk().await.unwrap(),
        }
    }
}

#[tokio::test]
async fn data_parts_cross_both_ways_pulled_or_inline_byte_for_byte() {
    let (mut c, mut s, _l) = pair(ShmTransport::default()).await;
    let sizes = [
        1,
        100,
        SHM_INLINE_MAX,
        SHM_INLINE_MAX + 1,
        300_000,
        5 << 20,
        17,
        70_000,
        9,
    ];
    let payloads: Vec<Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u8))
        .collect();
    let before = shm_stats();
    round_trip(&mut c, &mut s, &payloads, 3).await;
    round_trip(&mut s, &mut c, &payloads, 7).await;
    let after = shm_stats();
    let big: u64 = sizes
        .iter()
        .filter(|&&n| n > SHM_INLINE_MAX)
        .map(|&n| n as u64)
        .sum();
    assert!(
        after.pulled_bytes - before.pulled_bytes >= 2 * big,
        "large parts are pulled"
    );
    assert!(
        after.inline_bytes > before.inline_bytes,
        "small parts go inline"
    );
}

#[tokio::test]
async fn a_payload_in_more_pieces_than_one_record_holds_arrives_whole() {
    let (mut c, mut s, _l) = pair(ShmTransport::default()).await;
    let p = pattern(6000 * 7, 3);
    round_trip(&mut c, &mut s, &[p.clone(), p], 6000).await;
}

#[tokio::test]
async fn without_cma_every_data_part_goes_through_the_socket() {
    let (mut c, mut s, _l) = pair(ShmTransport::default().without_cma()).await;
    let p = pattern(2 << 20, 5);
    let before = shm_stats().inline_bytes;
    round_trip(&mut c, &mut s, &[p.clone(), p.clone()], 2).await;
    round_trip(&mut s, &mut c, &[p.clone(), p], 2).await;
    assert!(shm_stats().inline_bytes - before >= 8 << 20);
}

#[tokio::test]
async fn a_client_without_cma_still_lets_the_server_decide_for_itself() {
    // The client refuses cross-memory attach; the server wants it. Neither
    // direction may pull, and both still work.
    let server_t = ShmTransport::default();
    let mut listener = server_t.listen("auto").await.unwrap();
    let path = sock_path(&listener.local_addr());
    let client_t = ShmTransport::default().without_cma();
    let (c, s) = tokio::join!(client_t.connect(&path), listener.accept());
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    let p = pattern(1 << 20, 9);
    round_trip(&mut c, &mut s, std::slice::from_ref(&p), 1).await;
    round_trip(&mut s, &mut c, std::slice::from_ref(&p), 1).await;
}

#[tokio::test]
async fn a_bad_handshake_is_refused_and_the_listener_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = ShmTransport::default();
    let mut listener = t.listen("auto").await.unwrap();
    let path = sock_path(&listener.local_addr());
    let mut raw = UnixStream::connect(&path).await.unwrap();
    raw.write_all(&[0xAB; 32]).await.unwrap();
    let good = tokio::spawn({
        let (t, path) = (t.clone(), path.clone());
        async move { t.connect(&path).await }
    });
    let mut s = listener.accept().await.unwrap();
    let mut c = good.await.unwrap().unwrap();
    round_trip(&mut c, &mut s, &[pattern(100_000, 1)], 1).await;
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut buf)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))),
        "the bad client is closed: {n:?}"
    );
}

#[tokio::test]
async fn a_bad_bulk_record_ends_the_connection_with_an_error() {
    use tokio::io::AsyncWriteExt;
    let (a, b) = UnixStream::pair().unwrap();
    let (mut ar, mut aw) = b.into_split();
    let policy = bulk::SendPolicy {
        peer_pulls: true,
        inline_max: 0,
        max_pending: 1 << 20,
    };
    let (_sender, mut receiver) = {
        let (r, w) = a.into_split();
        bulk::bulk_path(r, w, policy, std::process::id() as i32)
    };
    // A pull record claiming 2^31 regions.
    let mut rec = vec![2u8, 0, 0, 0];
    rec.extend_from_slice(&(1u32 << 31).to_le_bytes());
    rec.extend_from_slice(&1u64.to_le_bytes());
    aw.write_all(&rec).await.unwrap();
    let mut dst = [0u8; 4];
    let e = crate::bulk::BulkReceiver::read_into(&mut receiver, &mut dst)
        .await
        .unwrap_err();
    assert!(matches!(e, NetError::Closed), "{e}");
    let _ = (&mut ar, aw);
}

#[tokio::test]
async fn pulled_chunks_are_released_once_the_peer_has_them() {
    let (a, b) = UnixStream::pair().unwrap();
    let policy = bulk::SendPolicy {
        peer_pulls: true,
        inline_max: 0,
        max_pending: 1 << 30,
    };
    let me = std::process::id() as i32;
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    let (sender, _ra) = bulk::bulk_path(ar, aw, policy, me);
    let (_sb, mut receiver) = bulk::bulk_path(br, bw, policy, me);
    let p = pattern(1 << 20, 4);
    crate::bulk::BulkSender::send(&*sender, std::slice::from_ref(&p))
        .await
        .unwrap();
    assert_eq!(sender.pending_bytes(), 1 << 20, "kept until pulled");
    let mut dst = vec![0u8; 1 << 20];
    crate::bulk::BulkReceiver::read_into(&mut receiver, &mut dst)
        .await
        .unwrap();
    assert!(dst == p[..]);
    for _ in 0..200 {
        if sender.pending_bytes() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the sender still holds {} bytes", sender.pending_bytes());
}

#[tokio::test]
async fn a_pulled_payload_is_read_into_one_buffer_whatever_its_pieces() {
    // Storage hands out zero-copy slices of what it got: one buffer per
    // payload means no event's data straddles two buffers.
    let (mut c, mut s, _l) = pair(ShmTransport::default()).await;
    let p = pattern(9 << 20, 2);
    let chunks = vec![p.slice(..(5 << 20)), p.slice((5 << 20)..)];
    let f = OutFrame::request(2, 1, &Request::Limits).with_bulk(chunks);
    c.writer.write(&f).await.unwrap();
    c.writer.flush().await.unwrap();
    s.reader.next().await.unwrap().unwrap();
    let got = s.reader.read_bulk().await.unwrap();
    assert_eq!(got.len(), 1, "one buffer");
    assert!(got[0] == p);
}

#[tokio::test]
async fn an_address_of_another_node_is_refused_without_touching_its_path() {
    let t = ShmTransport::default();
    let mut listener = t.listen("auto").await.unwrap();
    let addr = listener.local_addr();
    let (path, _) = addr
        .strip_prefix("shm://")
        .unwrap()
        .rsplit_once("?node=")
        .unwrap();
    // The same path, published by a server on another node.
    let stranger = format!("{path}?node=0123456789abcdef");
    let e = match t.connect(&stranger).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("reached a socket of another node"),
    };
    assert!(e.contains("another node"), "{e}");
    // The bare path (an address written by hand) still works.
    let (c, s) = tokio::join!(t.connect(path), listener.accept());
    assert!(c.is_ok() && s.is_ok());
}

/// The socket path of an shm address (without scheme and node).
fn sock_path(addr: &str) -> String {
    let rest = addr.strip_prefix("shm://").unwrap();
    rest.rsplit_once("?node=")
        .map_or(rest, |(p, _)| p)
        .to_string()
}

#[tokio::test]
async fn auto_removes_socket_dirs_left_by_dead_servers_and_nothing_else() {
    let base = tempfile::tempdir().unwrap();
    // A pid that surely exited: a child we ran and reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = base.path().join(format!("strom-shm-{dead}-0-abc"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("strom.sock"), b"").unwrap();
    let alive = base
        .path()
        .join(format!("strom-shm-{}-9-abc", std::process::id()));
    std::fs::create_dir(&alive).unwrap();
    let busy = base.path().join(format!("strom-shm-{dead}-1-abc"));
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("other-file"), b"keep").unwrap();
    remove_stale_dirs(base.path());
    assert!(!stale.exists(), "a dead server's dir is removed");
    assert!(alive.exists(), "a live process's dir stays");
    assert!(
        busy.join("other-file").exists(),
        "a dir with other files stays"
    );
}
