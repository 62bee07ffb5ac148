"""TLS, mutual TLS and bearer tokens with roles, against real servers with certificates made here.

One TLS server with tokens of every role and one mutual-TLS server serve the
whole module; the bad settings never get as far as a server.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamtx import cli, errors
from streamtx.client import AsyncClient, Client
from streamtx.client.async_client import channel_credentials
from streamtx.client.spark.options import Options
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.security import VERB_ROLES
from streamtx.v1 import streamtx_pb2 as pb

pytestmark = pytest.mark.timeout(120)

TOKENS = {"read": "r3ad-t0ken", "write": "wr1te-t0ken", "admin": "adm1n-t0ken"}
"""One token per role; `admin`'s is --token, the others come from --tokens-file."""
ROLES = ("read", "write", "admin")
SERVICE = pb.DESCRIPTOR.services_by_name["StreamTx"]
APP = (
    "CREATE TABLE totals (k BIGINT PRIMARY KEY, n BIGINT);\n"
    "CREATE STREAM clicks (k BIGINT);\n"
    "CREATE PROCEDURE count_clicks ON STREAM clicks AS BEGIN\n"
    "    INSERT INTO totals SELECT k, count(*) FROM clicks GROUP BY k\n"
    "        ON CONFLICT DO UPDATE SET n = totals.n + excluded.n;\n"
    "END;\n"
    "CREATE PROCEDURE bump (k BIGINT) AS BEGIN INSERT INTO totals VALUES ($k, 100) "
    "ON CONFLICT DO UPDATE SET n = totals.n + 100; END;\n"
)
EXPECTED_ROLES = {
    "Deploy": "admin",
    "Checkpoint": "admin",
    "Rebalance": "admin",
    "Push": "write",
    "PushStream": "write",
    "Call": "write",
    "Stage": "write",
    "CommitStaged": "write",
    "AbortStaged": "write",
    "Query": "read",
    "Subscribe": "read",
    "Status": "read",
    "Explain": "read",
    "DescribeStream": "read",
    "ReadStream": "read",
}


# --------------------------------------------------------------------------- certificates


@dataclass
class Pki:
    ca: Path  # the CA that signed the server's and the client's certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA nobody here trusts, and a client certificate it signed
    other_client_cert: Path
    other_client_key: Path
    dir: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital_signature, key_cert_sign, crl_sign
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _issue(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], cn: str, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(directory: Path, name: str, key: ec.EllipticCurvePrivateKey | None, cert: x509.Certificate) -> Path:
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        (directory / f"{name}.key").write_bytes(pem)
    return directory / f"{name}.pem"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = _ca("streamtx test CA"), _ca("another CA")
    _write(d, "ca", None, ca[1])
    _write(d, "other-ca", None, other[1])
    for name, signer, server in (("server", ca, True), ("client", ca, False), ("other-client", other, False)):
        _write(d, name, *_issue(signer, name, server))
    return Pki(
        ca=d / "ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        client_cert=d / "client.pem",
        client_key=d / "client.key",
        other_ca=d / "other-ca.pem",
        other_client_cert=d / "other-client.pem",
        other_client_key=d / "other-client.key",
        dir=d,
    )


# --------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def tls(pki, tmp_path_factory) -> Iterator[EmbeddedServer]:
    """TLS, --token (admin) and a tokens file with a read and a write token; the app deployed."""
    tokens = pki.dir / "tokens"
    tokens.write_text(
        f"# role token\n\nread {TOKENS['read']}\n   write   {TOKENS['write']}  \nread another-read-token\n"
    )
    args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tokens-file", str(tokens)]
    data = tmp_path_factory.mktemp("tls") / "data"
    with EmbeddedServer(data, token=TOKENS["admin"], extra_args=args) as srv:
        with Client(srv.target, tls_ca=pki.ca, token=TOKENS["admin"]) as c:
            c.deploy(APP)
        yield srv


@pytest.fixture(scope="module")
def mtls(pki, tmp_path_factory) -> Iterator[EmbeddedServer]:
    """Mutual TLS: clients must present a certificate the test CA signed; no token."""
    args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca)]
    with EmbeddedServer(tmp_path_factory.mktemp("mtls") / "data", extra_args=args) as srv:
        yield srv


def totals(client: Client) -> list[tuple]:
    return client.query("SELECT k, n FROM totals ORDER BY k").fetchall()


# --------------------------------------------------------------------------- TLS


