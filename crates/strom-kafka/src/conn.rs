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

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::api;
use crate::error::FrameError;
use crate::request::{api_name, header, Ctx, Reply};
use crate::sasl::{self, is_sasl, SaslState};
use kafka_protocol::messages::ApiKey;

/// Responses queued but not yet written, per connection.
const PIPELINE: usize = 64;

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
async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    sock: &mut R,
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

/// Serves one TCP connection until it closes or breaks the protocol.
pub async fn serve(sock: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) {
    let _ = sock.set_nodelay(true);
    serve_stream(sock, peer, ctx).await
}

/// Serves one connection over any byte stream (TCP, or TLS over it).
pub async fn serve_stream<S>(sock: S, peer: SocketAddr, mut ctx: Arc<Ctx>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    ctx = ctx.for_connection(peer);
    let (mut rd, mut wr) = tokio::io::split(sock);
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
    let mut sasl = SaslState::default();
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
        // A quota muted this connection (`throttle.rs`): its next request
        // waits, as a Kafka broker mutes a throttled channel.
        ctx.mute.wait().await;
        let reply = {
            let mut frame = bytes;
            match header(&mut frame) {
                Ok(h) if is_sasl(h.key) => {
                    let api = ApiKey::try_from(h.key).map_or("Unsupported", api_name);
                    ctx.services.stats.kafka.request(api);
                    sasl::handle(&ctx, &mut sasl, &h, frame).map(|(r, who)| {
                        if let Some(p) = who {
                            ctx = ctx.for_principal(p);
                        }
                        r
                    })
                }
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
                let api = match &e {
                    FrameError::Body { api, .. } => api,
                    _ => "Unknown",
                };
                ctx.services.stats.kafka.error(api, "INVALID_REQUEST");
                tracing::warn!(peer = %peer, error = %e, "closing Kafka connection: malformed request");
                break;
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
