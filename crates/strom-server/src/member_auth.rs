//! What members trust (docs/safety.md, "What members trust"): a group's
//! members share a cluster secret, and a server proves it holds it, once per
//! connection, before the connection may carry member-to-member requests.
//!
//! The proof is an HMAC-SHA256 challenge-response folded into `Hello`
//! (docs/protocol.md, "Members"): the connecting member sends a fresh nonce
//! in its `Hello`, the server answers with its own, and the member sends
//! `ProveMember`: the HMAC, keyed by the secret, of a label, both nonces
//! and the member id it claims. The server checks it in constant time and
//! answers with its own HMAC under another label, so each side knows the
//! other holds the secret. The secret itself never crosses the wire, and a
//! proof is worth nothing on another connection (fresh nonces).
//!
//! This module owns the secret's file format (text, at least 32 bytes,
//! kept 0600), where it lives (`cluster.secret` in a data dir, and
//! `<group file>.secret` beside a group file) and the proofs. It never
//! touches a socket.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::RwLock;
use sha2::Sha256;
use strom_proto::ErrorCode;

use crate::error::ServerError;

/// The secret's file in a member's data dir.
pub const SECRET_FILE: &str = "cluster.secret";
/// The id a member claims before it has one (a first join).
pub const NO_ID: u32 = u32::MAX;
/// Bytes of a fresh nonce.
pub const NONCE_LEN: usize = 32;
/// Nonces a server accepts: at least 16 bytes, at most 64.
pub const NONCE_RANGE: std::ops::RangeInclusive<usize> = 16..=64;
/// A secret is at least this many bytes of text (a generated one is 64 hex
/// digits), and a secret file at most `MAX_SECRET` bytes.
const MIN_SECRET: usize = 32;
const MAX_SECRET: u64 = 4096;
const MEMBER_LABEL: &[u8] = b"strom member proof v1";
const SERVER_LABEL: &[u8] = b"strom server proof v1";

/// A group's cluster secret. Its `Debug` never shows it.
pub struct ClusterSecret(Vec<u8>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

fn bad(m: String) -> ServerError {
    ServerError::coded(ErrorCode::INVALID_ARGUMENT, m)
}

/// `n` random bytes from the operating system.
fn random(n: usize) -> Result<Vec<u8>, ServerError> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| {
        ServerError::coded(
            ErrorCode::INTERNAL,
            format!("the operating system gave no random bytes: {e}"),
        )
    })?;
    Ok(b)
}

/// A fresh nonce for one handshake.
pub fn nonce() -> Result<Bytes, ServerError> {
    random(NONCE_LEN).map(Bytes::from)
}

/// Where member 0 (and `strom cluster up`) leave the secret for the
/// servers that join through `group_file`: `<group file>.secret`.
pub fn beside(group_file: &Path) -> PathBuf {
    let mut name = group_file.as_os_str().to_owned();
    name.push(".secret");
    PathBuf::from(name)
}

impl ClusterSecret {
    /// A new random secret: 32 bytes, as 64 hex digits.
    pub fn generate() -> Result<Self, ServerError> {
        let hex: String = random(32)?.iter().map(|b| format!("{b:02x}")).collect();
        Ok(ClusterSecret(hex.into_bytes()))
    }

    /// Reads a secret file (surrounding whitespace ignored). A file others
    /// may read is used, with a warning: the secret may have leaked.
    pub fn read(path: &Path) -> Result<Self, ServerError> {
        let meta = std::fs::metadata(path).map_err(|e| {
            ServerError::io(format!("reading cluster secret {}", path.display()), e)
        })?;
        if meta.len() > MAX_SECRET {
            return Err(bad(format!(
                "cluster secret {} holds {} bytes; a secret file holds at most {MAX_SECRET}",
                path.display(),
                meta.len()
            )));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(file = %path.display(), mode = format!("{:o}", meta.permissions().mode() & 0o777), "the cluster secret is readable by other users; chmod 600 it");
        }
        let text = std::fs::read(path).map_err(|e| {
            ServerError::io(format!("reading cluster secret {}", path.display()), e)
        })?;
        let secret = text.trim_ascii();
        if secret.len() < MIN_SECRET {
            return Err(bad(format!(
                "cluster secret {} holds {} bytes; a secret is at least {MIN_SECRET} (e.g. `openssl rand -hex 32`)",
                path.display(),
                secret.len()
            )));
        }
        Ok(ClusterSecret(secret.to_vec()))
    }