def test_a_client_trusting_the_server_s_ca_pushes_queries_and_deploys(tls, pki):
    with Client(tls.target, tls_ca=pki.ca, token=TOKENS["admin"]) as c:
        before = dict(totals(c))
        assert c.push("clicks", {"k": [1, 1, 2]}).result(timeout=30).ok
        assert c.push_one("clicks", {"k": [1]}).ok
        after = dict(totals(c))
        assert after.get(1, 0) - before.get(1, 0) == 3 and after.get(2, 0) - before.get(2, 0) == 1
        assert c.deploy("CREATE TABLE deployed_over_tls (a INT);").created == [("table", "deployed_over_tls")]
    with Client(tls.target, tls_ca=pki.ca.read_bytes(), token=TOKENS["read"]) as c:  # the CA as PEM bytes
        assert "deployed_over_tls" in c.status()["tables"]


def test_a_plaintext_client_against_a_tls_server_is_unavailable(tls):
    with Client(tls.target, token=TOKENS["admin"], retries=0, timeout=10) as c:
        with pytest.raises(errors.Unavailable) as info:
            c.status()
    assert "if it serves TLS, connect with tls_ca / --tls-ca" in info.value.message, info.value


def test_a_client_trusting_another_ca_is_refused(tls, pki):
    with Client(tls.target, tls_ca=pki.other_ca, token=TOKENS["admin"], retries=0, timeout=10) as c:
        with pytest.raises(errors.Unavailable) as info:
            c.status()
    assert "the TLS handshake failed: tls_ca / --tls-ca must be the CA that signed" in info.value.message, info.value


def test_the_cli_connects_over_tls(tls, pki, tmp_path, capsys):
    base = ["--target", tls.target, "--tls-ca", str(pki.ca)]
    assert cli.main([*base, "--token", TOKENS["read"], "status"]) == 0
    assert "totals" in capsys.readouterr().out
    assert cli.main([*base, "--token", TOKENS["read"], "sql", "SELECT count(*) AS n FROM totals"]) == 0
    capsys.readouterr()
    clicks = tmp_path / "clicks.csv"
    clicks.write_text("k\n7\n7\n")
    assert cli.main([*base, "--token", TOKENS["write"], "push", "clicks", "-f", str(clicks), "-q"]) == 0
    assert "1 committed" in capsys.readouterr().out
    script = tmp_path / "more.sql"
    script.write_text("CREATE TABLE deployed_by_cli (a INT);")
    assert cli.main([*base, "--token", TOKENS["write"], "deploy", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: PERMISSION_DENIED: Deploy is an admin verb") and TOKENS["write"] not in err
    assert cli.main([*base, "--token", TOKENS["admin"], "deploy", str(script)]) == 0
    assert "created table deployed_by_cli" in capsys.readouterr().out
    assert cli.main([*base, "health"]) == 0  # Health needs no token
    assert "SERVING" in capsys.readouterr().out
    assert cli.main(["--target", tls.target, "health"]) == 1  # plaintext against TLS
    capsys.readouterr()
    assert cli.main([*base, "--tls-cert", str(pki.client_cert), "status"]) == 2
    assert "tls_cert and tls_key go together" in capsys.readouterr().err


def test_the_spark_connector_takes_the_token_and_the_ca_as_options(tls, pki):
    opts = Options.parse({"stream": "clicks", "target": tls.target, "tls_ca": str(pki.ca), "token": TOKENS["read"]})
    assert TOKENS["read"] not in repr(opts)
    with opts.conn(retry_for_s=1) as conn:
        assert conn.describe("clicks").border
    opts = Options.parse({"stream": "clicks", "target": tls.target, "tls_ca": str(pki.ca)})
    with opts.conn(retry_for_s=1) as conn, pytest.raises(errors.Unauthenticated):
        conn.describe("clicks")
    with pytest.raises(errors.InvalidArgument, match="option 'tls_ca': cannot read"):
        Options.parse({"stream": "clicks", "tls_ca": str(pki.dir / "missing.pem")})


# --------------------------------------------------------------------------- mutual TLS


def test_mutual_tls_refuses_a_client_without_a_certificate_or_with_another_ca_s(mtls, pki):
    with Client(mtls.target, tls_ca=pki.ca, retries=0, timeout=10) as c, pytest.raises(errors.Unavailable) as info:
        c.status()
    assert "give tls_cert/tls_key signed by its CA" in info.value.message, info.value
    other = {"tls_cert": pki.other_client_cert, "tls_key": pki.other_client_key}
    with Client(mtls.target, tls_ca=pki.ca, **other, retries=0, timeout=10) as c, pytest.raises(errors.Unavailable):
        c.status()
    with Client(mtls.target, tls_ca=pki.ca, retries=0, timeout=10) as c, pytest.raises(errors.Unavailable):
        c.deploy("CREATE TABLE never (a INT);")
    with Client(mtls.target, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key) as c:
        assert "never" not in c.status()["tables"]  # the refused deploy changed nothing


def test_mutual_tls_serves_a_client_with_a_certificate_of_its_ca(mtls, pki):
    with Client(mtls.target, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key) as c:
        c.deploy(APP)
        assert c.push("clicks", {"k": [5, 5]}).result(timeout=30).ok
        assert totals(c) == [(5, 2)]
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        Client(mtls.target, tls_ca=pki.ca, tls_cert=pki.client_cert)


# --------------------------------------------------------------------------- roles


def _call(channel: grpc.Channel, method, metadata) -> grpc.StatusCode:
    """Calls `method` with an empty request (no stream, no SQL: changes nothing); its status."""
    path = f"/{SERVICE.full_name}/{method.name}"
    request = b""  # the empty message of every request type
    identity = {"request_serializer": None, "response_deserializer": None}
    try:
        if method.client_streaming and method.server_streaming:
            list(channel.stream_stream(path, **identity)(iter([]), metadata=metadata, timeout=20))
        elif method.server_streaming:
            list(channel.unary_stream(path, **identity)(request, metadata=metadata, timeout=20))
        else:
            channel.unary_unary(path, **identity)(request, metadata=metadata, timeout=20)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def test_every_verb_has_a_role_and_the_table_is_the_documented_one():
    assert {m.name for m in SERVICE.methods} == set(EXPECTED_ROLES), "give every new verb a role in VERB_ROLES"
    assert {v: r for v, r in VERB_ROLES.items() if v in EXPECTED_ROLES} == EXPECTED_ROLES


@pytest.mark.parametrize("who", ["none", "unknown", *ROLES])
def test_each_verb_is_allowed_exactly_to_the_roles_that_cover_it(tls, pki, who):
    token = {"none": None, "unknown": "n0t-a-t0ken", **TOKENS}[who]
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    credentials = channel_credentials(pki.ca)
    with grpc.secure_channel(tls.target, credentials) as channel:
        for method in SERVICE.methods:
            needed = EXPECTED_ROLES[method.name]
            code, details = _call(channel, method, metadata)
            if who in ROLES and ROLES.index(who) >= ROLES.index(needed):
                assert code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), (
                    method.name,
                    who,
                    details,
                )
                continue
            expected = grpc.StatusCode.PERMISSION_DENIED if who in ROLES else grpc.StatusCode.UNAUTHENTICATED
            assert code == expected, (method.name, who, code, details)
            article = "an" if needed == "admin" else "a"
            assert f"{method.name} is {article} {needed} verb" in details, details
            assert "authorization: Bearer <token" in details, details
            assert all(t not in details for t in TOKENS.values()) and "n0t-a-t0ken" not in details
            if who in ROLES:
                assert f"has role {who}" in details, details
            else:
                assert ("no token given" if token is None else "wrong token") in details, details
        # Health is open to probes; reflection needs a token like any verb
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=None,
            response_deserializer=None,
        )
        try:
            list(reflection(iter([]), metadata=metadata, timeout=10))
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        assert (code == grpc.StatusCode.OK) == (who in ROLES), (who, code)


