//! Control-plane calls between members of a group (join, heartbeat, host,
//! seal, drop, stats). One connection per peer, one call at a time on it,
//! each bounded by a timeout so a dead member cannot stall the master.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strom_net::{Conn, OutFrame, TcpTransport, Transport};
use strom_proto::{ErrorCode, FrameKind, Request, Response};

use crate::error::ServerError;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct Peers {
    conns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Conn>>>>>,
}

fn unreachable(addr: &str, why: impl std::fmt::Display) -> ServerError {
    ServerError::coded(
        ErrorCode::CONNECTION_FAILED,
        format!("group member at {addr} is unreachable: {why}"),
    )
}

impl Peers {
    /// Sends one request to the server at `addr` and waits for its response.
    pub async fn call(&self, addr: &str, req: &Request) -> Result<Response, ServerError> {
        let slot = self
            .conns
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone();
        let mut guard = slot.lock().await;
        let result = tokio::time::timeout(CALL_TIMEOUT, async {
            if guard.is_none() {
                *guard = Some(TcpTransport::default().connect(addr).await?);
            }
            let conn = guard.as_mut().expect("connected above");
            conn.writer.write(&OutFrame::request(1, req)).await?;
            conn.writer.flush().await?;
            loop {
                let Some((h, body)) = conn.reader.next().await? else {
                    return Err(strom_net::NetError::Closed);
                };
                conn.reader.skip_bulk().await?;
                if h.kind == FrameKind::Response && h.id == 1 {
                    return Ok(Response::decode(h.opcode, &body)?);
                }
            }
        })
        .await;
        match result {
            Ok(Ok(Response::Error { code, message })) => Err(ServerError::Coded { code, message }),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                *guard = None;
                Err(unreachable(addr, e))
            }
            Err(_) => {
                *guard = None;
                Err(unreachable(
                    addr,
                    format!("no answer within {CALL_TIMEOUT:?}"),
                ))
            }
        }
    }
}
