"""Logins, roles, permissions and TLS with cqlsh (-u/-p, --ssl) and the Python driver
(PlainTextAuthProvider, an SSL context), against real nodes started for this module."""

import os
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cassandra import AuthenticationFailed, Unauthorized
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable

from conftest import Node

CQLSH = str(Path(sys.executable).parent / "cqlsh")
AUTH = ["--authenticator", "password", "--authorizer", "cassandra", "--auth-bcrypt-cost", "4"]
BAD = "Provided username and/or password are incorrect"


@pytest.fixture(scope="module")
def secured():
    n = Node(shards=1, extra=AUTH)
    try:
        yield n
    finally:
        n.stop()


def connect(node, user=None, password=None, **kw):
    auth = PlainTextAuthProvider(user, password) if user else None
    cluster = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20,
                      auth_provider=auth, **kw)
    return cluster, cluster.connect()


def cqlsh(node, *args, statement, env=None):
    return subprocess.run(
        [CQLSH, "127.0.0.1", str(node.port), "--request-timeout", "20", *args, "-e", statement],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "CQLSH_NO_BUNDLED": "1", **(env or {})},
    )


def test_cqlsh_login(secured):
    ok = cqlsh(secured, "-u", "cassandra", "-p", "cassandra", statement="LIST ROLES")
    assert ok.returncode == 0, ok.stderr
    assert "cassandra" in ok.stdout
    bad = cqlsh(secured, "-u", "cassandra", "-p", "nope", statement="LIST ROLES")
    assert bad.returncode != 0
    assert BAD in bad.stderr


def test_driver_good_and_wrong_password_and_no_authenticator(secured):
    cluster, s = connect(secured, "cassandra", "cassandra")
    assert s.execute("SELECT release_version FROM system.local").one() is not None
    cluster.shutdown()
    with pytest.raises(NoHostAvailable) as e:
        connect(secured, "cassandra", "wrong")
    errors = list(e.value.errors.values())
    assert any(isinstance(x, AuthenticationFailed) and BAD in str(x) for x in errors), errors
    with pytest.raises(NoHostAvailable) as e:
        connect(secured)
    assert "authentication" in str(e.value).lower()


def test_denied_then_granted_read_only_and_inheritance(secured):
    cluster, su = connect(secured, "cassandra", "cassandra")
    su.execute("CREATE KEYSPACE IF NOT EXISTS pa WITH replication = "
               "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    su.execute("CREATE TABLE IF NOT EXISTS pa.t (k int PRIMARY KEY, v int)")
    su.execute("CREATE ROLE IF NOT EXISTS py WITH PASSWORD = 'py-pw' AND LOGIN = true")
    c2, app = connect(secured, "py", "py-pw")
    steps = [
        ("INSERT INTO pa.t (k, v) VALUES (1, 1)", "GRANT MODIFY ON TABLE pa.t TO py"),
        ("SELECT * FROM pa.t WHERE k = 1", "GRANT SELECT ON KEYSPACE pa TO py"),
        ("CREATE TABLE pa.u (k int PRIMARY KEY)", "GRANT CREATE ON KEYSPACE pa TO py"),
    ]
    for statement, grant in steps:
        with pytest.raises(Unauthorized) as e:
            app.execute(statement)
        assert "User py has no" in str(e.value)
        su.execute(grant)
        app.execute(statement)
    # Read but not write.
    su.execute("REVOKE MODIFY ON TABLE pa.t FROM py")
    assert app.execute("SELECT v FROM pa.t WHERE k = 1").one().v == 1
    with pytest.raises(Unauthorized) as e:
        app.execute("UPDATE pa.t SET v = 2 WHERE k = 1")
    assert "User py has no MODIFY permission on <table pa.t> or any of its parents" in str(e.value)
    # Inheritance through a granted role.
    su.execute("CREATE ROLE IF NOT EXISTS pa_writers")
    su.execute("GRANT MODIFY ON KEYSPACE pa TO pa_writers")
    su.execute("GRANT pa_writers TO py")
    app.execute("UPDATE pa.t SET v = 2 WHERE k = 1")
    su.execute("REVOKE pa_writers FROM py")
    with pytest.raises(Unauthorized):
        app.execute("UPDATE pa.t SET v = 3 WHERE k = 1")
    c2.shutdown()
    cluster.shutdown()


def test_superuser_password_change_refuses_the_old_one(secured):
    # Last in the module: it changes the superuser's password.
    cluster, su = connect(secured, "cassandra", "cassandra")
    su.execute("ALTER ROLE cassandra WITH PASSWORD = 'n3w'")
    cluster.shutdown()
    with pytest.raises(NoHostAvailable):
        connect(secured, "cassandra", "cassandra")
    cluster, su = connect(secured, "cassandra", "n3w")
    cluster.shutdown()
    assert secured.metric_sum("sluice_logins_total", outcome="succeeded") >= 4
    assert secured.metric_sum("sluice_logins_total", outcome="failed") >= 2


def openssl(d, *args):
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs():
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made now (no key
    is committed)."""
    d = tempfile.mkdtemp(prefix="sluice-certs-")
    for k in ("ca", "server", "client"):
        openssl(d, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{k}.key")
    openssl(d, "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        Path(d, f"{name}.ext").write_text(ext)
        openssl(d, "req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return Path(d)


def ssl_context(certs, client_cert=False):
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(certs / "ca.pem"))
    if client_cert:
        ctx.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    return ctx


def test_tls_with_ssl_context_and_cqlsh(certs):
    n = Node(shards=1, extra=[*AUTH, "--tls-cert", str(certs / "server.pem"),
                              "--tls-key", str(certs / "server.key")])
    try:
        cluster, s = connect(n, "cassandra", "cassandra", ssl_context=ssl_context(certs))
        assert s.execute("SELECT release_version FROM system.local").one() is not None
        cluster.shutdown()
        # Plaintext on the TLS port fails instead of hanging.
        with pytest.raises(NoHostAvailable):
            connect(n, "cassandra", "cassandra")
        r = cqlsh(n, "--ssl", "-u", "cassandra", "-p", "cassandra", statement="LIST ROLES",
                  env={"SSL_CERTFILE": str(certs / "ca.pem"), "SSL_VALIDATE": "true"})
        assert r.returncode == 0, r.stderr
        assert "cassandra" in r.stdout
    finally:
        n.stop()


def test_client_certificates_required(certs):
    n = Node(shards=1, extra=["--tls-cert", str(certs / "server.pem"),
                              "--tls-key", str(certs / "server.key"),
                              "--tls-client-ca", str(certs / "ca.pem")])
    try:
        cluster, s = connect(n, ssl_context=ssl_context(certs, client_cert=True))
        assert s.execute("SELECT release_version FROM system.local").one() is not None
        cluster.shutdown()
        with pytest.raises(NoHostAvailable):
            connect(n, ssl_context=ssl_context(certs, client_cert=False))
    finally:
        n.stop()