def test_a_refused_request_changes_nothing(tls, pki):
    def client(role: str | None) -> Client:
        return Client(tls.target, tls_ca=pki.ca, token=TOKENS.get(role or ""), retries=1)

    with client("read") as reader:
        before, tables = totals(reader), reader.status()["tables"]
        with pytest.raises(errors.PermissionDenied, match="Push is a write verb"):
            reader.push_one("clicks", {"k": [9]})
        with pytest.raises(errors.PermissionDenied, match="PushStream is a write verb"):
            reader.push("clicks", {"k": [9]}).result(timeout=30)
        with pytest.raises(errors.PermissionDenied, match="Call is a write verb"):
            reader.call("bump", k=9)
        with pytest.raises(errors.PermissionDenied, match="Deploy is an admin verb"):
            reader.deploy("DROP PROCEDURE bump;")
    with client(None) as anonymous:
        with pytest.raises(errors.Unauthenticated, match="PushStream is a write verb"):
            anonymous.push("clicks", {"k": [9]}).result(timeout=30)
        with pytest.raises(errors.Unauthenticated, match="Subscribe is a read verb"):
            for _ in anonymous.subscribe("clicks"):
                pass
    with client("write") as writer:
        with pytest.raises(errors.PermissionDenied, match="Deploy is an admin verb"):
            writer.deploy("DROP PROCEDURE bump; CREATE TABLE refused (a INT);")
        with pytest.raises(errors.PermissionDenied, match="Checkpoint is an admin verb"):
            writer.checkpoint()
        assert totals(writer) == before and writer.status()["tables"] == tables
        writer.call("bump", k=9)  # a write token calls and pushes
        assert writer.push("clicks", {"k": [9]}).result(timeout=30).ok
        assert dict(totals(writer))[9] == 101


