"""Users and permissions from Python (docs/security.md), against a real
`strom server --auth`: the Strom client with a token (``token=`` and
``$STROM_TOKEN``), refused without one or beyond its ACLs; and
confluent-kafka authenticating with SASL/OAUTHBEARER carrying a Strom
token, in a consumer group, refused on a topic it has no ACL for."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

import strom
from strom.testing import find_binary
from test_kafka import NO_INITIAL_DELAY, KafkaServer


@pytest.fixture
def secured(tmp_path):
    # Clients across the network, named by tokens: without --no-shm a
    # client of the server's user would take shm and be that uid (a super
    # user), which crates/strom-cli/tests/tls.rs tests.
    s = KafkaServer(tmp_path, "--auth", "--super-user", "User:admin", "--no-shm",
                    *NO_INITIAL_DELAY)
    yield s
    s.stop()


def token(s: KafkaServer, subject: str) -> str:
    out = subprocess.run(
        [find_binary(), "token", "create", "--subject", subject, "--ttl", "1h",
         "--data-dir", str(s.data_dir)],
        check=True, capture_output=True, text=True)
    return out.stdout.strip()


def allow(s: KafkaServer, principal: str, kind: str, name: str, op: str):
    env = {**os.environ, "STROM_TOKEN": token(s, "admin")}
    subprocess.run(
        [find_binary(), "--address", s.native, "acl", "add", "--principal", principal,
         f"--{kind}", name, "--operation", op],
        check=True, capture_output=True, text=True, env=env)


def until(what: str, ok, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_python_client_presents_its_token_and_gets_what_the_acls_allow(secured, monkeypatch):
    s = secured
    admin = strom.Driver.connect(address=s.native, token=token(s, "admin"))
    admin.create_topic("py.a", partitions=1)
    keep = admin.open_topic("py.a").producer()  # keeps the stream open
    monkeypatch.delenv("STROM_TOKEN", raising=False)
    anon = strom.Driver.connect(address=s.native)
    with pytest.raises(strom.errors.NotAuthorized) as e:
        anon.delete_topic("py.a")
    assert "ANONYMOUS" in str(e.value)
    with pytest.raises(strom.errors.Unauthenticated):
        strom.Driver.connect(address=s.native, token="strom1.forged.token")
    monkeypatch.setenv("STROM_TOKEN", token(s, "alice"))
    alice = strom.Driver.connect(address=s.native)
    allow(s, "User:alice", "topic", "py.*", "write")

    def pushed():
        try:
            p = alice.open_topic("py.a").producer()
            p.push({"n": 1}).result(timeout=10)
            p.close()
            return True
        except strom.errors.NotAuthorized:
            return False

    until("alice's ACL to reach the server", pushed)
    with pytest.raises(strom.errors.NotAuthorized):
        alice.delete_topic("py.a")
    keep.close()


def test_confluent_kafka_with_an_oauthbearer_token_in_a_group(secured):
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    s = secured

    def conf(subject: str) -> dict:
        t = token(s, subject)
        return {
            "bootstrap.servers": s.broker,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER",
            "oauth_cb": lambda _cfg: (t, time.time() + 3600),
        }

    admin = AdminClient(conf("admin"))
    for name in ("k.jobs", "k.secret"):
        admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(30)
    allow(s, "User:bob", "topic", "k.jobs", "all")
    allow(s, "User:bob", "group", "bobs", "read")
    bob = conf("bob")
    p = Producer(bob)
    delivered: list = []
    until("bob's ACLs to reach the server", lambda: (
        p.produce("k.jobs", b"x", partition=0, on_delivery=lambda e, m: delivered.append(e)),
        p.flush(10), delivered[-1] is None)[-1])
    for i in range(10):
        p.produce("k.jobs", b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    c = Consumer({**bob, "group.id": "bobs", "auto.offset.reset": "earliest"})
    c.subscribe(["k.jobs"])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 11 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert len(got) == 11, got
    # No ACL on k.secret: the write is refused with Kafka's code.
    errors: list = []
    p.produce("k.secret", b"no", partition=0, on_delivery=lambda e, m: errors.append(e))
    p.flush(30)
    assert errors and errors[0] is not None
    assert errors[0].name() == "TOPIC_AUTHORIZATION_FAILED", errors[0]
    # Deleting k.secret, on which bob has no ACL, is refused with Kafka's
    # code. The client is kept while its future is pending: a temporary
    # one is destroyed at once, failing the future whatever the answer.
    bob_admin = AdminClient(bob)
    with pytest.raises(KafkaException) as refused:
        bob_admin.delete_topics(["k.secret"])["k.secret"].result(30)
    assert refused.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED", refused.value
    assert "k.secret" in admin.list_topics(timeout=30).topics


def test_kafka_admin_tools_manage_the_acls(secured):
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                       AclPermissionType, AdminClient, ResourcePatternType,
                                       ResourceType)

    s = secured
    t = token(s, "admin")
    admin = AdminClient({
        "bootstrap.servers": s.broker,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": t,
    })
    binding = AclBinding(ResourceType.TOPIC, "k.", ResourcePatternType.PREFIXED,
                         "User:carol", "*", AclOperation.READ, AclPermissionType.ALLOW)
    for f in admin.create_acls([binding]).values():
        f.result(30)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,
                                  None, None, AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(everything).result(30)
    assert binding in found, found
    # The same ACL as strom's own tools see it.
    env = {**os.environ, "STROM_TOKEN": t}
    listed = subprocess.run([find_binary(), "--address", s.native, "acl", "list"],
                            check=True, capture_output=True, text=True, env=env).stdout
    assert "allow User:carol read on topic k.*" in listed, listed
    deleted = [f.result(30) for f in admin.delete_acls([everything]).values()]
    assert binding in deleted[0], deleted
    assert admin.describe_acls(everything).result(30) == []
    # Anonymous Kafka clients may not touch them.
    anon = AdminClient({"bootstrap.servers": s.broker})
    futs = anon.create_acls([binding])
    with pytest.raises(Exception) as e:
        for f in futs.values():
            f.result(30)
    assert "CLUSTER_AUTHORIZATION_FAILED" in str(e.value) or "uthoriz" in str(e.value), e.value


def test_kafka_admin_tools_manage_scram_users(secured):
    """AlterUserScramCredentials and DescribeUserScramCredentials, as
    kafka-configs and confluent-kafka's AdminClient use them: a user set
    through Kafka logs in with SCRAM, a deleted one no longer does, and only
    a principal that may alter the cluster may change users."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import (AdminClient, NewTopic, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)

    s = secured

    def plain(subject: str) -> dict:
        return {
            "bootstrap.servers": s.broker,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": subject,
            "sasl.password": token(s, subject),
        }

    admin = AdminClient(plain("admin"))
    admin.create_topics([NewTopic("carol.t", num_partitions=1, replication_factor=1)])["carol.t"].result(30)
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    sha512 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    up = [UserScramCredentialUpsertion("carol", sha256, b"carol-pw"),
          UserScramCredentialUpsertion("carol", sha512, b"carol-pw-512")]
    for f in admin.alter_user_scram_credentials(up).values():
        f.result(30)
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(30)
    infos = sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos)
    assert infos == sorted([(ScramMechanism.SCRAM_SHA_256, 4096),
                            (ScramMechanism.SCRAM_SHA_512, 8192)]), infos

    def logs_in(mechanism: str, password: str) -> bool:
        """Whether carol authenticates: her write to a topic she has no ACL
        on is then refused as unauthorized, not as unauthenticated."""
        p = Producer({"bootstrap.servers": s.broker, "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanisms": mechanism, "sasl.username": "carol",
                      "sasl.password": password, "message.timeout.ms": 5000})
        errs: list = []
        p.produce("carol.t", b"x", partition=0, on_delivery=lambda e, m: errs.append(e))
        p.flush(15)
        return bool(errs) and errs[0] is not None and errs[0].name() == "TOPIC_AUTHORIZATION_FAILED"

    until("carol's credentials to reach the Kafka listener",
          lambda: logs_in("SCRAM-SHA-256", "carol-pw"))
    assert logs_in("SCRAM-SHA-512", "carol-pw-512")
    assert not logs_in("SCRAM-SHA-256", "wrong")
    # Deleting one mechanism keeps the other.
    gone = [UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)]
    for f in admin.alter_user_scram_credentials(gone).values():
        f.result(30)
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(30)
    assert [i.mechanism for i in described.scram_credential_infos] == [ScramMechanism.SCRAM_SHA_512]
    until("the deletion to reach the Kafka listener",
          lambda: not logs_in("SCRAM-SHA-256", "carol-pw"))
    assert logs_in("SCRAM-SHA-512", "carol-pw-512")
    # Deleting what is not there is RESOURCE_NOT_FOUND, as in Kafka.
    with pytest.raises(KafkaException) as e:
        admin.alter_user_scram_credentials(gone)["carol"].result(30)
    assert e.value.args[0].name() == "RESOURCE_NOT_FOUND", e.value
    # A user without alter on the cluster may not change users.
    bob = AdminClient(plain("bob"))
    with pytest.raises(KafkaException) as e:
        bob.alter_user_scram_credentials(up[:1])["carol"].result(30)
    assert e.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED", e.value


