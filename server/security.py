"""Who may connect and call what: the TLS files and the bearer tokens with their roles.

`--tls-cert`/`--tls-key` (and `--tls-client-ca` for mutual TLS) are read and
checked here at start-up, before the workers start: a file that is missing,
unreadable, not PEM, or a key that does not go with its certificate stops
the server with a ValueError naming the setting and the file.

Tokens: `--token` (env STREAMTX_TOKEN) is an admin token; `--tokens-file`
holds more, one `ROLE TOKEN` per line. With no token at all every verb is
open; with any, each verb but Health needs a token whose role covers it
(`VERB_ROLES`; `admin` ⊇ `write` ⊇ `read`). Tokens are kept as SHA-256
digests and compared in constant time; no message ever holds one.

Standard library only: `streamtx serve` checks its settings before it
imports the server.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamtx.server.config import ServerConfig

ROLES = ("read", "write", "admin")
"""Each role may call every verb of the roles before it."""

VERB_ROLES = {
    # admin: what the server runs and what it keeps on disk
    "Deploy": "admin",
    "Checkpoint": "admin",
    "Rebalance": "admin",
    # write: anything that changes the data
    "Push": "write",
    "PushStream": "write",
    "Call": "write",
    "Stage": "write",
    "CommitStaged": "write",
    "AbortStaged": "write",
    # read: the data, the catalog and the server's state
    "Query": "read",
    "Subscribe": "read",
    "Status": "read",
    "Explain": "read",
    "DescribeStream": "read",
    "ReadStream": "read",
    "ServerReflectionInfo": "read",  # the schema, for grpcurl and friends (both reflection services)
}
"""The role each verb needs once the server has a token; a verb missing here needs `admin`."""

OPEN_SERVICES = frozenset({"grpc.health.v1.Health"})
"""Services anyone may call, token or not: probes must work without one."""

HOW_TO_SEND = "send the metadata 'authorization: Bearer <token>' (streamtx --token, STREAMTX_TOKEN, Client(token=))"


def role_needed(method: str) -> str | None:
    """The role a gRPC method path (`/streamtx.v1.StreamTx/Push`) needs; None: open to all."""
    service, _, verb = method.lstrip("/").rpartition("/")
    if service in OPEN_SERVICES:
        return None
    return VERB_ROLES.get(verb, "admin")


def covers(role: str, needed: str) -> bool:
    return ROLES.index(role) >= ROLES.index(needed)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Tokens:
    """The configured tokens as (SHA-256 digest, role); empty: no authentication."""

    digests: tuple[tuple[bytes, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.digests)

    def role_of(self, token: str) -> str | None:
        """The highest role of `token`, None if no configured token; compared with every one, in constant time."""
        given = _digest(token)
        best: str | None = None
        for digest, role in self.digests:
            if hmac.compare_digest(given, digest) and (best is None or covers(role, best)):
                best = role
        return best


def load_tokens(config: ServerConfig) -> Tokens:
    """`--token` as admin, then each line of `--tokens-file`; a bad line is a ValueError naming FILE:LINE only."""
    found: list[tuple[bytes, str]] = []
    if config.token:
        _check_token(config.token, "--token")
        found.append((_digest(config.token), "admin"))
    path = config.tokens_file
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"--tokens-file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--tokens-file {path}: not text (UTF-8)") from None
        listed = 0
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            where = f"--tokens-file {path}:{number}"
            if len(words) != 2:
                raise ValueError(f"{where}: expected 'ROLE TOKEN' (a role, then the token), got {len(words)} words")
            role, token = words
            if role not in ROLES:
                raise ValueError(f"{where}: the first word must be a role: {', '.join(ROLES)}")
            _check_token(token, where)
            found.append((_digest(token), role))
            listed += 1
        if not listed:
            raise ValueError(f"--tokens-file {path}: holds no token (one 'ROLE TOKEN' per line, ROLE read/write/admin)")
    return Tokens(tuple(found))


def _check_token(token: str, where: str) -> None:
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(f"{where}: a token must be printable ASCII without spaces (it travels in gRPC metadata)")


@dataclass(frozen=True)
class TlsFiles:
    """What `grpc.ssl_server_credentials` takes: PEM bytes."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None


def load_tls(config: ServerConfig) -> TlsFiles | None:
    """The server's certificate, key and client CA, checked; None without `--tls-cert`; a ValueError names the file."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    cert = _read_pem(config.tls_cert, "--tls-cert", "CERTIFICATE")
    key = _read_pem(config.tls_key, "--tls-key", "PRIVATE KEY")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    def no_password() -> str:
        raise ValueError("encrypted")

    try:
        context.load_cert_chain(config.tls_cert, config.tls_key, password=no_password)
    except ValueError:
        raise ValueError(f"--tls-key {config.tls_key}: the key is encrypted; give it unencrypted") from None
    except ssl.SSLError as e:
        raise ValueError(
            f"--tls-key {config.tls_key}: does not go with --tls-cert {config.tls_cert}, or either is not a valid "
            f"PEM certificate or key ({e.reason or e})"
        ) from None
    ca = None
    if config.tls_client_ca is not None:
        ca = _read_pem(config.tls_client_ca, "--tls-client-ca", "CERTIFICATE")
        try:
            context.load_verify_locations(cadata=ca.decode())
        except (ssl.SSLError, ValueError) as e:
            raise ValueError(f"--tls-client-ca {config.tls_client_ca}: not a PEM CA bundle ({e})") from None
    return TlsFiles(cert, key, ca)


def _read_pem(path: Path, flag: str, kind: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data or f"{kind}-----".encode() not in data:
        raise ValueError(f"{flag} {path}: not PEM: no '-----BEGIN ...{kind}-----' block")
    return data


def check(config: ServerConfig) -> None:
    """Reads every file the security settings name, as the server will at start; a ValueError names what is wrong."""
    load_tls(config)
    load_tokens(config)


__all__ = ["ROLES", "VERB_ROLES", "TlsFiles", "Tokens", "check", "covers", "load_tls", "load_tokens", "role_needed"]
