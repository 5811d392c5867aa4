//! Test certificates, made when a test runs (rcgen), never committed: a
//! CA, and certificates it signs for servers (loopback names) and clients.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A CA: its certificate, and what signs with it.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    pub pem: PathBuf,
}

pub fn ca(dir: &Path, name: &str) -> Ca {
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    let pem = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&pem, cert.pem()).unwrap();
    Ca { cert, key, pem }
}

/// A certificate for `cn` signed by `ca` (server: with loopback names);
/// the paths of its certificate and key files.
pub fn issue(dir: &Path, ca: &Ca, cn: &str, server: bool) -> (PathBuf, PathBuf) {
    let names = match server {
        true => vec!["localhost".to_string(), "127.0.0.1".to_string()],
        false => vec![],
    };
    let mut p = CertificateParams::new(names).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![match server {
        true => ExtendedKeyUsagePurpose::ServerAuth,
        false => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    let (c, k) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}