def make_certs(d):
    """A CA and a certificate for 127.0.0.1 it signs (PEM files in `d`)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("py-ca")).issuer_name(name("py-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - day).not_valid_after(now + day)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - day).not_valid_after(now + day)
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "cert.pem").write_bytes(cert.public_bytes(pem))
    (d / "key.pem").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return d / "ca.pem", d / "cert.pem", d / "key.pem"


def test_the_python_client_over_tls_with_a_token(tmp_path, monkeypatch):
    ca, cert, key = make_certs(tmp_path)
    proc = subprocess.Popen(
        [find_binary(), "server", "--data-dir", str(tmp_path / "data"),
         "--group-file", str(tmp_path / "group.json"), "--listen", "tls://127.0.0.1:0",
         "--auth", "--super-user", "User:admin", "--tls-cert", str(cert), "--tls-key", str(key)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until("the group file", lambda: (tmp_path / "group.json").exists())
        tok = subprocess.run(
            [find_binary(), "token", "create", "--subject", "admin", "--ttl", "1h",
             "--data-dir", str(tmp_path / "data")],
            check=True, capture_output=True, text=True).stdout.strip()
        monkeypatch.delenv("STROM_TLS_CA", raising=False)
        with pytest.raises(strom.errors.StromError):
            strom.Driver.connect(tmp_path / "group.json", token=tok)
        monkeypatch.setenv("STROM_TLS_CA", str(ca))
        d = strom.Driver.connect(tmp_path / "group.json", token=tok)
        t = d.create_topic("py.tls", partitions=1)
        p = t.producer()
        p.push({"n": 7}).result(timeout=10)
        p.close()
        c = t.consumer("reader")
        ev = c.pull(timeout=10)
        assert ev is not None and ev.metadata == {"n": 7}
    finally:
        proc.terminate()
        proc.wait(10)
