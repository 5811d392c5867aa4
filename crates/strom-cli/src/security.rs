//! `strom token` and `strom acl` (docs/security.md): Strom tokens signed
//! with the group's cluster secret, their revocation, and the registry's
//! ACLs.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use strom_auth::{AclEntry, Claims, Operation, Pattern, Permission, ResourceKind, SecurityTable};
use strom_server::member_auth::{self, ClusterSecret};

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Print a new token for a user (a batch job's credential), signed
    /// with the cluster secret. Offline: it needs the secret file, not a
    /// server.
    Create(CreateArgs),
    /// Revoke a token by its id (printed by `token create`, `jti`) in the
    /// whole group; servers refuse it within `acl_refresh_ms`.
    Revoke { id: String },
}

#[derive(Args)]
pub struct CreateArgs {
    /// The principal's name (`User:<subject>` in ACLs).
    #[arg(long)]
    subject: String,
    /// How long the token is valid: 3600, 90s, 30m, 24h or 7d.
    #[arg(long, default_value = "24h")]
    ttl: String,
    /// Limit the token to these topics (names or prefixes `sim.*`; repeat or comma-separate).
    #[arg(long, value_delimiter = ',')]
    topics: Vec<String>,
    /// Limit the token to these consumer groups (names or prefixes).
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
    /// Limit the token to these operations: produce, consume, admin, or
    /// read, write, create, delete, describe, alter, all.
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// The cluster secret file. Default: `<group file>.secret`, or the
    /// copy in --data-dir.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// A member's data directory, whose cluster secret signs the token.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Print the claims (subject, id, expiry) as JSON on stderr too.
    #[arg(long)]
    verbose: bool,
}

#[derive(Subcommand)]
pub enum UserCmd {
    /// Set a Kafka SCRAM user's password (SCRAM-SHA-256 and -512); only
    /// salted hashes are stored, in the registry.
    Set {
        name: String,
        /// A file holding the password (its first line).
        #[arg(long, value_name = "FILE")]
        password_file: PathBuf,
    },
    /// Remove a SCRAM user.
    Remove { name: String },
}

#[derive(Subcommand)]
pub enum AclCmd {
    /// Add an ACL entry.
    Add(AclArgs),
    /// Remove an ACL entry (all its fields must match).
    Remove(AclArgs),
    /// List the ACLs and revoked tokens.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct AclArgs {
    /// `User:NAME`, `uid:N` or `*`.
    #[arg(long)]
    principal: String,
    /// A topic name, or a prefix ending in `*`.
    #[arg(long, conflicts_with_all = ["group", "transform", "cluster"])]
    topic: Option<String>,
    /// A consumer group name or prefix.
    #[arg(long, conflicts_with_all = ["transform", "cluster"])]
    group: Option<String>,
    /// A transform name or prefix.
    #[arg(long, conflicts_with = "cluster")]
    transform: Option<String>,
    /// The cluster itself (members, ACLs, moves).
    #[arg(long)]
    cluster: bool,
    /// read, write, create, delete, describe, alter, admin or all.
    #[arg(long)]
    operation: String,
    /// A deny entry (wins over every allow).
    #[arg(long)]
    deny: bool,
}

pub fn run_token(cmd: TokenCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create(a) => create(a, group_file),
        TokenCmd::Revoke { id } => {
            crate::connect(group_file)?.revoke_token(&id)?;
            eprintln!("revoked token {id}");
            Ok(())
        }
    }
}

fn create(a: CreateArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let path = match (&a.secret_file, &a.data_dir, &group_file) {
        (Some(f), ..) => f.clone(),
        (None, Some(d), _) => d.join(member_auth::SECRET_FILE),
        (None, None, Some(g)) => member_auth::beside(g),
        (None, None, None) => bail!(
            "no cluster secret: pass --secret-file FILE, --data-dir DIR (a member's) or --group-file FILE (its secret is FILE.secret)"
        ),
    };
    let secret = ClusterSecret::read(&path)
        .with_context(|| format!("reading the cluster secret {}", path.display()))?;
    let ttl = parse_ttl(&a.ttl)?;
    let mut claims = Claims::new(&a.subject, strom_server::now_secs(), ttl)?;
    claims.topics = a.topics;
    claims.groups = a.groups;
    claims.ops = a.ops;
    let token = secret.token_key().sign(&claims)?;
    if a.verbose {
        eprintln!("{}", serde_json::to_string(&claims)?);
    }
    println!("{token}");
    Ok(())
}

