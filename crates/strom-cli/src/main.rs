//! The `strom` command. Results go to stdout (JSON lines or tables);
//! diagnostics and logs go to stderr, so piped output stays clean.

mod bench;
mod cluster;
mod consume;
mod demo;
mod elastic;
mod gen;
mod group;
mod h5;
mod interrupt;
mod launch_auth;
mod load;
mod produce;
mod quota;
mod scrub;
mod security;
mod server;
mod sink;
mod stage_out;
mod status;
mod survive;
mod top;
mod topic;
mod transform;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// mimalloc, keeping freed memory warm (`strom_client::alloc`).
#[global_allocator]
static GLOBAL: strom_client::alloc::MiMalloc = strom_client::alloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "strom",
    version,
    about = "Strom: persistent event streaming for HPC workflows"
)]
struct Cli {
    /// Group file to bootstrap from (written by `strom server`).
    #[arg(long, global = true, env = "STROM_GROUP_FILE")]
    group_file: Option<PathBuf>,
    /// Address (HOST:PORT) of the server holding the registry; reaches a
    /// server started without a group file. Wins over --group-file.
    #[arg(long, global = true, env = "STROM_ADDRESS")]
    address: Option<String>,
    /// A file holding the Strom token to present (docs/security.md); the
    /// token itself may come from STROM_TOKEN instead.
    #[arg(long, global = true, value_name = "FILE", env = "STROM_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The CA (PEM) to trust `tls://` servers by; for `strom server`, the
    /// CA other members' certificates chain to (config key `tls_ca`).
    #[arg(long, global = true, value_name = "FILE", env = "STROM_TLS_CA")]
    tls_ca: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server process.
    Server(server::ServerArgs),
    /// Start or stop a local group of server processes.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Show members, topics, offsets and consumer lag.
    Status(status::StatusArgs),
    /// Check every CRC of a topic's partitions online; report damaged ranges.
    Scrub(scrub::ScrubArgs),
    /// Create, list, describe, complete or delete topics.
    #[command(subcommand)]
    Topic(topic::TopicCmd),
    /// List, describe or delete consumer groups.
    #[command(subcommand)]
    Group(group::GroupCmd),
    /// Produce JSON lines from stdin as events; prints one record per line (offset or error).
    Produce(produce::ProduceArgs),
    /// Consume events as JSON lines on stdout.
    Consume(consume::ConsumeArgs),
    /// Run an embedded server, a producer and a consumer, and print throughput.
    Demo(demo::DemoArgs),
    /// Measure produce, consume or end-to-end performance; prints numbers.
    Bench(bench::BenchArgs),
    /// Live rates, storage and consumer lag of servers started with
    /// --http-listen, refreshing in the terminal.
    Top(top::TopArgs),
    /// Generate device telemetry events at a controlled rate.
    Gen(gen::GenArgs),
    /// Check a telemetry topic written by `strom gen`: lost, duplicate,
    /// out-of-order and malformed events.
    Verify(verify::VerifyArgs),
    /// Write a topic's events into another system (PostgreSQL), exactly once.
    #[command(subcommand)]
    Sink(sink::SinkCmd),
    /// List the group's members; drain a live one or remove a dead one.
    #[command(subcommand)]
    Member(elastic::MemberCmd),
    /// Move a partition's copy to another member, online.
    #[command(subcommand)]
    Partition(elastic::PartitionCmd),
    /// Spread partitions and leaders evenly over the members,
    /// by bytes stored and recent traffic; shows the plan first.
    Rebalance(elastic::RebalanceArgs),
    /// Grow and shrink the group from its load, by a policy: start members
    /// through a launcher, drain the ones it started (docs/elasticity.md).
    Regulate(elastic::regulate::RegulateArgs),
    /// Define, list or delete in-transit transforms, run by the servers
    /// that lead the source partitions.
    #[command(subcommand)]
    Transform(transform::TransformCmd),
    /// Create (offline, with the cluster secret) or revoke Strom tokens.
    #[command(subcommand)]
    Token(security::TokenCmd),
    /// Add, remove or list ACLs (who may do what to which topics, groups,
    /// transforms and the cluster).
    #[command(subcommand)]
    Acl(security::AclCmd),
    /// Set or remove Kafka SCRAM users (passwords kept salted and hashed).
    #[command(subcommand)]
    User(security::UserCmd),
    /// Set, list or remove quotas: produce and consume bytes per second
    /// and stored bytes, per principal, topic or topic prefix.
    #[command(subcommand)]
    Quota(quota::QuotaCmd),
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STROM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// A command that already said what happened on stderr (or must stay
/// quiet, as on a broken pipe) and wants this exit code.
#[derive(Debug)]
pub(crate) struct Exit(pub i32);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// `--address` / `STROM_ADDRESS`, read by [`connect`].
static ADDRESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The error and its causes, each once: a cause whose text the message
/// already holds (an I/O error that prints its source) is not repeated.
fn error_text(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if msg.contains(&s) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&s);
    }
    msg
}

