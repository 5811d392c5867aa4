//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server's side,
//! for the Kafka port's SASL: users' credentials are kept salted and hashed
//! ([`ScramCredential`]: salt, iterations, StoredKey, ServerKey; never the
//! password), and [`ServerExchange`] runs the two rounds of one
//! authentication.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

/// Iterations of a new credential (Kafka's minimum).
pub const ITERATIONS: u32 = 4096;
/// The most iterations a stored credential may ask for (bounds the work a
/// login costs).
pub const MAX_ITERATIONS: u32 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub fn parse(name: &str) -> Option<Mechanism> {
        match name.to_ascii_uppercase().as_str() {
            "SCRAM-SHA-256" => Some(Mechanism::Sha256),
            "SCRAM-SHA-512" => Some(Mechanism::Sha512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Mechanism::Sha512 => {
                let mut m = <Hmac<Sha512> as KeyInit>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, i)`: PBKDF2 with this HMAC, one block.
    fn hi(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut block = salt.to_vec();
        block.extend_from_slice(&1u32.to_be_bytes());
        let mut u = self.hmac(password, &block);
        let mut out = u.clone();
        for _ in 1..iterations {
            u = self.hmac(password, &u);
            out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
        }
        out
    }
}

/// A user's stored credential for one mechanism (base64 fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    pub mechanism: String,
    pub salt: String,
    pub iterations: u32,
    pub stored_key: String,
    pub server_key: String,
}

impl ScramCredential {
    /// The credential of `password` with a fresh random salt.
    pub fn new(mechanism: Mechanism, password: &str) -> Result<Self, String> {
        let mut salt = [0u8; 24];
        getrandom::fill(&mut salt).map_err(|e| format!("no randomness: {e}"))?;
        Ok(Self::derive(mechanism, password, &salt, ITERATIONS))
    }

    fn derive(mechanism: Mechanism, password: &str, salt: &[u8], iterations: u32) -> Self {
        let salted = mechanism.hi(password.as_bytes(), salt, iterations);
        Self::of_salted(mechanism, salt, iterations, &salted)
    }

    /// The credential of an already salted password (`Hi(password, salt,
    /// iterations)`), as Kafka's `AlterUserScramCredentials` sends it; the
    /// password itself never reaches the server. Checked as
    /// [`check`](Self::check) does.
    pub fn from_salted(
        mechanism: Mechanism,
        salt: &[u8],
        iterations: u32,
        salted_password: &[u8],
    ) -> Result<Self, String> {
        if salted_password.len() != mechanism.hash(b"").len() {
            return Err(format!(
                "a {} salted password is {} bytes",
                mechanism.name(),
                mechanism.hash(b"").len()
            ));
        }
        let c = Self::of_salted(mechanism, salt, iterations, salted_password);
        c.check()?;
        Ok(c)
    }

    fn of_salted(mechanism: Mechanism, salt: &[u8], iterations: u32, salted: &[u8]) -> Self {
        let client_key = mechanism.hmac(salted, b"Client Key");
        ScramCredential {
            mechanism: mechanism.name().to_string(),
            salt: B64.encode(salt),
            iterations,
            stored_key: B64.encode(mechanism.hash(&client_key)),
            server_key: B64.encode(mechanism.hmac(salted, b"Server Key")),
        }
    }

    /// Checks the fields of a credential received from a client or a file.
    pub fn check(&self) -> Result<(), String> {
        let m = Mechanism::parse(&self.mechanism).ok_or("unknown SCRAM mechanism")?;
        let len = m.hash(b"").len();
        let ok = |f: &str| B64.decode(f).map(|v| v.len()).unwrap_or(0);
        if !(ITERATIONS..=MAX_ITERATIONS).contains(&self.iterations) {
            return Err(format!(
                "iterations must be {ITERATIONS} to {MAX_ITERATIONS}"
            ));
        }
        if ok(&self.salt) == 0 || ok(&self.stored_key) != len || ok(&self.server_key) != len {
            return Err(
                "a SCRAM credential's salt and keys must be base64 of the right length".into(),
            );
        }
        Ok(())
    }
}

/// A change to one user's SCRAM credentials, applied at once by the
/// registry: all of them replaced (`strom user set`; empty removes the
/// user), or single mechanisms set and removed (Kafka's
/// `AlterUserScramCredentials`), the others kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ScramUpdate {
    Replace(Vec<ScramCredential>),
    Alter {
        set: Vec<ScramCredential>,
        remove: Vec<String>,
    },
}

impl ScramUpdate {
    /// The user's credentials after this change to `current`.
    pub fn apply(self, current: &[ScramCredential]) -> Vec<ScramCredential> {
        match self {
            ScramUpdate::Replace(all) => all,
            ScramUpdate::Alter { set, remove } => {
                let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
                let mut out: Vec<ScramCredential> = current
                    .iter()
                    .filter(|c| !remove.iter().any(|m| same(m, &c.mechanism)))
                    .filter(|c| !set.iter().any(|s| same(&s.mechanism, &c.mechanism)))
                    .cloned()
                    .collect();
                out.extend(set);
                out.sort_by(|a, b| a.mechanism.cmp(&b.mechanism));
                out
            }
        }
    }
}

/// One authentication in progress, after the server's first message.
pub struct ServerExchange {
    mechanism: Mechanism,
    user: String,
    client_nonce: String,
    nonce: String,
    auth_start: String,
    cred: ScramCredential,
}

fn attr(msg: &str, key: char) -> Option<&str> {
    msg.split(',')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

impl ServerExchange {
    /// Reads the client's first message and answers the server's first;
    /// `lookup` finds a user's credential for this mechanism.
    pub fn start(
        mechanism: Mechanism,
        client_first: &str,
        lookup: impl Fn(&str) -> Option<ScramCredential>,
    ) -> Result<(ServerExchange, String), String> {
        let bare = client_first
            .strip_prefix("n,,")
            .or_else(|| client_first.strip_prefix("y,,"))
            .ok_or("SCRAM: channel binding and authorization ids are not supported")?;
        let user = attr(bare, 'n').ok_or("SCRAM: no user name")?;
        let user = user.replace("=2C", ",").replace("=3D", "=");
        let client_nonce = attr(bare, 'r')
            .filter(|n| !n.is_empty())
            .ok_or("SCRAM: no nonce")?;
        let cred = lookup(&user).ok_or_else(|| {
            format!(
                "SCRAM: no {} credential for user '{user}'",
                mechanism.name()
            )
        })?;
        cred.check()?;
        let mut ours = [0u8; 18];
        getrandom::fill(&mut ours).map_err(|e| format!("no randomness: {e}"))?;
        let nonce = format!("{client_nonce}{}", B64.encode(ours));
        let server_first = format!("r={nonce},s={},i={}", cred.salt, cred.iterations);
        let ex = ServerExchange {
            mechanism,
            user,
            client_nonce: client_nonce.to_string(),
            nonce,
            auth_start: format!("{bare},{server_first}"),
            cred,
        };
        Ok((ex, server_first))
    }

    /// The user this exchange is about.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Checks the client's proof; the server's final message if it holds.
    pub fn finish(&self, client_final: &str) -> Result<String, String> {
        let (without_proof, proof) = client_final
            .rsplit_once(",p=")
            .ok_or("SCRAM: the final message carries no proof")?;
        // The combined nonce, as RFC 5802 has it; librdkafka 2.0 sends its
        // own nonce again in front of it, which binds to ours just as well.
        let echoed = attr(without_proof, 'r').unwrap_or_default();
        let doubled = echoed.strip_prefix(self.client_nonce.as_str()) == Some(self.nonce.as_str());
        if echoed != self.nonce && !doubled {
            return Err("SCRAM: the nonce does not match".into());
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| "SCRAM: the proof is not base64")?;
        let m = self.mechanism;
        let stored = B64
            .decode(&self.cred.stored_key)
            .map_err(|_| "bad stored key")?;
        let server_key = B64
            .decode(&self.cred.server_key)
            .map_err(|_| "bad server key")?;
        let auth = format!("{},{without_proof}", self.auth_start);
        let signature = m.hmac(&stored, auth.as_bytes());
        if proof.len() != signature.len() {
            return Err("SCRAM: the proof has the wrong length".into());
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let computed = m.hash(&client_key);
        let same = computed
            .iter()
            .zip(&stored)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
        if !same || computed.len() != stored.len() {
            return Err(format!("SCRAM: wrong password for user '{}'", self.user));
        }
        Ok(format!(
            "v={}",
            B64.encode(m.hmac(&server_key, auth.as_bytes()))
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example, with its fixed salt and nonces.
    #[test]
    fn the_rfc_7677_exchange_verifies() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = ScramCredential::derive(Mechanism::Sha256, "pencil", &salt, 4096);
        let ex = ServerExchange {
            mechanism: Mechanism::Sha256,
            user: "user".into(),
            client_nonce: "rOprNGfwEbeRWgbNEkqO".into(),
            nonce: "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
            auth_start: "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".into(),
            cred,
        };
        let fin = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        assert_eq!(
            ex.finish(fin).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        let wrong = fin.replace("dHzb", "dHzc");
        assert!(ex.finish(&wrong).is_err());
    }

    #[test]
    fn unknown_users_and_malformed_first_messages_are_refused() {
        let none = |_: &str| None;
        assert!(ServerExchange::start(Mechanism::Sha512, "n,,n=a,r=x", none).is_err());
        let cred = ScramCredential::new(Mechanism::Sha512, "pw").unwrap();
        assert!(cred.check().is_ok());
        let some = |_: &str| Some(cred.clone());
        assert!(ServerExchange::start(Mechanism::Sha512, "p=tls,,n=a,r=x", some).is_err());
        assert!(ServerExchange::start(Mechanism::Sha512, "n,,n=a", some).is_err());
        let (ex, first) = ServerExchange::start(Mechanism::Sha512, "n,,n=a,r=abc", some).unwrap();
        assert!(first.starts_with("r=abc") && ex.user() == "a");
    }

    #[test]
    fn a_salted_password_gives_the_same_credential_as_the_password() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = Mechanism::Sha256.hi(b"pencil", &salt, 4096);
        let from = ScramCredential::from_salted(Mechanism::Sha256, &salt, 4096, &salted).unwrap();
        assert_eq!(
            from,
            ScramCredential::derive(Mechanism::Sha256, "pencil", &salt, 4096)
        );
        // Wrong length, too few iterations, no salt: refused.
        assert!(ScramCredential::from_salted(Mechanism::Sha512, &salt, 4096, &salted).is_err());
        assert!(ScramCredential::from_salted(Mechanism::Sha256, &salt, 10, &salted).is_err());
        assert!(ScramCredential::from_salted(Mechanism::Sha256, b"", 4096, &salted).is_err());
    }

    #[test]
    fn an_alteration_sets_and_removes_single_mechanisms_and_keeps_the_rest() {
        let a = ScramCredential::new(Mechanism::Sha256, "a").unwrap();
        let b = ScramCredential::new(Mechanism::Sha512, "b").unwrap();
        let b2 = ScramCredential::new(Mechanism::Sha512, "b2").unwrap();
        let both = vec![a.clone(), b.clone()];
        let set = ScramUpdate::Alter {
            set: vec![b2.clone()],
            remove: vec![],
        };
        assert_eq!(set.apply(&both), vec![a.clone(), b2]);
        let rm = ScramUpdate::Alter {
            set: vec![],
            remove: vec!["scram-sha-256".into()],
        };
        assert_eq!(rm.apply(&both), vec![b.clone()]);
        assert_eq!(ScramUpdate::Replace(vec![]).apply(&both), vec![]);
        // The wire forms: an array replaces, an object alters.
        let r: ScramUpdate = serde_json::from_str("[]").unwrap();
        assert_eq!(r, ScramUpdate::Replace(vec![]));
        let o: ScramUpdate =
            serde_json::from_str(r#"{"set":[],"remove":["SCRAM-SHA-512"]}"#).unwrap();
        assert!(matches!(o, ScramUpdate::Alter { .. }));
    }
}
