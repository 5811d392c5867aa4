//! The messages one RDM endpoint exchanges for many connections.
//!
//! Every message starts with its type (1 byte) and the receiver's id (4
//! bytes, little endian): a listener's service id for `Connect`, a
//! connection id for everything else, so one endpoint demultiplexes all its
//! connections. Messages on a connection then carry the sender's sequence
//! number (4 bytes), because providers may complete receives out of order
//! (rxm completes a large, rendezvous message after a later small one): the
//! receiver puts them back in order. Decoding checks every length against
//! the message it came in and caps counts, so a hostile peer gets an
//! error, never a panic or a large allocation.

use bytes::{BufMut, Bytes, BytesMut};
use strom_ofi::RemoteRegion;

/// Type byte and receiver id.
const HEADER: usize = 5;
/// Type byte, receiver id and sequence number.
pub(crate) const CONN_HEADER: usize = HEADER + 4;
/// Bytes per bulk region in a `Desc`.
const REGION: usize = 24;
/// Fixed part of a `Desc` body: id (8) and count (2).
const DESC_FIXED: usize = 10;
/// Most regions one `Desc` carries (larger frames send several).
pub(crate) const MAX_REGIONS: usize = 1024;
/// Longest endpoint name accepted in a `Connect`.
pub(crate) const MAX_NAME: usize = 1024;

const CONNECT: u8 = 1;
const ACCEPT: u8 = 2;
const DATA: u8 = 3;
const DESC: u8 = 4;
const INLINE: u8 = 5;
const RELEASE: u8 = 6;
const CLOSE: u8 = 7;

/// A decoded message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// To a listener: open a connection back to `name`, whose id is `from`.
    Connect {
        service: u32,
        from: u32,
        name: Bytes,
    },
    /// To a connecting client: the server's id for the connection.
    Accept { to: u32, server: u32 },
    /// Message number `seq` of the sender on connection `to`.
    Conn { to: u32, seq: u32, msg: ConnMsg },
}

/// What travels on an open connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConnMsg {
    /// A piece of the frame byte stream.
    Data(Bytes),
    /// Bulk bytes to pull with RMA reads (release `id` after reading).
    Desc { id: u64, regions: Vec<RemoteRegion> },
    /// A small bulk payload carried in the message itself.
    Inline(Bytes),
    /// The receiver is done with the regions of `id`.
    Release { id: u64 },
    /// The sender will write no more on this connection.
    Close,
}

fn header(kind: u8, to: u32, extra: usize) -> BytesMut {
    let mut b = BytesMut::with_capacity(HEADER + extra);
    b.put_u8(kind);
    b.put_u32_le(to);
    b
}

fn conn_header(kind: u8, to: u32, seq: u32, extra: usize) -> BytesMut {
    let mut b = header(kind, to, 4 + extra);
    b.put_u32_le(seq);
    b
}

pub(crate) fn connect(service: u32, from: u32, name: &[u8]) -> BytesMut {
    let mut b = header(CONNECT, service, 6 + name.len());
    b.put_u32_le(from);
    b.put_u16_le(name.len() as u16);
    b.put_slice(name);
    b
}

pub(crate) fn accept(to: u32, server: u32) -> BytesMut {
    let mut b = header(ACCEPT, to, 4);
    b.put_u32_le(server);
    b
}

pub(crate) fn data(to: u32, seq: u32, bytes: &[u8]) -> BytesMut {
    let mut b = conn_header(DATA, to, seq, bytes.len());
    b.put_slice(bytes);
    b
}

pub(crate) fn inline(to: u32, seq: u32, chunks: &[Bytes]) -> BytesMut {
    let len = chunks.iter().map(Bytes::len).sum();
    let mut b = conn_header(INLINE, to, seq, len);
    chunks.iter().for_each(|c| b.put_slice(c));
    b
}

pub(crate) fn desc(to: u32, seq: u32, id: u64, regions: &[RemoteRegion]) -> BytesMut {
    let mut b = conn_header(DESC, to, seq, DESC_FIXED + REGION * regions.len());
    b.put_u64_le(id);
    b.put_u16_le(regions.len() as u16);
    for r in regions {
        b.put_u64_le(r.addr);
        b.put_u64_le(r.key);
        b.put_u64_le(r.len);
    }
    b
}

pub(crate) fn release(to: u32, seq: u32, id: u64) -> BytesMut {
    let mut b = conn_header(RELEASE, to, seq, 8);
    b.put_u64_le(id);
    b
}

pub(crate) fn close(to: u32, seq: u32) -> BytesMut {
    conn_header(CLOSE, to, seq, 0)
}