/// Drops SIGINT and SIGTERM handlers a shared library installed while
/// loading: Debian's libfabric pulls in libinfinipath, whose constructor
/// installs handlers that `exit(1)`, and the handlers Strom installs later
/// (graceful shutdown, Ctrl-C in `consume`) would call them first. A signal
/// the parent set to be ignored stays ignored.
fn reset_library_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction with a zeroed struct only reads the current
        // disposition; SIG_DFL is always a valid disposition.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
            {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

fn main() {
    strom_client::alloc::keep_freed_memory_warm();
    reset_library_signal_handlers();
    let cli = Cli::parse();
    if let Some(a) = cli.address {
        let _ = ADDRESS.set(a);
    }
    if let Some(f) = &cli.token_file {
        // Read by the client library when it connects (before any thread
        // of this process reads the environment).
        std::env::set_var(strom_client::credentials::TOKEN_FILE_ENV, f);
    }
    if let Some(f) = &cli.tls_ca {
        // Read by the transports when a client or server builds them.
        std::env::set_var(strom_client::TLS_CA_ENV, f);
    }
    let result = match cli.command {
        Command::Server(a) => {
            init_logging("info,openraft=off");
            server::run(a, cli.group_file, cli.tls_ca)
        }
        Command::Regulate(a) => {
            // Its decisions are logged at info.
            init_logging("info,strom_client=warn");
            elastic::regulate::run(a, cli.group_file)
        }
        Command::Consume(a) => {
            // consume reports an unreachable partition itself, once.
            init_logging("warn,strom_client::subscription=error");
            consume::run(a, cli.group_file)
        }
        other => {
            init_logging("warn");
            match other {
                Command::Topic(c) => topic::run(c, cli.group_file),
                Command::Group(c) => group::run(c, cli.group_file),
                Command::Cluster(c) => cluster::run(c, cli.group_file),
                Command::Status(a) => status::run(a, cli.group_file),
                Command::Scrub(a) => scrub::run(a, cli.group_file),
                Command::Produce(a) => produce::run(a, cli.group_file),
                Command::Demo(a) => demo::run(a),
                Command::Bench(a) => bench::run(a, cli.group_file),
                Command::Top(a) => top::run(a),
                Command::Gen(a) => gen::run(a, cli.group_file),
                Command::Verify(a) => verify::run(a, cli.group_file),
                Command::Sink(c) => sink::run(c, cli.group_file),
                Command::Member(c) => elastic::run_member(c, cli.group_file),
                Command::Partition(c) => elastic::run_partition(c, cli.group_file),
                Command::Rebalance(a) => elastic::rebalance::run(a, cli.group_file),
                Command::Transform(c) => transform::run(c, cli.group_file),
                Command::Token(c) => security::run_token(c, cli.group_file),
                Command::Acl(c) => security::run_acl(c, cli.group_file),
                Command::User(c) => security::run_user(c, cli.group_file),
                Command::Quota(c) => quota::run(c, cli.group_file),
                Command::Server(_) | Command::Consume(_) | Command::Regulate(_) => {
                    unreachable!("handled above")
                }
            }
        }
    };
    if let Err(e) = result {
        if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
            std::process::exit(*code);
        }
        eprintln!("strom: error: {}", error_text(&e));
        std::process::exit(1);
    }
}

/// True when `--address` / `STROM_ADDRESS` names a server.
pub(crate) fn has_address() -> bool {
    ADDRESS.get().is_some()
}

/// Connects to the server at `--address` / `STROM_ADDRESS`, or else to the
/// group named by `--group-file` / `STROM_GROUP_FILE`.
pub(crate) fn connect(group_file: Option<PathBuf>) -> anyhow::Result<strom_client::Driver> {
    if let Some(addr) = ADDRESS.get() {
        return Ok(strom_client::Driver::connect_addr(addr)?);
    }
    let path = group_file.ok_or_else(|| {
        anyhow::anyhow!(
            "no server given: pass --group-file FILE (the group file `strom server` writes) \
             or --address HOST:PORT, or set STROM_GROUP_FILE or STROM_ADDRESS"
        )
    })?;
    Ok(strom_client::Driver::connect(&path)?)
}