/// `3600`, `90s`, `30m`, `24h`, `7d` as seconds.
fn parse_ttl(s: &str) -> anyhow::Result<u64> {
    let (num, unit) = match s.trim().find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.trim().split_at(i),
        None => (s.trim(), "s"),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("--ttl {s}: not a number"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => bail!("--ttl {s}: unknown unit '{other}' (s, m, h or d)"),
    };
    match n.checked_mul(mult) {
        Some(secs) if secs > 0 => Ok(secs),
        _ => bail!("--ttl {s}: must be positive and at most a few centuries"),
    }
}

pub fn run_user(cmd: UserCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    use strom_auth::scram::{Mechanism, ScramCredential};
    let d = crate::connect(group_file)?;
    match cmd {
        UserCmd::Set {
            name,
            password_file,
        } => {
            let text = std::fs::read_to_string(&password_file)
                .with_context(|| format!("reading {}", password_file.display()))?;
            let password = text.lines().next().unwrap_or("").to_string();
            anyhow::ensure!(
                !password.is_empty(),
                "{} holds no password",
                password_file.display()
            );
            let creds = [Mechanism::Sha256, Mechanism::Sha512]
                .into_iter()
                .map(|m| ScramCredential::new(m, &password).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<Vec<_>>>()?;
            d.set_scram_user(&name, serde_json::to_string(&creds)?)?;
            eprintln!("set SCRAM-SHA-256 and SCRAM-SHA-512 credentials of User:{name}");
        }
        UserCmd::Remove { name } => {
            d.set_scram_user(&name, "[]".into())?;
            eprintln!("removed User:{name}");
        }
    }
    Ok(())
}

pub fn run_acl(cmd: AclCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let d = crate::connect(group_file)?;
    match cmd {
        AclCmd::Add(a) => {
            let e = entry(a)?;
            d.alter_acls(true, serde_json::to_string(&[&e])?)?;
            eprintln!("added: {e}");
        }
        AclCmd::Remove(a) => {
            let e = entry(a)?;
            d.alter_acls(false, serde_json::to_string(&[&e])?)?;
            eprintln!("removed: {e}");
        }
        AclCmd::List { json } => {
            let text = d.security_table()?;
            if json {
                println!("{text}");
                return Ok(());
            }
            let t: SecurityTable = serde_json::from_str(&text)?;
            for e in &t.acls {
                println!("{e}");
            }
            for id in &t.revoked {
                println!("revoked token {id}");
            }
        }
    }
    Ok(())
}

fn entry(a: AclArgs) -> anyhow::Result<AclEntry> {
    let (resource, name) = match (a.topic, a.group, a.transform, a.cluster) {
        (Some(t), ..) => (ResourceKind::Topic, t),
        (None, Some(g), ..) => (ResourceKind::Group, g),
        (None, None, Some(x), _) => (ResourceKind::Transform, x),
        (None, None, None, true) => (ResourceKind::Cluster, "*".to_string()),
        _ => bail!("name a resource: --topic, --group, --transform or --cluster"),
    };
    let operation = Operation::parse(&a.operation).with_context(|| {
        format!(
            "--operation {}: one of read, write, create, delete, describe, alter, admin, all",
            a.operation
        )
    })?;
    let e = AclEntry {
        principal: a.principal,
        resource,
        pattern: Pattern::parse(&name),
        operation,
        permission: match a.deny {
            true => Permission::Deny,
            false => Permission::Allow,
        },
    };
    e.check().map_err(anyhow::Error::msg)?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::parse_ttl;

    #[test]
    fn ttls_read_with_their_units() {
        assert_eq!(parse_ttl("3600").unwrap(), 3600);
        assert_eq!(parse_ttl("30m").unwrap(), 1800);
        assert_eq!(parse_ttl("24h").unwrap(), 86_400);
        assert_eq!(parse_ttl("7d").unwrap(), 604_800);
        assert!(parse_ttl("0").is_err() && parse_ttl("5y").is_err() && parse_ttl("h").is_err());
    }
}