def test_a_push_stream_refusal_that_a_write_race_hid_is_recovered(tls, pki):
    """grpc.aio may turn the refusal of a stream being written into INTERNAL; the client asks why."""

    async def probe(role: str) -> errors.StreamTxError | None:
        async with AsyncClient(tls.target, tls_ca=pki.ca, token=TOKENS[role]) as c:
            return await c._probe_cause()

    refusal = asyncio.run(probe("read"))
    assert isinstance(refusal, errors.PermissionDenied) and refusal.message.startswith("PushStream is a write verb")
    assert asyncio.run(probe("write")) is None  # allowed: the broken stream is a transport failure, retried


# --------------------------------------------------------------------------- bad settings


def _serve(capsys, *args: str) -> str:
    """`streamtx serve ARGS` in this process: refused before it starts (no data directory), its message."""
    data = Path(args[args.index("--data-dir") + 1]) if "--data-dir" in args else None
    assert cli.main(["serve", *args]) == 2
    assert data is None or not data.exists()
    return capsys.readouterr().err


def test_bad_tls_settings_stop_serve_naming_the_setting_and_file(pki, tmp_path, capsys):
    cert, key, ca = str(pki.server_cert), str(pki.server_key), str(pki.ca)
    missing = str(tmp_path / "missing.pem")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    cases = [
        (["--tls-cert", cert], f"--tls-cert {cert}: needs --tls-key as well"),
        (["--tls-key", key], f"--tls-key {key}: needs --tls-cert as well"),
        (["--tls-client-ca", ca], f"--tls-client-ca {ca}: needs --tls-cert and --tls-key"),
        (["--tls-cert", missing, "--tls-key", key], f"--tls-cert {missing}: No such file or directory"),
        (["--tls-cert", cert, "--tls-key", str(tmp_path)], f"--tls-key {tmp_path}: Is a directory"),
        (["--tls-cert", str(not_pem), "--tls-key", key], f"--tls-cert {not_pem}: not PEM"),
        (["--tls-cert", cert, "--tls-key", str(pki.client_key)], f"--tls-key {pki.client_key}: does not go with"),
        (
            ["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(not_pem)],
            f"--tls-client-ca {not_pem}: not PEM",
        ),
    ]
    for args, message in cases:
        err = _serve(capsys, "--data-dir", str(tmp_path / "data"), *args)
        assert err.startswith("error: INVALID_ARGUMENT: ") and message in err, (args, err)


@pytest.mark.parametrize(
    "text, message",
    [
        ("read only-one-word-s3cret\nwrite\n", ":2: expected 'ROLE TOKEN'"),
        ("# tokens\nsuper s3cret-token\n", ":2: the first word must be a role: read, write, admin"),
        ("s3cret-token read\n", ":1: the first word must be a role"),
        ("read s3cret-token extra\n", ":1: expected 'ROLE TOKEN' (a role, then the token), got 3 words"),
        ("read s3cret-tøken\n", ":1: a token must be printable ASCII"),
        ("# nothing\n\n", "holds no token"),
    ],
)
def test_a_bad_tokens_file_stops_serve_naming_the_line_not_the_token(tmp_path, capsys, text, message):
    tokens = tmp_path / "tokens"
    tokens.write_text(text)
    err = _serve(capsys, "--data-dir", str(tmp_path / "data"), "--tokens-file", str(tokens))
    assert f"--tokens-file {tokens}" in err and message in err, err
    assert "s3cret" not in err


def test_serve_exits_2_before_touching_the_data_directory(tmp_path, pki):
    tokens = tmp_path / "tokens"
    tokens.write_text("admin s3cret-token\nreed s3cret-other\n")
    done = subprocess.run(
        [sys.executable, "-m", "streamtx", "serve", "--data-dir", str(tmp_path / "data"), "--tokens-file", str(tokens)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"--tokens-file {tokens}:2: the first word must be a role" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout
    assert not (tmp_path / "data").exists()


def test_config_show_prints_the_paths_but_no_token(tmp_path, pki):
    done = subprocess.run(
        [sys.executable, "-m", "streamtx", "config", "show", "--token", "s3cret-token", "--tokens-file", "/etc/t"]
        + ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "s3cret" not in done.stdout and "# token: set, not shown" in done.stdout
    assert 'tokens-file = "/etc/t"' in done.stdout and f'tls-cert = "{pki.server_cert}"' in done.stdout
    assert "# tls-client-ca: off" in done.stdout
