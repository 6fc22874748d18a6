"""Bearer tokens with names and scopes, as the configuration gives them:

    tokens = ["s3cret"]                 # plain secrets: every scope, named token-1, token-2...

    [[tokens]]
    name = "edge-writers"
    sha256 = "9f86d0...hex"             # or token = "plain secret" (exactly one of the two)
    write = ["logs-*", "metrics"]       # shell-style stream name patterns (fnmatch)
    read = ["logs-*"]
    admin = false                       # stream and group life cycle

Only the SHA-256 of each secret is kept.  A presented token is hashed once and
looked up by its digest (``Tokens.identify``); what a token may do is asked of
``Tokens.allows``, whose answers per (token, scope, stream) are remembered for
names a stream can have (at most 64 characters, so the cache stays within a
few MiB however long the names clients send): a worker sees a few tokens and a
few streams, many times each.
"""

from __future__ import annotations

import hashlib
import hmac
import string
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Iterable

WRITE = "write"
READ = "read"
ADMIN = "admin"
EVERY_STREAM = ("*",)
KEYS = ("name", "token", "sha256", "write", "read", "admin")
HEX = frozenset(string.hexdigits)


class TokenError(ValueError):
    """A token entry of the configuration that cannot be used (the message names it)."""


@dataclass(frozen=True)
class Token:
    """One accepted token: its name (for logs and answers), the digest of its
    secret, and its scopes."""

    name: str
    digest: bytes = field(repr=False)
    write: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    admin: bool = False
    length: int | None = field(default=None, repr=False, compare=False)
    """The secret's length in characters, when the configuration holds the secret itself."""

    @classmethod
    def plain(cls, name: str, secret: str) -> Token:
        """A token of the plain list: every scope, as before tokens had scopes."""
        return cls(name, digest_of(secret.encode()), EVERY_STREAM, EVERY_STREAM, True, len(secret))

    def patterns(self, scope: str) -> tuple[str, ...]:
        return self.write if scope == WRITE else self.read


def digest_of(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def parse(value: Any, where: str) -> tuple[str | Token, ...]:
    """The ``tokens`` of a configuration file (``where`` names it): a list of
    plain secrets and token tables, or TokenError naming the entry and key."""
    if not isinstance(value, list):
        raise TokenError(f"tokens in {where} must be a list of secrets or [[tokens]] tables")
    return tuple(_entry(item, n, where) for n, item in enumerate(value, 1))


def _entry(item: Any, n: int, where: str) -> str | Token:
    if isinstance(item, str):
        if not item:
            raise TokenError(f"token {n} in {where} is an empty string")
        return item
    if not isinstance(item, dict):
        raise TokenError(f"token {n} in {where} must be a string or a table, not {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 64 or not name.isprintable():
        raise TokenError(f"token {n} in {where} needs a name: 1 to 64 printable characters")
    label = f"token {name!r} in {where}"
    unknown = sorted(set(item) - set(KEYS))
    if unknown:
        raise TokenError(f"{label}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    if ("token" in item) == ("sha256" in item):
        raise TokenError(f"{label}: give exactly one of token (the secret) and sha256 (its hash)")
    if "token" in item:
        secret = item["token"]
        if not isinstance(secret, str) or not secret:
            raise TokenError(f"{label}: token must be a non-empty string")
        digest = digest_of(secret.encode())
        length: int | None = len(secret)
    else:
        hexed = item["sha256"]
        if not isinstance(hexed, str) or len(hexed) != 64 or not HEX.issuperset(hexed):
            raise TokenError(f"{label}: sha256 must be 64 hexadecimal digits "
                             "(printf %s 'secret' | sha256sum)")
        digest = bytes.fromhex(hexed)
        length = None
    admin = item.get("admin", False)
    if not isinstance(admin, bool):
        raise TokenError(f"{label}: admin must be true or false")
    return Token(name, digest, _patterns(item, WRITE, label), _patterns(item, READ, label), admin,
                 length)


def _patterns(item: dict[str, Any], scope: str, label: str) -> tuple[str, ...]:
    value = item.get(scope, [])
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise TokenError(f"{label}: {scope} must be a list of stream name patterns "
                         f"(non-empty strings), not {value!r}")
    return tuple(value)


class Tokens:
    """The accepted tokens of one configuration, by the digest of their secret."""

    CACHED = 10_000
    CACHED_NAME_CHARS = 64  # the longest stream name (storage_c.check_stream_name)

    def __init__(self, entries: Iterable[str | Token]) -> None:
        self.tokens: list[Token] = []
        plain = 0
        for entry in entries:
            if isinstance(entry, str):
                plain += 1
                entry = Token.plain(f"token-{plain}", entry)
            self.tokens.append(entry)
        self.by_digest: dict[bytes, Token] = {}
        names: set[str] = set()
        for token in self.tokens:
            if token.name in names:
                raise TokenError(f"token name {token.name!r} is used twice (plain tokens are "
                                 "named token-1, token-2... in order)")
            names.add(token.name)
            other = self.by_digest.setdefault(token.digest, token)
            if other is not token:
                raise TokenError(f"tokens {other.name!r} and {token.name!r} have the same secret")
        self._allowed: dict[tuple[str, str, str], bool] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def identify(self, secret: bytes) -> Token | None:
        """The token whose secret this is, or None."""
        digest = digest_of(secret)
        token = self.by_digest.get(digest)
        if token is not None and hmac.compare_digest(token.digest, digest):
            return token
        return None

    def allows(self, token: Token, scope: str, stream: str) -> bool:
        """Whether ``token`` may ``scope`` (write or read) ``stream``."""
        key = (token.name, scope, stream)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = any(fnmatchcase(stream, p) for p in token.patterns(scope))
            if len(stream) <= self.CACHED_NAME_CHARS:
                if len(self._allowed) >= self.CACHED:
                    self._allowed.pop(next(iter(self._allowed)))  # the oldest answer
                self._allowed[key] = allowed
        return allowed
