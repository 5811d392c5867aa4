//! A throw-away PostgreSQL cluster for tests: `initdb` into a temporary
//! directory, then `postgres` listening only on a Unix socket in that
//! directory (no TCP port, so parallel tests never collide), stopped and
//! removed when the [`PgCluster`] is dropped, even when the test fails.
//!
//! The binaries are the newest `/usr/lib/postgresql/<version>/bin` (the
//! Debian layout; `scripts/setup.sh` installs the `postgresql` package), or
//! the directory in `STROM_PG_BIN`. `initdb` and `postgres` refuse to run
//! as root, so under root both run as the `postgres` user the package
//! creates, and the cluster's directory is handed to that user.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls, Row};

/// How long the server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The socket's port number (it only names the socket file).
const PORT: u16 = 5432;

/// A running PostgreSQL server on a private Unix socket.
pub struct PgCluster {
    _dir: tempfile::TempDir,
    root: PathBuf,
    child: Child,
}

impl PgCluster {
    /// Creates and starts a cluster; panics (with the server log) if it
    /// does not come up.
    pub fn start() -> PgCluster {
        let bin = pg_bin_dir();
        let dir = tempfile::tempdir().expect("creating the cluster's directory");
        // The postgres user must reach the directory below the tempdir.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("opening the tempdir to the postgres user");
        let root = dir.path().join("pg");
        std::fs::create_dir(&root).expect("creating the cluster root");
        let user = run_as();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid))
                .expect("handing the cluster root to the postgres user");
        }
        let data = root.join("data");
        let out = as_user(Command::new(bin.join("initdb")), user)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .arg("-D")
            .arg(&data)
            .stdin(Stdio::null())
            .output()
            .expect("running initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let log = std::fs::File::create(root.join("server.log")).expect("creating the server log");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(root.join("server.log"), Some(uid), Some(gid))
                .expect("handing the log to the postgres user");
        }
        let child = as_user(Command::new(bin.join("postgres")), user)
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&root)
            .args(["-p", &PORT.to_string()])
            .args(["-c", "listen_addresses=", "-c", "fsync=off"])
            .args(["-c", "max_connections=50"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting postgres");
        let mut pg = PgCluster {
            _dir: dir,
            root,
            child,
        };
        pg.wait_ready();
        pg
    }

    /// A connection string for the `postgres` database as user `postgres`.
    pub fn dsn(&self) -> String {
        format!(
            "host={} port={PORT} user=postgres dbname=postgres",
            self.root.display()
        )
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("polling postgres") {
                panic!("postgres exited with {status}; log:\n{}", self.log());
            }
            if self.try_query("SELECT 1").is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within {READY_TIMEOUT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `sql` (statements separated by `;`), panicking on error.
    pub fn execute(&self, sql: &str) {
        with_client(&self.dsn(), |c| async move { c.batch_execute(sql).await })
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The rows of one query, panicking on error.
    pub fn query(&self, sql: &str) -> Vec<Row> {
        self.try_query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The single bigint (or count) a query returns.
    pub fn query_i64(&self, sql: &str) -> i64 {
        let rows = self.query(sql);
        assert_eq!(rows.len(), 1, "{sql} returned {} rows", rows.len());
        rows[0].get(0)
    }

    pub fn try_query(&self, sql: &str) -> Result<Vec<Row>, tokio_postgres::Error> {
        with_client(&self.dsn(), |c| async move { c.query(sql, &[]).await })
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown, the postmaster takes its backends
        // down with it; SIGKILL if that does not end it.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens a connection on a fresh single-threaded runtime, runs `f` on it.
fn with_client<T, F, Fut>(dsn: &str, f: F) -> Result<T, tokio_postgres::Error>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(dsn, NoTls).await?;
        let driver = tokio::spawn(conn);
        let r = f(client).await;
        let _ = driver.await;
        r
    })
}

/// The newest `/usr/lib/postgresql/<version>/bin`, or `STROM_PG_BIN`.
fn pg_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STROM_PG_BIN") {
        return PathBuf::from(dir);
    }
    let base = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(base).ok().and_then(|entries| {
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let v: u32 = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("initdb").exists().then_some((v, bin))
            })
            .max_by_key(|(v, _)| *v)
    });
    match newest {
        Some((_, bin)) => bin,
        None => panic!(
            "no PostgreSQL server binaries under {} (run scripts/setup.sh, or set STROM_PG_BIN)",
            base.display()
        ),
    }
}

/// Under root: the uid and gid of the `postgres` user to run as.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    // SAFETY: getpwnam with a NUL-terminated name; the result is read at
    // once, before any other getpw* call on this thread.
    let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root and there is no 'postgres' user to run PostgreSQL as \
         (install the postgresql package: scripts/setup.sh)"
    );
    // SAFETY: non-null, points to a static passwd record.
    let pw = unsafe { &*pw };
    Some((pw.pw_uid, pw.pw_gid))
}

fn as_user(mut cmd: Command, user: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd.env_remove("PGDATA").env("LC_ALL", "C");
    cmd
}
