//! `strom bench tasks` on Redis Streams: one tasks stream with a consumer
//! group (`XGROUP CREATE … $ MKSTREAM`), workers `XREADGROUP … COUNT k BLOCK`
//! and send one pipeline per batch with an `XACK` per task and an `XADD`
//! of its result; the collector `XREAD BLOCK`s on the results stream.
//! Without `--redis-address`, a private `redis-server` (no persistence)
//! runs on a free loopback port for the duration of the bench.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::Value;

use super::redis::{array, bulk};
use super::tasks::{Collect, Dispatch, Queue, Work, POLL};
use super::Config;

/// XADDs per dispatcher pipeline when not paced.
const DISPATCH_DEPTH: usize = 1024;

/// A `redis-server` this bench started, stopped when dropped.
pub struct LocalRedis {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl LocalRedis {
    pub fn start() -> anyhow::Result<LocalRedis> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = tempfile::tempdir()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "cannot start redis-server (install it with bench/peers/redis/install, \
                 or pass --redis-address HOST:PORT)",
            )?;
        let mut r = LocalRedis {
            child,
            addr: format!("127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(format!("redis://{}/", r.addr))?;
        loop {
            if let Ok(mut c) = client.get_connection() {
                if redis::cmd("PING").exec(&mut c).is_ok() {
                    return Ok(r);
                }
            }
            if let Some(status) = r.child.try_wait()? {
                anyhow::bail!("redis-server exited at startup ({status})");
            }
            if Instant::now() > deadline {
                anyhow::bail!("redis-server did not answer on {} within 10 s", r.addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct RedisTasks {
    client: redis::Client,
    addr: String,
    tasks: String,
    results: String,
    payload: Vec<u8>,
    paced: bool,
}

const GROUP: &str = "g";

impl RedisTasks {
    /// Creates the run's streams and the consumer group.
    pub fn new(addr: &str, cfg: &Config, run: u32) -> anyhow::Result<RedisTasks> {
        let base = format!("{}-{run}", cfg.topic);
        let r = RedisTasks {
            client: redis::Client::open(format!("redis://{addr}/"))?,
            addr: addr.to_string(),
            tasks: format!("{base}-tasks"),
            results: format!("{base}-results"),
            payload: vec![0xA5u8; cfg.args.task_bytes],
            paced: cfg.args.rate > 0,
        };
        let mut c = r.conn()?;
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&r.tasks)
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .exec(&mut c)
            .context("Redis XGROUP CREATE failed")?;
        Ok(r)
    }

    fn conn(&self) -> anyhow::Result<redis::Connection> {
        self.client
            .get_connection()
            .with_context(|| format!("cannot connect to Redis at {}", self.addr))
    }

    /// Deletes the run's streams (best effort).
    pub fn cleanup(&self) {
        if let Ok(mut c) = self.conn() {
            let _ = redis::cmd("DEL")
                .arg(&self.tasks)
                .arg(&self.results)
                .exec(&mut c);
        }
    }
}

impl Queue for RedisTasks {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn dispatcher(&self) -> anyhow::Result<Box<dyn Dispatch + '_>> {
        Ok(Box::new(RedisDispatch {
            conn: self.conn()?,
            key: &self.tasks,
            payload: &self.payload,
            pipe: redis::pipe(),
            queued: 0,
            depth: if self.paced { 1 } else { DISPATCH_DEPTH },
        }))
    }

    fn worker(&self, index: u32) -> anyhow::Result<Box<dyn Work + '_>> {
        Ok(Box::new(RedisWorker {
            conn: self.conn()?,
            q: self,
            name: format!("w{index}"),
        }))
    }

    fn collector(&self) -> anyhow::Result<Box<dyn Collect + '_>> {
        Ok(Box::new(RedisCollect {
            conn: self.conn()?,
            key: &self.results,
            last: "0-0".into(),
        }))
    }
}

struct RedisDispatch<'a> {
    conn: redis::Connection,
    key: &'a str,
    payload: &'a [u8],
    pipe: redis::Pipeline,
    queued: usize,
    depth: usize,
}

impl Dispatch for RedisDispatch<'_> {
    fn push(&mut self, meta: &[u8]) -> anyhow::Result<()> {
        let cmd = self
            .pipe
            .cmd("XADD")
            .arg(self.key)
            .arg("*")
            .arg("m")
            .arg(meta);
        if !self.payload.is_empty() {
            cmd.arg("d").arg(self.payload);
        }
        cmd.ignore();
        self.queued += 1;
        if self.queued >= self.depth {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if self.queued > 0 {
            self.pipe
                .exec(&mut self.conn)
                .context("Redis XADD failed")?;
            self.pipe.clear();
            self.queued = 0;
        }
        Ok(())
    }
}

/// The entries of an XREAD / XREADGROUP reply on one stream:
/// (id, value of field `m`). RESP2: `[[key, [[id, [f, v, …]], …]]]`;
/// RESP3: a map from key to entries.
fn entries(reply: &Value) -> Vec<(&[u8], &[u8])> {
    let streams: Vec<&Value> = match reply {
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        other => array(other)
            .iter()
            .filter_map(|s| match array(s) {
                [_, v] => Some(v),
                _ => None,
            })
            .collect(),
    };
    let mut out = Vec::new();
    for e in streams.into_iter().flat_map(array) {
        let [id, fields] = array(e) else { continue };
        let Some(id) = bulk(id) else { continue };
        let f = array(fields);
        let meta = f
            .chunks(2)
            .find(|kv| kv.first().and_then(bulk) == Some(b"m"))
            .and_then(|kv| kv.get(1).and_then(bulk))
            .unwrap_or_default();
        out.push((id, meta));
    }
    out
}

struct RedisWorker<'a> {
    conn: redis::Connection,
    q: &'a RedisTasks,
    name: String,
}

impl Work for RedisWorker<'_> {
    fn step(&mut self, max: usize, process: &dyn Fn(&[u8])) -> anyhow::Result<(usize, u64)> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.name)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(POLL.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.q.tasks)
            .arg(">")
            .query(&mut self.conn)
            .context("Redis XREADGROUP failed")?;
        let batch = entries(&reply);
        if batch.is_empty() {
            return Ok((0, 0));
        }
        let mut pipe = redis::pipe();
        for (id, meta) in &batch {
            process(meta);
            pipe.cmd("XACK")
                .arg(&self.q.tasks)
                .arg(GROUP)
                .arg(*id)
                .ignore();
            pipe.cmd("XADD")
                .arg(&self.q.results)
                .arg("*")
                .arg("m")
                .arg(*meta)
                .ignore();
        }
        pipe.exec(&mut self.conn)
            .context("Redis XACK/XADD pipeline failed")?;
        // `>` only hands out new entries: nothing is redelivered here.
        Ok((batch.len(), 0))
    }
}

struct RedisCollect<'a> {
    conn: redis::Connection,
    key: &'a str,
    last: String,
}

impl Collect for RedisCollect<'_> {
    fn poll(&mut self, seen: &mut dyn FnMut(&[u8])) -> anyhow::Result<()> {
        let reply: Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1024)
            .arg("BLOCK")
            .arg(POLL.as_millis() as u64)
            .arg("STREAMS")
            .arg(self.key)
            .arg(&self.last)
            .query(&mut self.conn)
            .context("Redis XREAD failed")?;
        let batch = entries(&reply);
        for (_, meta) in &batch {
            seen(meta);
        }
        if let Some((id, _)) = batch.last() {
            self.last = String::from_utf8_lossy(id).into_owned();
        }
        Ok(())
    }
}
