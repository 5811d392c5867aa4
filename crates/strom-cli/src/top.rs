//! `strom top`: the dashboard in the terminal. Reads `/api/group` and
//! `/api/history` from the HTTP endpoint of a server started with
//! `--http-listen` (the master's covers its whole group) and shows members,
//! topics with their produce and consume rates, partitions with storage,
//! and consumer lag, refreshing.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

/// The most bytes one answer may have.
const MAX_ANSWER: u64 = 64 << 20;

#[derive(Args)]
pub struct TopArgs {
    /// HTTP endpoint (HOST:PORT, or https://HOST:PORT with --tls-ca) of
    /// a server, as `strom server --http-listen` printed it. The master's
    /// shows its whole group; list several for servers of different
    /// groups.
    #[arg(
        long = "http",
        env = "STROM_HTTP",
        value_delimiter = ',',
        required = true
    )]
    http: Vec<String>,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print one frame and exit.
    #[arg(long)]
    once: bool,
    /// Print each frame as one JSON object per line (every endpoint's
    /// group snapshot and rates).
    #[arg(long)]
    json: bool,
}

pub fn run(a: TopArgs) -> anyhow::Result<()> {
    if !(a.interval.is_finite() && (0.1..=3600.0).contains(&a.interval)) {
        bail!("--interval must be between 0.1 and 3600 seconds");
    }
    let clear = !a.once && !a.json && std::io::stdout().is_terminal();
    loop {
        let frames = a
            .http
            .iter()
            .map(|h| fetch_frame(h))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut out = std::io::stdout().lock();
        if a.json {
            writeln!(out, "{}", serde_json::json!({ "endpoints": frames }))?;
        } else {
            if clear {
                write!(out, "\x1b[2J\x1b[H")?;
            }
            write!(out, "{}", render(&frames))?;
        }
        out.flush()?;
        drop(out);
        if a.once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// One endpoint's group snapshot and its newest per-topic rates.
fn fetch_frame(http: &str) -> anyhow::Result<Value> {
    let group = get_json(http, "/api/group")?;
    let history = get_json(http, "/api/history")?;
    let rates = history["points"]
        .as_array()
        .and_then(|p| p.last())
        .map(|p| p["topics"].clone())
        .unwrap_or_else(|| serde_json::json!({}));
    Ok(serde_json::json!({ "http": http, "group": group, "rates": rates }))
}

/// A connection an answer is read from: plain TCP, or TLS over it.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// GETs `path` from `[https://]host:port` and parses the JSON answer
/// (HTTP/1.0: the server closes the connection after one whole, unchunked
/// answer). Over `https://` the server's certificate must chain to
/// `--tls-ca`; a token (`STROM_TOKEN`, `--token-file`) goes as a bearer.
fn get_json(http: &str, path: &str) -> anyhow::Result<Value> {
    let (tls, rest) = match http.strip_prefix("https://") {
        Some(rest) => (true, rest),
        None => (false, http.trim_start_matches("http://")),
    };
    let addr = rest.trim_end_matches('/');
    let scheme = if tls { "https" } else { "http" };
    let what = || format!("GET {scheme}://{addr}{path}");
    let tcp = TcpStream::connect(addr)
        .with_context(|| format!("{}: is the server running with --http-listen?", what()))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut conn: Box<dyn Stream> = match tls {
        true => Box::new(tls_stream(addr, tcp).with_context(what)?),
        false => Box::new(tcp),
    };
    let auth = match strom_client::credentials::token_from_env()? {
        Some(t) => format!("Authorization: Bearer {t}\r\n"),
        None => String::new(),
    };
    write!(
        conn,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}Accept: application/json\r\n\r\n"
    )
    .with_context(what)?;
    conn.flush().with_context(what)?;
    let mut answer = Vec::new();
    match conn.take(MAX_ANSWER + 1).read_to_end(&mut answer) {
        Ok(_) => {}
        // A TLS peer that closes without close_notify, after its answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(e).with_context(what),
    }
    if answer.len() as u64 > MAX_ANSWER {
        bail!("{}: the answer is larger than {MAX_ANSWER} bytes", what());
    }
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("{}: not an HTTP answer", what()))?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    if status != "200" {
        let why = String::from_utf8_lossy(&answer[split + 4..]);
        bail!("{}: HTTP status {status}: {}", what(), why.trim());
    }
    serde_json::from_slice(&answer[split + 4..])
        .with_context(|| format!("{}: the answer is not JSON", what()))
}

/// TLS over `tcp` to `addr`, trusting `--tls-ca` (`STROM_TLS_CA`), and
/// presenting `--tls-cert` with `--tls-key` if given (mutual TLS: the
/// certificate's subject is the principal when no token is sent).
fn tls_stream(addr: &str, tcp: TcpStream) -> anyhow::Result<impl Stream> {
    use strom_server::tls::tokio_rustls::rustls::{
        pki_types::ServerName, ClientConnection, StreamOwned,
    };
    let config = strom_server::tls::client_config_from_env().context(
        "an https:// endpoint needs --tls-ca (or STROM_TLS_CA): the CA its certificate chains to",
    )??;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .with_context(|| format!("'{host}' is not a host name or address"))?;
    let conn = ClientConnection::new(config, name)?;
    Ok(StreamOwned::new(conn, tcp))
}