/// Little-endian reads that fail instead of panicking.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("{} bytes short", n - self.0.len()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn rest(&mut self) -> Bytes {
        let rest = Bytes::copy_from_slice(self.0);
        self.0 = &[];
        rest
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| "u16")?,
        ))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "u32")?,
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "u64")?,
        ))
    }

    fn done(&self) -> Result<(), String> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(format!("{n} trailing bytes")),
        }
    }
}

/// Decodes one message; the error says what was wrong with it.
pub(crate) fn decode(msg: &[u8]) -> Result<Msg, String> {
    let mut r = Reader(msg);
    let kind = r.take(1)?[0];
    let to = r.u32()?;
    let m = match kind {
        CONNECT => {
            let from = r.u32()?;
            let len = r.u16()? as usize;
            if len == 0 || len > MAX_NAME {
                return Err(format!("an endpoint name of {len} bytes"));
            }
            let name = Bytes::copy_from_slice(r.take(len)?);
            Msg::Connect {
                service: to,
                from,
                name,
            }
        }
        ACCEPT => Msg::Accept {
            to,
            server: r.u32()?,
        },
        DATA | INLINE | DESC | RELEASE | CLOSE => {
            let seq = r.u32()?;
            let msg = match kind {
                DATA => ConnMsg::Data(r.rest()),
                INLINE => ConnMsg::Inline(r.rest()),
                DESC => decode_desc(&mut r)?,
                RELEASE => ConnMsg::Release { id: r.u64()? },
                _ => ConnMsg::Close,
            };
            Msg::Conn { to, seq, msg }
        }
        k => return Err(format!("unknown message type {k}")),
    };
    r.done()?;
    Ok(m)
}

fn decode_desc(r: &mut Reader<'_>) -> Result<ConnMsg, String> {
    let id = r.u64()?;
    let count = r.u16()? as usize;
    if count == 0 || count > MAX_REGIONS || count * REGION != r.0.len() {
        return Err(format!("{count} regions in {} bytes", r.0.len()));
    }
    let mut regions = Vec::with_capacity(count);
    for _ in 0..count {
        let region = RemoteRegion {
            addr: r.u64()?,
            key: r.u64()?,
            len: r.u64()?,
        };
        if region.len == 0 {
            return Err("an empty bulk region".into());
        }
        regions.push(region);
    }
    Ok(ConnMsg::Desc { id, regions })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(len: u64) -> RemoteRegion {
        RemoteRegion {
            addr: 1,
            key: 2,
            len,
        }
    }

    #[test]
    fn every_message_round_trips() {
        let conn = |to, seq, msg| Msg::Conn { to, seq, msg };
        let b = Bytes::from_static;
        let name = b(b"name");
        let two = vec![region(3), region(4)];
        let cases = [
            (
                connect(7, 8, &name),
                Msg::Connect {
                    service: 7,
                    from: 8,
                    name: name.clone(),
                },
            ),
            (accept(1, 2), Msg::Accept { to: 1, server: 2 }),
            (data(3, 0, b"abc"), conn(3, 0, ConnMsg::Data(b(b"abc")))),
            (
                inline(4, 1, &[b(b"x"), b(b"yz")]),
                conn(4, 1, ConnMsg::Inline(b(b"xyz"))),
            ),
            (
                desc(5, 2, 9, &two),
                conn(
                    5,
                    2,
                    ConnMsg::Desc {
                        id: 9,
                        regions: two.clone(),
                    },
                ),
            ),
            (release(6, 3, 10), conn(6, 3, ConnMsg::Release { id: 10 })),
            (close(11, u32::MAX), conn(11, u32::MAX, ConnMsg::Close)),
        ];
        for (bytes, msg) in cases {
            assert_eq!(decode(&bytes).unwrap(), msg);
        }
    }

    #[test]
    fn hostile_messages_are_errors() {
        assert!(decode(&[]).is_err());
        assert!(decode(&[99, 0, 0, 0, 0]).is_err());
        let mut d = desc(1, 0, 1, &[region(5)]);
        d[CONN_HEADER + 8] = 0xff; // claims 255 regions, carries 1
        assert!(decode(&d).is_err());
        let mut d = desc(1, 0, 1, &[region(5)]);
        d.truncate(d.len() - 1);
        assert!(decode(&d).is_err());
        assert!(decode(&desc(1, 0, 1, &[region(0)])).is_err());
        let mut c = connect(1, 2, b"n");
        c[9] = 0xff; // a name longer than the message
        assert!(decode(&c).is_err());
        assert!(decode(&connect(1, 2, b"")).is_err());
        let mut a = accept(1, 2).to_vec();
        a.push(0);
        assert!(decode(&a).is_err(), "trailing bytes");
        assert!(
            decode(&close(1, 0)[..7]).is_err(),
            "a short sequence number"
        );
    }
}
