//! The launching user's access to a group it launched (docs/security.md,
//! "The easy path"): `strom cluster up --auth` and servers started by a
//! launcher (mpirun, srun, PMI, `STROM_RANK`) make the user who launched
//! them a super user and give them a token, written readable by that user
//! alone. Under a launcher on a network address with neither `--auth` nor
//! `--insecure`, `--auth` is on: the easy path is the safe one.

use std::path::{Path, PathBuf};

use anyhow::Context;
use strom_server::member_auth::ClusterSecret;
use strom_server::ServerConfig;

/// How long the launching user's token lasts.
const TOKEN_TTL_SECS: u64 = 30 * 86_400;

/// The launching user's name, the subject of their token.
pub fn user_name() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty() && !u.contains(':'))
        // SAFETY: getuid cannot fail.
        .unwrap_or_else(|| format!("uid{}", unsafe { libc::getuid() }))
}

/// Where rank 0 of a launched group writes the launching user's token:
/// `<group file>.token`.
pub fn token_beside(group_file: &Path) -> PathBuf {
    let mut name = group_file.as_os_str().to_owned();
    name.push(".token");
    PathBuf::from(name)
}

/// A token for `user`, signed with the secret in `secret`, written to
/// `path` readable by this user only (replacing what was there).
pub fn write_token(path: &Path, secret: &Path, user: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = ClusterSecret::read(secret)?.token_key();
    let claims = strom_auth::Claims::new(user, strom_server::now_secs(), TOKEN_TTL_SECS)?;
    let token = key.sign(&claims)?;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{token}")?;
    Ok(())
}

/// A launched server's security defaults. Under a launcher of two or more
/// ranks that brings no cluster secret of its own (`cluster up` brings
/// one, and its own token): on a network address with neither `auth` nor
/// `insecure`, `auth` is turned on; with `auth`, the launching user is a
/// super user on every rank. Returns that user on rank 0, which writes
/// their token once the group's secret exists.
pub fn launcher_defaults(config: &mut ServerConfig) -> Option<String> {
    if config.join.is_some() || config.cluster_secret_file.is_some() {
        return None;
    }
    let (rank, size) = config
        .rank
        .zip(config.size)
        .or_else(strom_server::rank_from_env)?;
    if size < 2 {
        return None;
    }
    let exposed = config.exposed_address().is_some();
    if exposed && !config.auth && !config.insecure {
        config.auth = true;
        eprintln!("strom server: rank {rank} of {size} on a network address: authentication is on (--auth); pass --insecure to serve without it");
    }
    if !config.auth {
        return None;
    }
    let user = user_name();
    let principal = format!("User:{user}");
    if !config.super_users.contains(&principal) {
        config.super_users.push(principal);
    }
    (rank == 0).then_some(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launched(listen: &str) -> ServerConfig {
        ServerConfig {
            listen: listen.into(),
            rank: Some(0),
            size: Some(3),
            ..ServerConfig::default()
        }
    }

    #[test]
    fn a_launched_group_on_a_network_address_turns_auth_on_for_its_user() {
        let mut c = launched("10.1.2.3:7000");
        assert_eq!(launcher_defaults(&mut c), Some(user_name()));
        assert!(c.auth);
        assert!(c.super_users.contains(&format!("User:{}", user_name())));
        assert!(c.validate().is_ok(), "{:?}", c.validate());
    }

    #[test]
    fn loopback_insecure_joiners_and_lone_servers_are_left_alone() {
        let mut c = launched("127.0.0.1:0");
        assert_eq!(launcher_defaults(&mut c), None);
        assert!(!c.auth);
        let mut c = ServerConfig {
            insecure: true,
            ..launched("10.1.2.3:7000")
        };
        assert_eq!(launcher_defaults(&mut c), None);
        assert!(!c.auth);
        let mut c = ServerConfig {
            cluster_secret_file: Some("s".into()),
            ..launched("10.1.2.3:7000")
        };
        assert_eq!(launcher_defaults(&mut c), None, "cluster up brings its own");
        let mut c = ServerConfig {
            size: Some(1),
            ..launched("10.1.2.3:7000")
        };
        assert_eq!(launcher_defaults(&mut c), None);
    }

    #[test]
    fn with_auth_on_loopback_rank_0_names_the_user_and_others_do_not() {
        let mut c = ServerConfig {
            auth: true,
            ..launched("127.0.0.1:0")
        };
        assert_eq!(launcher_defaults(&mut c), Some(user_name()));
        let mut c = ServerConfig {
            auth: true,
            rank: Some(2),
            ..launched("127.0.0.1:0")
        };
        assert_eq!(launcher_defaults(&mut c), None);
        assert!(c.super_users.contains(&format!("User:{}", user_name())));
    }
}
