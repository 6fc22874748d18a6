"""Gateway configuration: a TOML file, then ``COMET_*`` environment variables.

    data_dir = "/var/lib/comet"
    host = "0.0.0.0"
    port = 8080
    workers = 2                 # 0: one per CPU
    auth = "auto"               # "auto": tokens required unless bound to loopback; "on"; "off"
    tokens = ["s3cret"]         # plain secrets with every scope, or [[tokens]] tables
    tokens_file = "/etc/comet/tokens.toml"  # more [[tokens]] (gateway.tokens), read by load()
    max_body_bytes = 16777216
    max_decompressed_bytes = 67108864
    inflight_bytes = 67108864   # per worker; above it requests get 429
    validate = true             # check JSON and NDJSON bodies before storing
    auto_create = true          # or false, or name patterns: ["logs-*", "metrics.*"]
    max_streams = 100           # streams the data directory may hold (0: no limit)
    access_log = true           # one JSON line per ingest request on stdout
    otlp_logs_stream = "otel-logs"        # where POST /v1/logs stores (OTLP/HTTP)
    otlp_traces_stream = "otel-traces"
    otlp_metrics_stream = "otel-metrics"
    idempotency_window_s = 600  # an Idempotency-Key's retry is a duplicate this long
    tls_cert_file = "/etc/comet/tls/cert.pem"   # both or neither: TLS on the listener
    tls_key_file = "/etc/comet/tls/key.pem"
    tls_client_ca_file = ""     # set: mutual TLS, a client certificate signed by this CA required
    forwarded_allow_ips = []    # reverse proxies whose X-Forwarded-* headers are believed
    max_header_bytes = 65536    # request line and headers; larger: 431
    max_headers = 100           # header fields per request; more: 431
    header_timeout_s = 10       # from a request's first byte to the end of its headers: 408
    idle_timeout_s = 5          # a connection without a request under way is closed after this
    body_timeout_s = 10         # a body must arrive within this, plus 1 s per body_min_rate bytes
    body_min_rate = 1024        # bytes per second a body must keep up after body_timeout_s
    max_connections = 0         # per worker (0: derived from the file limit); idle ones give way
    inflight_share = 0.25       # the part of inflight_bytes one tenant may hold
    max_streams_per_token = 0   # streams one token without admin may create (0: max_streams / 4)
    min_token_length = 8        # plain token secrets shorter than this stop the start
    data_group = ""             # a group sharing the data directory (read and write); none: 0700/0600

    [storage]                   # any field of storage_c.Config
    shards = 16
    durability = "interval"

    [streams.metrics]           # per-stream overrides
    validate = false

Every top-level key has an environment variable ``COMET_<KEY>`` (``COMET_TOKENS``
is comma-separated plain secrets), every storage key ``COMET_STORAGE_<KEY>``; the
environment wins over the file.  ``COMET_CONFIG`` names the file.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import grp
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from storage_c import CometError, Config, check_stream_name

from . import tokens as token_entries
from .tokens import Token, TokenError, Tokens
from .tls import TlsError, TlsMaterial, read_material

MiB = 1 << 20
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class StreamPolicy:
    validate: bool = True
    idempotency_window_s: float | None = None
    """This stream's duplicate window for Idempotency-Key (None: the gateway's)."""


@dataclass(frozen=True)
class GatewayConfig:
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 0
    auth: str = "auto"
    tokens: tuple[str | Token, ...] = field(default=(), repr=False)  # secrets: never in a repr
    """Accepted bearer tokens: plain secrets (every scope; named token-1, token-2...
    in order) and scoped Token entries (gateway.tokens); load() adds tokens_file's."""
    tokens_file: str = ""
    """A TOML file of more [[tokens]] tables, read by load() (at start and on every HUP)."""
    max_body_bytes: int = 16 * MiB
    max_decompressed_bytes: int = 64 * MiB
    inflight_bytes: int = 64 * MiB
    max_entries_per_read: int = 1000
    validate: bool = True
    auto_create: bool | tuple[str, ...] = True
    """Whether a write may create its stream: always, never, or when the name
    matches one of these shell-style patterns."""
    max_streams: int = 100
    """Streams the data directory may hold; a write that would create one more
    gets 409 (0: no limit)."""
    admin: bool = False
    """Allow DELETE /streams/{name} and changing consumer groups over HTTP."""
    access_log: bool = True
    """One JSON line per ingest request on stdout (batched: written within 200 ms)."""
    retry_after_s: int = 1
    otlp_logs_stream: str = "otel-logs"
    """The stream of POST /v1/logs: one event per OTLP log record."""
    otlp_traces_stream: str = "otel-traces"
    """The stream of POST /v1/traces: one event per span."""
    otlp_metrics_stream: str = "otel-metrics"
    """The stream of POST /v1/metrics: one event per metric data point."""
    idempotency_window_s: float = 600.0
    """How long a request's Idempotency-Key makes a retry of it a duplicate
    (per stream: [streams.NAME] idempotency_window_s)."""
    slot_wait_s: float = 10.0
    """How long a starting worker waits for a free process slot before serving (with 503s)."""
    tls_cert_file: str = ""
    """PEM certificate (chain) of the listener; with tls_key_file, the gateway speaks only TLS."""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    """PEM CA certificates: a client must present a certificate signed by one (mutual TLS)."""
    forwarded_allow_ips: tuple[str, ...] = ()
    """Addresses or networks of reverse proxies whose X-Forwarded-For/-Proto are believed
    (none by default: a client cannot claim another address or scheme)."""
    max_header_bytes: int = 64 << 10
    """The request line and headers of one request; a larger head is answered 431."""
    max_headers: int = 100
    """Header fields in one request; more are answered 431."""
    header_timeout_s: float = 10.0
    """From a request's first byte (or, on TLS, the connection's) to the end of its head: 408."""
    idle_timeout_s: float = 5.0
    """How long a connection may stay open without a request under way: before its first
    request and between requests (keep-alive)."""
    body_timeout_s: float = 10.0
    """A request's body must arrive within this, plus one second per body_min_rate bytes
    received: slower is answered 408 and the connection closed."""
    body_min_rate: int = 1024
    """Bytes per second a body upload must keep up on average after body_timeout_s."""
    max_connections: int = 0
    """Open connections per worker (0: derived from the file limit, at most 1024); over it,
    a new connection closes the longest idle one, or is answered 503 when none is idle."""
    inflight_share: float = 0.25
    """The part of inflight_bytes one tenant (a token; with auth off, a stream) may hold."""
    max_streams_per_token: int = 0
    """Streams one token without the admin scope may create (0: a quarter of max_streams;
    no limit when max_streams is 0)."""
    min_token_length: int = 8
    """Plain token secrets shorter than this stop the start."""
    data_group: str = ""
    """A group that shares the data directory (its members read and write it); none: the
    gateway's user alone (directories 0700, files 0600)."""
    storage: Config = field(default_factory=Config)
    streams: Mapping[str, StreamPolicy] = field(default_factory=dict)
    tls: TlsMaterial | None = field(default=None, init=False, compare=False)
    """The TLS files' contents, read when the configuration is made (None: plain HTTP)."""

    def __post_init__(self) -> None:
        if self.auth not in ("auto", "on", "off"):
            raise ConfigError(f"auth must be 'auto', 'on' or 'off', not {self.auth!r}")
        try:
            self.access  # names unique, secrets distinct: checked once, here
        except TokenError as exc:
            raise ConfigError(str(exc)) from None
        if self.auth_required and not self.tokens:
            # Starting would refuse every write: say so now instead of with 401s.
            if self.auth == "on":
                raise ConfigError("auth is on but no tokens are configured")
            raise ConfigError(f"host {self.host} is not loopback, so tokens are required "
                              "(auth = \"auto\"): set tokens (COMET_TOKENS) or tokens_file, or "
                              "auth = \"off\" (COMET_AUTH=off) to accept writes from anyone")
        for name in ("max_body_bytes", "max_decompressed_bytes", "inflight_bytes", "port",
                     "max_headers", "header_timeout_s", "idle_timeout_s", "body_timeout_s",
                     "body_min_rate", "min_token_length"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if not 1024 <= self.max_header_bytes <= 16 * MiB:
            raise ConfigError(f"max_header_bytes must be 1024 to {16 * MiB}, not {self.max_header_bytes}")
        if not 0 < self.inflight_share <= 1:
            raise ConfigError(f"inflight_share must be above 0 and at most 1, not {self.inflight_share}")
        for name in ("max_connections", "max_streams_per_token"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0: derived)")
        for token in self.access.tokens:
            if token.length is not None and token.length < self.min_token_length:
                raise ConfigError(f"token {token.name!r} is {token.length} characters long; a token "
                                  f"needs at least min_token_length ({self.min_token_length}): make "
                                  "one with openssl rand -hex 16")
        if self.data_group:
            try:
                grp.getgrnam(self.data_group)
            except KeyError:
                raise ConfigError(f"data_group: no group named {self.data_group!r}") from None
        if self.workers < 0:
            raise ConfigError("workers must be >= 0 (0: one per CPU)")
        if self.max_streams < 0:
            raise ConfigError("max_streams must be >= 0 (0: no limit)")
        for signal in ("logs", "traces", "metrics"):
            try:
                check_stream_name(self.otlp_stream(signal))
            except CometError as exc:
                raise ConfigError(f"otlp_{signal}_stream: {exc}") from None
        windows = {"idempotency_window_s": self.idempotency_window_s}
        windows.update({f"streams.{name}.idempotency_window_s": p.idempotency_window_s
                        for name, p in self.streams.items() if p.idempotency_window_s is not None})
        for name, seconds in windows.items():
            if not 0 < seconds <= 7 * 86400:
                raise ConfigError(f"{name} must be above 0 and at most a week (604800), not {seconds}")
        if isinstance(self.auto_create, tuple) and not all(self.auto_create):
            raise ConfigError("auto_create patterns must not be empty")
        for address in self.forwarded_allow_ips:
            try:
                if address != "*":
                    ipaddress.ip_network(address)
            except ValueError:
                raise ConfigError(f"forwarded_allow_ips: {address!r} is not an IP address or "
                                  "network") from None
        try:
            tls = read_material(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        except TlsError as exc:
            raise ConfigError(str(exc)) from None
        object.__setattr__(self, "tls", tls)  # frozen: set once, here

    @property
    def worker_count(self) -> int:
        # The CPUs this process may run on (a container's or taskset's), not the host's.
        return self.workers or len(os.sched_getaffinity(0)) or 1

    @functools.cached_property
    def auth_required(self) -> bool:
        """Tokens are needed when auth is on, or when auth is auto and the
        gateway listens beyond loopback."""
        if self.auth == "off":
            return False
        return self.auth == "on" or not is_loopback(self.host)

    @functools.cached_property
    def access(self) -> Tokens:
        """The accepted tokens by the digest of their secret, with their scopes."""
        return Tokens(self.tokens)

    @property
    def tokens_unenforced(self) -> bool:
        """Tokens are configured but not asked for (auth off, or auto on loopback)."""
        return bool(self.tokens) and not self.auth_required

    @property
    def tenant_inflight_bytes(self) -> int:
        """What one tenant may hold of the in-flight budget."""
        return max(1, int(self.inflight_bytes * self.inflight_share))

    @property
    def streams_per_token(self) -> int:
        """Streams one token without admin may create (0: no limit)."""
        if self.max_streams_per_token:
            return self.max_streams_per_token
        return max(1, self.max_streams // 4) if self.max_streams else 0

    def reserved_streams(self) -> frozenset[str]:
        """Streams the operator named (the OTLP streams, [streams.NAME]): creating them is
        never refused for the streams tenants made."""
        return frozenset((*(self.otlp_stream(s) for s in ("logs", "traces", "metrics")),
                          *self.streams))

    def otlp_stream(self, signal: str) -> str:
        """The stream OTLP records of ``signal`` (logs, traces, metrics) go to."""
        return str(getattr(self, f"otlp_{signal}_stream"))

    def validates(self, stream: str) -> bool:
        policy = self.streams.get(stream)
        return self.validate if policy is None else policy.validate

    def idempotency_window(self, stream: str) -> float:
        """Seconds an Idempotency-Key of ``stream`` stays a duplicate."""
        policy = self.streams.get(stream)
        if policy is None or policy.idempotency_window_s is None:
            return self.idempotency_window_s
        return policy.idempotency_window_s

    def may_create(self, stream: str) -> bool:
        """Whether a write may create ``stream`` (auto_create)."""
        if isinstance(self.auto_create, bool):
            return self.auto_create
        return any(fnmatch.fnmatchcase(stream, pattern) for pattern in self.auto_create)

    def storage_config(self) -> Config:
        """The storage settings every worker uses: one slot per worker.  The
        gateway opens each stream itself (create or not, by may_create)
        before it writes; the storage never creates one on its own."""
        return dataclasses.replace(self.storage, process_count=self.worker_count,
                                   auto_create_streams=False, max_streams=self.max_streams)

    def worker_storage_config(self) -> Config:
        """What a worker opens the storage with: storage_config(), whose
        max_streams leaves room for the streams the operator named on top (the
        worker counts the others against max_streams itself, gateway.tenants)."""
        config = self.storage_config()
        if not self.max_streams:
            return config
        return dataclasses.replace(config, max_streams=self.max_streams + len(self.reserved_streams()))


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


TOP_LEVEL = {f.name: f for f in dataclasses.fields(GatewayConfig) if f.name not in ("storage", "streams", "tls")}
STORAGE = {f.name: f for f in dataclasses.fields(Config)}
GATEWAY_OWNED = {"process_count": "workers", "auto_create_streams": "auto_create",
                 "max_streams": "max_streams"}
"""The storage keys storage_config() sets from a gateway setting: by the setting to use instead."""


def _coerce(name: str, value: Any, kind: Any) -> Any:
    """Turns a TOML or environment value into the field's type."""
    kind = str(kind)
    try:
        if kind.startswith("bool | tuple"):  # true, false, or patterns
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false",
                                                            "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return tuple(value)
            raise ValueError(value)
        if kind.startswith("tuple"):
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            return tuple(str(v) for v in value)
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if kind == "int":
            return int(value)
        if kind in ("float", "float | None"):
            return float(value)
        return str(value) if kind in ("str", "Durability") else value
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: cannot use {value!r} as {kind}") from None


def load(path: str | os.PathLike[str] | None = None,
         env: Mapping[str, str] | None = None) -> GatewayConfig:
    """The file (``path`` or ``$COMET_CONFIG``, optional), then the environment."""
    env = os.environ if env is None else env
    path = path or env.get("COMET_CONFIG")
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
    for table in ("storage", "streams"):
        if not isinstance(raw.get(table, {}), dict):
            raise ConfigError(f"{table} in {path} must be a table ([{table}])")
    top: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("storage", "streams"):
            continue
        if key not in TOP_LEVEL:
            raise ConfigError(f"unknown setting {key!r} in {path}")
        top[key] = (_tokens(value, str(path)) if key == "tokens"
                    else _coerce(key, value, TOP_LEVEL[key].type))
    storage: dict[str, Any] = {}
    for key, value in raw.get("storage", {}).items():
        if key not in STORAGE:
            raise ConfigError(f"unknown storage setting {key!r} in {path}")
        _refuse_gateway_owned(f"storage.{key} in {path}", key)
        storage[key] = _coerce(f"storage.{key}", value, STORAGE[key].type)
    streams = {name: _stream_policy(name, policy, path)
               for name, policy in raw.get("streams", {}).items()}
    for key, f in TOP_LEVEL.items():
        var = f"COMET_{key.upper()}"
        if var in env:
            top[key] = (_coerce(var, env[var], "tuple") if key == "tokens"
                        else _coerce(var, env[var], f.type))
    if top.get("tokens_file"):
        top["tokens"] = tuple(top.get("tokens", ())) + _tokens_file(top["tokens_file"])
    for key, f in STORAGE.items():
        var = f"COMET_STORAGE_{key.upper()}"
        if var in env:
            _refuse_gateway_owned(var, key)
            storage[key] = _coerce(var, env[var], f.type)
    try:
        return GatewayConfig(**top, storage=Config(**storage), streams=streams)
    except (TypeError, ValueError) as exc:  # the storage Config's own checks raise ValueError
        raise ConfigError(str(exc)) from None


def _refuse_gateway_owned(where: str, key: str) -> None:
    """A storage key the gateway sets itself would be ignored: refused, naming the setting
    to use instead."""
    owner = GATEWAY_OWNED.get(key)
    if owner is not None:
        raise ConfigError(f"{where}: the gateway sets {key} itself; use {owner} "
                          f"(COMET_{owner.upper()}) instead")


def _tokens(value: Any, where: str) -> tuple[str | Token, ...]:
    try:
        return token_entries.parse(value, where)
    except TokenError as exc:
        raise ConfigError(str(exc)) from None


def _tokens_file(path: str) -> tuple[str | Token, ...]:
    """The tokens of a tokens_file: a TOML file holding ``tokens`` only."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"tokens_file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tokens_file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"tokens_file {path}: {exc}") from None
    for key in raw:
        if key != "tokens":
            raise ConfigError(f"unknown setting {key!r} in tokens_file {path} (it holds "
                              "[[tokens]] tables only)")
    return _tokens(raw.get("tokens", []), f"tokens_file {path}")


POLICY = {f.name: f for f in dataclasses.fields(StreamPolicy)}


def _stream_policy(name: str, policy: Any, path: Any) -> StreamPolicy:
    if not isinstance(policy, dict):
        raise ConfigError(f"[streams.{name}] in {path} must be a table")
    for key in policy:
        if key not in POLICY:
            raise ConfigError(f"unknown setting {key!r} in [streams.{name}] of {path}")
    return StreamPolicy(**{k: _coerce(f"streams.{name}.{k}", v, POLICY[k].type)
                           for k, v in policy.items()})
