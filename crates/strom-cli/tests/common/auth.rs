//! Helpers of the security tests: tokens signed with a test server's own
//! cluster secret, and the `strom` CLI run with a clean security
//! environment. (A server's HTTP address: `http::http_addr`.)

use std::ffi::OsStr;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use super::{strom_bin, ServerProcess};

/// A token for `sub`, valid `ttl_secs`, signed with `s`'s cluster secret.
pub fn token_for(s: &ServerProcess, sub: &str, ttl_secs: u64) -> String {
    let c = strom_auth::Claims::new(sub, strom_server::now_secs(), ttl_secs).unwrap();
    let secret = s.data_dir.join(strom_server::member_auth::SECRET_FILE);
    strom_server::member_auth::ClusterSecret::read(&secret)
        .expect("the server's cluster secret")
        .token_key()
        .sign(&c)
        .unwrap()
}

/// The security settings a test's environment must not leak into the CLI.
const SECURITY_ENV: &[&str] = &[
    "STROM_TOKEN",
    "STROM_TOKEN_FILE",
    "STROM_TLS_CA",
    "STROM_TLS_CERT",
    "STROM_TLS_KEY",
];

/// `strom --group-file <s's> ARGS` with `env` (and no other security
/// setting), `stdin` written to it; its output.
pub fn cli(s: &ServerProcess, args: &[&str], env: &[(&str, &OsStr)], stdin: &str) -> Output {
    let mut c = Command::new(strom_bin());
    c.arg("--group-file").arg(&s.group_file).args(args);
    for v in SECURITY_ENV {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Its stdout, asserting `o` succeeded.
pub fn succeeded(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what} failed: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}
