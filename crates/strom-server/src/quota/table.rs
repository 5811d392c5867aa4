//! The quota table (docs/quotas.md): which limits apply to whom, as the
//! registry records them and every member enforces them. Pure values and
//! the one matching rule; no clock, no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most quota entries a group holds.
pub const MAX_QUOTAS: usize = 10_000;

/// Longest topic name or prefix a quota names (a topic name's limit).
const MAX_NAME: usize = 200;

/// What a quota is about.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum QuotaKey {
    /// A principal as ACLs name it (`User:alice`, `uid:1000`), or `*`:
    /// every principal without a quota of its own, each on its own.
    User(String),
    /// One topic: every principal's traffic to it together.
    Topic(String),
    /// Every topic whose name starts with the prefix, together.
    TopicPrefix(String),
}

impl QuotaKey {
    /// Whether the key is well formed; why not, if not.
    pub fn check(&self) -> Result<(), String> {
        match self {
            QuotaKey::User(p) if p == "*" => Ok(()),
            QuotaKey::User(p) => match strom_auth::principal::valid_pattern(p) {
                true => Ok(()),
                false => Err(format!(
                    "'{p}' is not a principal: name one as ACLs do (User:NAME, uid:N) or '*'"
                )),
            },
            QuotaKey::Topic(t) => crate::names::check_topic_name(t).map_err(|e| e.to_string()),
            QuotaKey::TopicPrefix(p) => {
                let ok = p.len() <= MAX_NAME
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                match ok {
                    true => Ok(()),
                    false => Err(format!(
                        "topic prefix '{p}': at most {MAX_NAME} characters from [A-Za-z0-9._-]"
                    )),
                }
            }
        }
    }
}

impl std::fmt::Display for QuotaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaKey::User(p) => write!(f, "user {p}"),
            QuotaKey::Topic(t) => write!(f, "topic {t}"),
            QuotaKey::TopicPrefix(p) => write!(f, "topic prefix {p}*"),
        }
    }
}

/// The limits of one key; `None`: unlimited.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consume_bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    /// The weight of the key's appends and data reads when the server's
    /// disk and network are contended (1 to `MAX_PRIORITY`; unset: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u64>,
}

/// The highest priority (weight) a key may have.
pub const MAX_PRIORITY: u64 = 1000;

impl QuotaLimits {
    pub fn is_empty(&self) -> bool {
        *self == QuotaLimits::default()
    }

    /// The limits of `self` with those `other` sets replaced.
    pub fn merged(self, other: QuotaLimits) -> QuotaLimits {
        QuotaLimits {
            produce_bytes_per_sec: other.produce_bytes_per_sec.or(self.produce_bytes_per_sec),
            consume_bytes_per_sec: other.consume_bytes_per_sec.or(self.consume_bytes_per_sec),
            stored_bytes: other.stored_bytes.or(self.stored_bytes),
            priority: other.priority.or(self.priority),
        }
    }
}

/// A change to the table, as `strom quota set|remove` sends it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QuotaChange {
    /// Sets the given limits of `key` (limits not given keep their value).
    Set { key: QuotaKey, limits: QuotaLimits },
    /// Removes every limit of `key`.
    Remove { key: QuotaKey },
}

impl QuotaChange {
    pub fn check(&self) -> Result<(), String> {
        match self {
            QuotaChange::Set { key, limits } => {
                key.check()?;
                if limits.is_empty() {
                    return Err("a quota sets at least one limit".into());
                }
                let zero =
                    [limits.produce_bytes_per_sec, limits.consume_bytes_per_sec].contains(&Some(0));
                if zero {
                    return Err(
                        "a rate quota is at least 1 byte per second (remove it for no limit)"
                            .into(),
                    );
                }
                if limits.priority.is_some_and(|p| p == 0 || p > MAX_PRIORITY) {
                    return Err(format!("a priority is 1 to {MAX_PRIORITY}"));
                }
                if limits.stored_bytes.is_some() && matches!(key, QuotaKey::User(_)) {
                    return Err("stored-bytes quotas apply to topics and topic prefixes: stored bytes are not attributed to the principal that wrote them".into());
                }
                Ok(())
            }
            QuotaChange::Remove { key } => key.check(),
        }
    }
}

