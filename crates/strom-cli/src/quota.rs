//! `strom quota` (docs/quotas.md): set, list and remove the registry's
//! quotas on produce and consume bytes per second and stored bytes, per
//! principal (`--user`), topic or topic prefix. Changing them needs
//! `alter` on the cluster, listing them `describe`.

use anyhow::bail;
use clap::{Args, Subcommand};
use strom_server::quota::{QuotaChange, QuotaKey, QuotaLimits, QuotaTable};

use crate::bench::baseline::parse_size;

#[derive(Subcommand)]
pub enum QuotaCmd {
    /// Set limits of a principal, topic or topic prefix (limits not given
    /// keep their value).
    Set(SetArgs),
    /// Remove every limit of a principal, topic or topic prefix.
    Remove(KeyArgs),
    /// List the quotas.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct KeyArgs {
    /// A principal as ACLs name it (`User:alice`, `uid:1000`; a bare name
    /// means `User:NAME`), or `*` for every principal without its own.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// One topic: all its traffic together.
    #[arg(long, value_name = "NAME")]
    topic: Option<String>,
    /// Every topic whose name starts with P, together.
    #[arg(long, value_name = "P")]
    topic_prefix: Option<String>,
}

#[derive(Args)]
pub struct SetArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Bytes per second produced (`2MiB`, `500k`, `1048576`).
    #[arg(long, value_name = "BYTES")]
    produce_bytes_per_sec: Option<String>,
    /// Bytes per second consumed.
    #[arg(long, value_name = "BYTES")]
    consume_bytes_per_sec: Option<String>,
    /// Bytes stored on each member (topics and prefixes only).
    #[arg(long, value_name = "BYTES")]
    stored_bytes: Option<String>,
    /// Weight (1 to 1000) of the key's appends and data reads when the
    /// server is contended; everything else weighs 1.
    #[arg(long, value_name = "WEIGHT")]
    priority: Option<u64>,
}

fn key(a: KeyArgs) -> anyhow::Result<QuotaKey> {
    let k = match (a.user, a.topic, a.topic_prefix) {
        (Some(u), None, None) => QuotaKey::User(principal(u)),
        (None, Some(t), None) => QuotaKey::Topic(t),
        (None, None, Some(p)) => QuotaKey::TopicPrefix(p),
        _ => bail!("name exactly one of --user, --topic or --topic-prefix"),
    };
    k.check().map_err(anyhow::Error::msg)?;
    Ok(k)
}

/// `alice` means `User:alice`; `User:x`, `uid:N` and `*` stay.
fn principal(u: String) -> String {
    match u == "*" || u.contains(':') {
        true => u,
        false => format!("User:{u}"),
    }
}

fn size(v: Option<String>) -> anyhow::Result<Option<u64>> {
    v.map(|s| parse_size(&s)).transpose()
}

fn change(cmd: QuotaCmd) -> anyhow::Result<Option<QuotaChange>> {
    let c = match cmd {
        QuotaCmd::Set(a) => QuotaChange::Set {
            key: key(a.key)?,
            limits: QuotaLimits {
                produce_bytes_per_sec: size(a.produce_bytes_per_sec)?,
                consume_bytes_per_sec: size(a.consume_bytes_per_sec)?,
                stored_bytes: size(a.stored_bytes)?,
                priority: a.priority,
            },
        },
        QuotaCmd::Remove(k) => QuotaChange::Remove { key: key(k)? },
        QuotaCmd::List { .. } => return Ok(None),
    };
    c.check().map_err(anyhow::Error::msg)?;
    Ok(Some(c))
}

pub fn run(cmd: QuotaCmd, group_file: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let json = matches!(cmd, QuotaCmd::List { json: true });
    let change = change(cmd)?;
    let d = crate::connect(group_file)?;
    if let Some(c) = change {
        d.alter_quota(serde_json::to_string(&c)?)?;
        match c {
            QuotaChange::Set { key, .. } => eprintln!("set: {key}"),
            QuotaChange::Remove { key } => eprintln!("removed: {key}"),
        }
        return Ok(());
    }
    let text = d.quota_table()?;
    if json {
        println!("{text}");
        return Ok(());
    }
    let t: QuotaTable = serde_json::from_str(&text)?;
    for (k, l) in &t.quotas {
        println!("{}", line(k, l));
    }
    Ok(())
}

/// One quota as `list` prints it.
fn line(k: &QuotaKey, l: &QuotaLimits) -> String {
    let show = |v: Option<u64>| v.map_or("-".to_string(), |n| n.to_string());
    format!(
        "{k}\tproduce_bytes_per_sec={}\tconsume_bytes_per_sec={}\tstored_bytes={}\tpriority={}",
        show(l.produce_bytes_per_sec),
        show(l.consume_bytes_per_sec),
        show(l.stored_bytes),
        show(l.priority)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(user: Option<&str>, topic: Option<&str>, prefix: Option<&str>) -> KeyArgs {
        KeyArgs {
            user: user.map(Into::into),
            topic: topic.map(Into::into),
            topic_prefix: prefix.map(Into::into),
        }
    }

    #[test]
    fn a_key_names_one_thing_and_a_bare_user_is_a_user_principal() {
        assert_eq!(
            key(keys(Some("alice"), None, None)).unwrap(),
            QuotaKey::User("User:alice".into())
        );
        assert_eq!(
            key(keys(Some("*"), None, None)).unwrap(),
            QuotaKey::User("*".into())
        );
        assert!(key(keys(Some("a"), Some("t"), None)).is_err());
        assert!(key(keys(None, None, None)).is_err());
        assert!(key(keys(None, Some("../etc"), None)).is_err());
    }

    #[test]
    fn set_needs_a_limit_and_sizes_take_units() {
        let set = |p: Option<&str>| {
            change(QuotaCmd::Set(SetArgs {
                key: keys(None, Some("t"), None),
                produce_bytes_per_sec: p.map(Into::into),
                consume_bytes_per_sec: None,
                stored_bytes: None,
                priority: None,
            }))
        };
        assert!(set(None).is_err());
        assert!(set(Some("lots")).is_err());
        match set(Some("2MiB")).unwrap() {
            Some(QuotaChange::Set { limits, .. }) => {
                assert_eq!(limits.produce_bytes_per_sec, Some(2 << 20))
            }
            other => panic!("{other:?}"),
        }
    }
}
