//! One Kafka client connection: framing (a 4-byte size, capped by
//! `max_frame_bytes`; the body's buffer grows as its bytes arrive, and
//! every byte read first takes its place in the in-flight budget shared by
//! all connections, `kafka_queued_max_request_bytes`), the request header,
//! dispatch, and responses written in request order, as Kafka requires.
//!
//! The reader decodes each request and calls its handler at once, so
//! produce requests append in the order they arrived; the handler returns a
//! future of the response (a produce waits for its acks, a fetch long-polls)
//! and the writer task awaits those futures one after the other. A frame
//! that breaks the protocol closes this connection with a logged error; an
//! unsupported API key or version gets an `UNSUPPORTED_VERSION` answer.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::Encodable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::api::{self, Ctx};
use crate::error::FrameError;

/// A response to come: its bytes (header and body), or `None` when the
/// request gets no answer (`acks = 0`).
pub type Reply = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

/// Responses queued but not yet written, per connection.
const PIPELINE: usize = 64;

/// A decoded request header.
pub struct Header {
    pub key: i16,
    pub version: i16,
    pub correlation: i32,
    pub client_id: Option<String>,
}

/// A response's bytes: the header for `key` at `version`, then `body`.
pub fn respond<R: Encodable>(key: ApiKey, version: i16, correlation: i32, body: &R) -> Bytes {
    // Sized up front: a fetch response of many record batches would
    // otherwise grow (and be copied) a dozen times.
    let size = body.compute_size(version).unwrap_or(0);
    let mut out = BytesMut::with_capacity(8 + size);
    out.put_i32(correlation);
    if key.response_header_version(version) >= 1 {
        out.put_u8(0); // no tagged fields
    }
    if let Err(e) = body.encode(&mut out, version) {
        // Our own responses at versions we advertise: a bug if it happens.
        tracing::error!(api = ?key, version, error = %e, "encoding a Kafka response failed");
        out.truncate(4);
        out.put_i16(crate::error::kcode::UNKNOWN_SERVER_ERROR);
    }
    out.freeze()
}

/// Parses the request header; the rest of `frame` is the body.
pub(crate) fn header(frame: &mut Bytes) -> Result<Header, FrameError> {
    let bad = |m: &str| FrameError::Header(m.to_string());
    if frame.len() < 10 {
        return Err(bad(
            "shorter than api key, version, correlation id and client id",
        ));
    }
    let key = frame.get_i16();
    let version = frame.get_i16();
    let correlation = frame.get_i32();
    let client_id = match frame.get_i16() {
        -1 => None,
        n if n < 0 => return Err(bad("negative client id length")),
        n if n as usize > frame.len() => return Err(bad("client id longer than the frame")),
        n => Some(String::from_utf8_lossy(&frame.split_to(n as usize)).into_owned()),
    };
    // Tagged header fields matter only to a request that will be decoded;
    // anything else is answered from the fixed part of the header.
    let flexible = ApiKey::try_from(key)
        .map(|k| crate::api::supported(k, version) && k.request_header_version(version) >= 2)
        .unwrap_or(false);
    if flexible {
        let n = crate::guard::header_tags(frame).map_err(|e| FrameError::Header(e.to_string()))?;
        frame.advance(n);
    }
    Ok(Header {
        key,
        version,
        correlation,
        client_id,
    })
}

/// Bytes of a frame's body read per step at first; later steps double
/// with the bytes already read, so the buffer grows with what arrives,
/// never to the announced size up front.
const READ_STEP: usize = 64 << 10;

/// A frame's bytes, and its share of the in-flight budget.
pub(crate) struct Frame {
    pub bytes: Bytes,
    pub budget: OwnedSemaphorePermit,
}

/// Reads one frame: `Ok(None)` at a clean end of stream. Each step of the
/// body first takes its bytes from `budget` (the bytes in flight over all
/// connections), then reads them; all of it, waits included, within
/// `frame_timeout`.
async fn read_frame(
    sock: &mut tokio::net::tcp::OwnedReadHalf,
    max: u32,
    frame_timeout: Duration,
    budget: &Arc<Semaphore>,
) -> Result<Option<Frame>, FrameError> {
    let size = match sock.read_i32().await {
        Ok(n) => i64::from(n),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if size > i64::from(max) {
        return Err(FrameError::TooLarge { size, max });
    }
    if size < 10 {
        return Err(FrameError::TooShort(size));
    }
    let size = size as usize;
    let body = async {
        let mut buf = BytesMut::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        while buf.len() < size {
            let step = (size - buf.len()).min(READ_STEP.max(buf.len()));
            let permit = budget
                .clone()
                .acquire_many_owned(step as u32)
                .await
                .map_err(|_| FrameError::Io(std::io::ErrorKind::BrokenPipe.into()))?;
            match held.as_mut() {
                Some(h) => h.merge(permit),
                None => held = Some(permit),
            }
            buf.reserve(step);
            let end = buf.len() + step;
            while buf.len() < end {
                let room = end - buf.len();
                if sock.read_buf(&mut (&mut buf).limit(room)).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            }
        }
        Ok::<_, FrameError>((buf.freeze(), held))
    };
    match tokio::time::timeout(frame_timeout, body).await {
        Ok(Ok((bytes, Some(budget)))) => Ok(Some(Frame { bytes, budget })),
        Ok(Ok((_, None))) => Err(FrameError::TooShort(size as i64)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(FrameError::Stalled(frame_timeout)),
    }
}

/// Serves one connection until it closes or breaks the protocol.
pub async fn serve(sock: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) {
    let _ = sock.set_nodelay(true);
    let (mut rd, mut wr) = sock.into_split();
    let (tx, mut rx) = mpsc::channel::<Reply>(PIPELINE);
    let writer = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            let Some(bytes) = reply.await else { continue };
            let mut head = [0u8; 4];
            head.copy_from_slice(&(bytes.len() as i32).to_be_bytes());
            if wr.write_all(&head).await.is_err() || wr.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    let max = ctx.services.config.max_frame_bytes;
    let frame_timeout = Duration::from_millis(ctx.services.config.frame_timeout_ms);
    let handshake = Duration::from_millis(ctx.services.config.handshake_timeout_ms);
    let budget = ctx.inflight.clone();
    let mut first = true;
    loop {
        let next = read_frame(&mut rd, max, frame_timeout, &budget);
        let read = if first {
            // The first request must come within handshake_timeout_ms.
            match tokio::time::timeout(handshake, next).await {
                Ok(r) => r,
                Err(_) => Err(FrameError::NoRequest(handshake)),
            }
        } else {
            next.await
        };
        first = false;
        let frame = match read {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(peer = %peer, error = %e, "closing Kafka connection: malformed frame");
                break;
            }
        };
        let Frame { bytes, budget } = frame;
        let reply = {
            let mut frame = bytes;
            match header(&mut frame) {
                Ok(h) => api::handle(&ctx, h, frame),
                Err(e) => Err(e),
            }
        };
        match reply {
            Ok(reply) => {
                // The request's bytes count as in flight until its answer
                // is ready, whether or not the client reads answers.
                let answer = tokio::spawn(async move {
                    let r = reply.await;
                    drop(budget);
                    r
                });
                let reply: Reply = Box::pin(async move { answer.await.ok().flatten() });
                if tx.send(reply).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(peer = %peer, error = %e, "closing Kafka connection: malformed request");
                break;
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