/// Every quota of the group.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaTable {
    /// Grows with every change; members fetch the table when it moved.
    #[serde(default)]
    pub version: u64,
    #[serde(default, with = "entries")]
    pub quotas: BTreeMap<QuotaKey, QuotaLimits>,
}

/// The map as a list of `{key, limits}`, since JSON keys are strings.
mod entries {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Entry {
        key: QuotaKey,
        limits: QuotaLimits,
    }

    pub fn serialize<S: serde::Serializer>(
        m: &BTreeMap<QuotaKey, QuotaLimits>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<Entry> = m
            .iter()
            .map(|(key, limits)| Entry {
                key: key.clone(),
                limits: *limits,
            })
            .collect();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<QuotaKey, QuotaLimits>, D::Error> {
        let v: Vec<Entry> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|e| (e.key, e.limits)).collect())
    }
}

/// One kind of limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limit {
    Produce,
    Consume,
    Stored,
    Priority,
}

impl Limit {
    pub fn name(self) -> &'static str {
        match self {
            Limit::Produce => "produce",
            Limit::Consume => "consume",
            Limit::Stored => "stored",
            Limit::Priority => "priority",
        }
    }
}

impl QuotaLimits {
    /// The limit of one kind, if set.
    pub fn get(&self, kind: Limit) -> Option<u64> {
        match kind {
            Limit::Produce => self.produce_bytes_per_sec,
            Limit::Consume => self.consume_bytes_per_sec,
            Limit::Stored => self.stored_bytes,
            Limit::Priority => self.priority,
        }
    }
}

/// The quota of one kind that applies to a request, and the meter it
/// counts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applies {
    /// The meter's name: the key, or for `*` the key and the principal.
    pub meter: String,
    pub key: QuotaKey,
    pub limit: u64,
}

impl QuotaTable {
    pub fn is_empty(&self) -> bool {
        *self == QuotaTable::default()
    }

    /// Applies `change` (checked by the caller); bumps the version.
    pub fn apply(&mut self, change: &QuotaChange) {
        match change {
            QuotaChange::Set { key, limits } => {
                let old = self.quotas.get(key).copied().unwrap_or_default();
                self.quotas.insert(key.clone(), old.merged(*limits));
            }
            QuotaChange::Remove { key } => {
                self.quotas.remove(key);
            }
        }
        self.version += 1;
    }

    /// The user quota of kind `kind` of `principal`: its own, else `*`'s
    /// (metered per principal), if any.
    pub fn for_user(&self, principal: &strom_auth::Principal, kind: Limit) -> Option<Applies> {
        let mut default = None;
        for (key, limits) in &self.quotas {
            let (QuotaKey::User(p), Some(limit)) = (key, limits.get(kind)) else {
                continue;
            };
            if p == "*" || p == "User:*" {
                default = Some((key, limit));
            } else if principal.matches(p) {
                return Some(Applies {
                    meter: key.to_string(),
                    key: key.clone(),
                    limit,
                });
            }
        }
        default.map(|(key, limit)| Applies {
            meter: format!("{key} as {principal}"),
            key: key.clone(),
            limit,
        })
    }