fn num(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{:.2}G", v / 1e9),
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn bytes(v: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0}B")
    } else {
        format!("{v:.1}{}", units[i])
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// Per-topic totals over every server's partitions and rates.
#[derive(Default)]
struct TopicRow {
    partitions: u64,
    events: u64,
    storage: u64,
    lag: u64,
    rates: [f64; 4],
}

/// What a frame shows, gathered from every endpoint's group.
#[derive(Default)]
struct View {
    head: String,
    topics: BTreeMap<String, TopicRow>,
    parts: Vec<String>,
    consumers: Vec<String>,
}

fn mean_us(h: &Value) -> String {
    match u(&h["count"]) {
        0 => "-".to_string(),
        n => format!("{:.0}µs", 1e6 * f(&h["sum"]) / n as f64),
    }
}

impl View {
    /// One server's line, and its partitions and consumers.
    fn server(&mut self, http: &str, snap: &Value) {
        let errors: u64 = snap["errors"]
            .as_array()
            .map_or(0, |e| e.iter().map(|e| u(&e["count"])).sum());
        let master = if snap["master"] == true {
            " (master)"
        } else {
            ""
        };
        self.head += &format!(
            "server {} via {http} · member {}{master} · RSS {} · {} connections · {} errors\n",
            snap["addr"].as_str().unwrap_or("?"),
            u(&snap["member"]),
            bytes(f(&snap["rss_bytes"])),
            u(&snap["connections_open"]),
            errors,
        );
        for p in snap["partitions"].as_array().into_iter().flatten() {
            self.partition(u(&snap["member"]), p);
        }
    }

    fn partition(&mut self, member: u64, p: &Value) {
        let topic = p["topic"].as_str().unwrap_or("?").to_string();
        let row = self.topics.entry(topic.clone()).or_default();
        row.partitions += 1;
        row.events += u(&p["next_offset"]).saturating_sub(u(&p["first_offset"]));
        row.storage += u(&p["storage_bytes"]);
        for c in p["consumers"].as_array().into_iter().flatten() {
            row.lag += u(&c["lag"]);
            self.consumers.push(format!(
                "{:<24} {:>5} {:<20} {:>12} {:>10}\n",
                topic,
                u(&p["partition"]),
                c["name"].as_str().unwrap_or("?"),
                u(&c["committed"]),
                u(&c["lag"])
            ));
        }
        self.parts.push(format!(
            "{:<24} {:>5} {:>6} {:<6} {:>12} {:>12} {:>10} {:>5} {:>10} {:>10}\n",
            topic,
            u(&p["partition"]),
            member,
            p["partition_type"].as_str().unwrap_or("?"),
            u(&p["first_offset"]),
            u(&p["next_offset"]),
            bytes(f(&p["storage_bytes"])),
            u(&p["segments"]),
            mean_us(&p["append_seconds"]),
            mean_us(&p["fsync_seconds"]),
        ));
    }

    /// The members the asked server knows, and those that sent no snapshot.
    fn members(&mut self, group: &Value) {
        let first = &group["servers"][0];
        for m in first["members"].as_array().into_iter().flatten() {
            let state = if m["alive"] == true { "alive" } else { "DOWN" };
            self.head += &format!(
                "  member {:<4} {:<24} {state}\n",
                u(&m["id"]),
                m["addr"].as_str().unwrap_or("?")
            );
        }
        for m in group["unreachable"].as_array().into_iter().flatten() {
            self.head += &format!(
                "  member {:<4} {:<24} no snapshot: {}\n",
                u(&m["id"]),
                m["addr"].as_str().unwrap_or("?"),
                m["error"].as_str().unwrap_or("?")
            );
        }
    }

    fn rates(&mut self, rates: &Value) {
        for (name, r) in rates.as_object().into_iter().flatten() {
            let row = self.topics.entry(name.clone()).or_default();
            for (i, k) in ["in_events", "out_events", "in_bytes", "out_bytes"]
                .iter()
                .enumerate()
            {
                row.rates[i] += f(&r[*k]);
            }
        }
    }
}

fn render(frames: &[Value]) -> String {
    let mut v = View::default();
    for fr in frames {
        let http = fr["http"].as_str().unwrap_or("?");
        for snap in fr["group"]["servers"].as_array().into_iter().flatten() {
            v.server(http, snap);
        }
        v.members(&fr["group"]);
        v.rates(&fr["rates"]);
    }
    let mut s = v.head;
    s += &format!(
        "\n{:<24} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}\n",
        "TOPIC", "PARTS", "IN ev/s", "OUT ev/s", "IN B/s", "OUT B/s", "EVENTS", "STORAGE", "LAG"
    );
    for (name, t) in &v.topics {
        s += &format!(
            "{:<24} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}\n",
            name,
            t.partitions,
            num(t.rates[0]),
            num(t.rates[1]),
            bytes(t.rates[2]),
            bytes(t.rates[3]),
            t.events,
            bytes(t.storage as f64),
            t.lag
        );
    }
    s += &format!(
        "\n{:<24} {:>5} {:>6} {:<6} {:>12} {:>12} {:>10} {:>5} {:>10} {:>10}\n",
        "PARTITION", "ID", "MEMBER", "TYPE", "FIRST", "NEXT", "STORAGE", "SEGS", "APPEND", "FSYNC"
    );
    v.parts.iter().for_each(|p| s += p);
    s += &format!(
        "\n{:<24} {:>5} {:<20} {:>12} {:>10}\n",
        "CONSUMER LAG", "PART", "NAME", "COMMITTED", "LAG"
    );
    v.consumers.iter().for_each(|c| s += c);
    s
}