    /// Writes the secret to `path`, readable by this user only (0600),
    /// atomically: a reader sees the old file or the whole new one.
    pub fn write(&self, path: &Path) -> Result<(), ServerError> {
        let ctx = |what: &str| format!("{what} cluster secret {}", path.display());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| ServerError::io(ctx("creating the directory of"), e))?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| ServerError::io(ctx("creating a temp file for"), e))?;
        f.write_all(&self.0)
            .and_then(|_| f.write_all(b"\n"))
            .and_then(|_| f.sync_all())
            .map_err(|e| ServerError::io(ctx("writing"), e))?;
        std::fs::rename(&tmp, path).map_err(|e| ServerError::io(ctx("renaming into"), e))
    }

    fn mac(
        &self,
        label: &[u8],
        server_nonce: &[u8],
        client_nonce: &[u8],
        member: u32,
    ) -> Hmac<Sha256> {
        // HMAC takes a key of any length; this cannot fail.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        for part in [label, server_nonce, client_nonce] {
            m.update(&(part.len() as u32).to_le_bytes());
            m.update(part);
        }
        m.update(&member.to_le_bytes());
        m
    }

    /// The key Strom tokens of this group are signed and checked with.
    pub fn token_key(&self) -> strom_auth::TokenKey {
        strom_auth::TokenKey::from_secret(&self.0)
    }

    /// What a member claiming `member` sends in `ProveMember`.
    pub fn member_proof(&self, server_nonce: &[u8], client_nonce: &[u8], member: u32) -> Bytes {
        let m = self.mac(MEMBER_LABEL, server_nonce, client_nonce, member);
        Bytes::copy_from_slice(&m.finalize().into_bytes())
    }

    /// Whether `proof` is the member proof for `member` (constant time).
    pub fn check_member_proof(
        &self,
        server_nonce: &[u8],
        client_nonce: &[u8],
        member: u32,
        proof: &[u8],
    ) -> bool {
        self.mac(MEMBER_LABEL, server_nonce, client_nonce, member)
            .verify_slice(proof)
            .is_ok()
    }

    /// What the server `member` answers a valid proof with.
    pub fn server_proof(&self, server_nonce: &[u8], client_nonce: &[u8], member: u32) -> Bytes {
        let m = self.mac(SERVER_LABEL, server_nonce, client_nonce, member);
        Bytes::copy_from_slice(&m.finalize().into_bytes())
    }

    /// Whether `proof` is the server proof of `member` (constant time).
    pub fn check_server_proof(
        &self,
        server_nonce: &[u8],
        client_nonce: &[u8],
        member: u32,
        proof: &[u8],
    ) -> bool {
        self.mac(SERVER_LABEL, server_nonce, client_nonce, member)
            .verify_slice(proof)
            .is_ok()
    }

    fn same(&self, other: &ClusterSecret) -> bool {
        // Compared through their HMACs, so not in a data-dependent time.
        let probe = [0u8; NONCE_LEN];
        other.check_member_proof(&probe, &probe, 0, &self.member_proof(&probe, &probe, 0))
    }
}

/// This server's standing toward the others: the cluster secret once it is
/// known, and the member id it claims on the connections it opens.
pub struct Identity {
    secret: RwLock<Option<Arc<ClusterSecret>>>,
    claim: AtomicU32,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            secret: RwLock::new(None),
            claim: AtomicU32::new(NO_ID),
        }
    }
}

impl Identity {
    pub fn new(secret: Option<ClusterSecret>, claim: u32) -> Self {
        Identity {
            secret: RwLock::new(secret.map(Arc::new)),
            claim: AtomicU32::new(claim),
        }
    }

    pub fn secret(&self) -> Option<Arc<ClusterSecret>> {
        self.secret.read().clone()
    }

    pub fn set_secret(&self, s: ClusterSecret) {
        *self.secret.write() = Some(Arc::new(s));
    }

    /// The id this server claims on connections it opens from now on.
    pub fn claim(&self) -> u32 {
        self.claim.load(Ordering::Acquire)
    }

    pub fn set_claim(&self, id: u32) {
        self.claim.store(id, Ordering::Release);
    }
}

/// Where a starting server's secret comes from (docs/configuration.md,
/// `cluster_secret_file`), in order: its data dir (a restart); the file it
/// was given; for the first server of a new group, a new secret. Whatever
/// it was, it is kept in the data dir (0600), and member 0 leaves it beside
/// its group file for the servers that join. `None`: a joining server
/// without one yet; it reads `<group file>.secret` before each join
/// ([`secret_beside`]).
pub fn load_secret(
    data_dir: &Path,
    given: Option<&Path>,
    first: bool,
    group_file: Option<&Path>,
) -> Result<Option<ClusterSecret>, ServerError> {
    let kept = data_dir.join(SECRET_FILE);
    let secret = if kept.exists() {
        let s = ClusterSecret::read(&kept)?;
        if let Some(g) = given {
            if !ClusterSecret::read(g)?.same(&s) {
                return Err(bad(format!(
                    "--cluster-secret-file {} differs from the secret of the group this data dir belongs to ({}); a member of another group starts on an empty data dir",
                    g.display(),
                    kept.display()
                )));
            }
        }
        Some(s)
    } else if let Some(g) = given {
        let s = ClusterSecret::read(g)?;
        s.write(&kept)?;
        Some(s)
    } else if first {
        let s = ClusterSecret::generate()?;
        s.write(&kept)?;
        tracing::info!(file = %kept.display(), "created the group's cluster secret");
        Some(s)
    } else {
        None
    };
    if let (true, Some(s), Some(g)) = (first, &secret, group_file) {
        s.write(&beside(g))?;
    }
    Ok(secret)
}

/// The secret member 0 left beside `group_file`, if it is there (a stale
/// one from an earlier group fails its proof and is read again next time).
pub fn secret_beside(group_file: &Path) -> Result<ClusterSecret, ServerError> {
    ClusterSecret::read(&beside(group_file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_only_for_its_secret_nonces_and_member() {
        let s = ClusterSecret::generate().unwrap();
        let other = ClusterSecret::generate().unwrap();
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        let p = s.member_proof(&a, &b, 3);
        assert!(s.check_member_proof(&a, &b, 3, &p));
        assert!(!other.check_member_proof(&a, &b, 3, &p));
        assert!(!s.check_member_proof(&b, &a, 3, &p));
        assert!(!s.check_member_proof(&a, &b, 4, &p));
        assert!(!s.check_member_proof(&a, &b, 3, &p[..31]));
        assert!(!s.check_server_proof(&a, &b, 3, &p), "labels differ");
    }

    #[test]
    fn a_written_secret_reads_back_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        let s = ClusterSecret::generate().unwrap();
        s.write(&f).unwrap();
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(ClusterSecret::read(&f).unwrap().same(&s));
        std::fs::write(&f, "short").unwrap();
        assert!(ClusterSecret::read(&f).is_err());
    }
}