    /// The topic quota of kind `kind` of `topic`: its own, else the
    /// longest prefix's that sets one.
    pub fn for_topic(&self, topic: &str, kind: Limit) -> Option<Applies> {
        let exact = QuotaKey::Topic(topic.to_string());
        let own = self
            .quotas
            .get(&exact)
            .and_then(|l| l.get(kind))
            .map(|limit| (&exact, limit));
        let found = own.or_else(|| {
            self.quotas
                .iter()
                .filter_map(|(k, l)| match k {
                    QuotaKey::TopicPrefix(p) if topic.starts_with(p.as_str()) => {
                        l.get(kind).map(|limit| (k, limit, p.len()))
                    }
                    _ => None,
                })
                .max_by_key(|(_, _, len)| *len)
                .map(|(k, limit, _)| (k, limit))
        });
        found.map(|(key, limit)| Applies {
            meter: key.to_string(),
            key: key.clone(),
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strom_auth::{Mechanism, Principal};

    fn set(t: &mut QuotaTable, key: QuotaKey, produce: u64) {
        let limits = QuotaLimits {
            produce_bytes_per_sec: Some(produce),
            ..Default::default()
        };
        let c = QuotaChange::Set { key, limits };
        c.check().unwrap();
        t.apply(&c);
    }

    #[test]
    fn a_principal_gets_its_own_quota_else_the_default_metered_apart() {
        let mut t = QuotaTable::default();
        set(&mut t, QuotaKey::User("User:alice".into()), 10);
        set(&mut t, QuotaKey::User("*".into()), 20);
        let alice = Principal::user("alice", Mechanism::Token);
        let bob = Principal::user("bob", Mechanism::Token);
        let carol = Principal::user("carol", Mechanism::Token);
        let a = t.for_user(&alice, Limit::Produce).unwrap();
        assert_eq!(a.limit, 10);
        assert!(t.for_user(&alice, Limit::Consume).is_none());
        let b = t.for_user(&bob, Limit::Produce).unwrap();
        let c = t.for_user(&carol, Limit::Produce).unwrap();
        assert_eq!(b.limit, 20);
        assert_ne!(b.meter, c.meter, "each principal has its own meter");
        assert_eq!(t.version, 2);
    }

    #[test]
    fn a_topic_gets_its_own_quota_else_the_longest_prefix() {
        let mut t = QuotaTable::default();
        set(&mut t, QuotaKey::TopicPrefix("sim.".into()), 1);
        set(&mut t, QuotaKey::TopicPrefix("sim.big.".into()), 2);
        set(&mut t, QuotaKey::Topic("sim.big.x".into()), 3);
        let rate = |n: &str| t.for_topic(n, Limit::Produce).map(|a| a.limit);
        assert_eq!(rate("sim.a"), Some(1));
        assert_eq!(rate("sim.big.y"), Some(2));
        assert_eq!(rate("sim.big.x"), Some(3));
        assert_eq!(rate("other"), None);
    }

    #[test]
    fn set_merges_limits_and_remove_drops_the_key() {
        let mut t = QuotaTable::default();
        let key = QuotaKey::Topic("t".into());
        set(&mut t, key.clone(), 5);
        t.apply(&QuotaChange::Set {
            key: key.clone(),
            limits: QuotaLimits {
                stored_bytes: Some(9),
                ..Default::default()
            },
        });
        let l = t.quotas[&key];
        assert_eq!(
            (l.produce_bytes_per_sec, l.stored_bytes),
            (Some(5), Some(9))
        );
        t.apply(&QuotaChange::Remove { key });
        assert!(t.for_topic("t", Limit::Produce).is_none());
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<QuotaTable>(&json).unwrap(), t);
    }

    #[test]
    fn malformed_changes_are_refused() {
        let bad = [
            QuotaChange::Set {
                key: QuotaKey::User("alice".into()),
                limits: QuotaLimits {
                    produce_bytes_per_sec: Some(1),
                    ..Default::default()
                },
            },
            QuotaChange::Set {
                key: QuotaKey::Topic("../x".into()),
                limits: QuotaLimits {
                    produce_bytes_per_sec: Some(1),
                    ..Default::default()
                },
            },
            QuotaChange::Set {
                key: QuotaKey::Topic("t".into()),
                limits: QuotaLimits::default(),
            },
            QuotaChange::Set {
                key: QuotaKey::Topic("t".into()),
                limits: QuotaLimits {
                    consume_bytes_per_sec: Some(0),
                    ..Default::default()
                },
            },
            QuotaChange::Set {
                key: QuotaKey::User("User:a".into()),
                limits: QuotaLimits {
                    stored_bytes: Some(1),
                    ..Default::default()
                },
            },
            QuotaChange::Remove {
                key: QuotaKey::TopicPrefix("a/b".into()),
            },
        ];
        for c in bad {
            assert!(c.check().is_err(), "{c:?}");
        }
    }
}
