"""TLS on the listener, against real `comet serve` processes and real TLS
clients (the standard library's ssl and curl), with certificates made in the
test (tests/support/tls.py): the handshake and a round trip, the TLS 1.2
floor, plain HTTP on the TLS port, mutual TLS, a renewed certificate picked
up by HUP under load, the warning of a plaintext listener beyond loopback,
proxy headers (not believed by default), and the configuration's checks."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from cryptography import x509

from gateway.config import ConfigError, load

from .support.noloss import check_stored_once
from .support.posters import Poster, wait_for
from .support.server import HOST, SMALL, GatewayProcess
from .support.tls import Issued, Pki, issue

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[GatewayProcess]:
    with GatewayProcess(tmp_path_factory.mktemp("tls") / "data", env={**SMALL, **pki.env()},
                        tls=pki.client_context()) as server:
        server.wait_ready()
        yield server
        assert server.stop() == 0


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[GatewayProcess]:
    with GatewayProcess(tmp_path_factory.mktemp("mtls") / "data", env={**SMALL, **pki.env(mutual=True)},
                        tls=pki.client_context(pki.client)) as server:
        server.wait_ready()
        yield server
        assert server.stop() == 0


def read_back(server: GatewayProcess, answer: dict[str, Any]) -> list[Any]:
    status, body, _ = server.request(
        "GET", f"/streams/{answer['stream']}/entries?shard={answer['shard']}&from={answer['first']}"
               f"&limit={answer['count']}")
    assert status == 200, body
    return [e["value"] for e in orjson.loads(body)["entries"]]


def peer_serial(sock: socket.socket | None) -> int:
    assert isinstance(sock, ssl.SSLSocket), sock
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


# ---- a round trip ---------------------------------------------------------------------------

def test_stdlib_client_posts_and_reads_back(tls_server: GatewayProcess, pki: Pki) -> None:
    status, body, _ = tls_server.request("POST", "/streams/tls", orjson.dumps({"via": "ssl"}), JSON)
    assert status == 202, body
    assert read_back(tls_server, orjson.loads(body)) == [{"via": "ssl"}]
    with tls_server.connect() as sock:
        assert isinstance(sock, ssl.SSLSocket)
        assert sock.version() in ("TLSv1.2", "TLSv1.3")
        assert peer_serial(sock) == pki.server.serial


def test_curl_posts_and_reads_back(tls_server: GatewayProcess, pki: Pki) -> None:
    curl = shutil.which("curl")
    assert curl, "curl is needed (apt-get install curl)"
    base = ["curl", "-sS", "--cacert", str(pki.ca.cert), "-w", "\n%{http_code}"]
    out = subprocess.run([*base, "-X", "POST", "-H", "content-type: application/json",
                          "--data", '{"via":"curl"}', f"{tls_server.url}/streams/tls"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    body, _, code = out.rpartition("\n")
    assert code == "202", out
    answer = orjson.loads(body)
    out = subprocess.run([*base, f"{tls_server.url}/streams/tls/entries?shard={answer['shard']}"
                                 f"&from={answer['first']}&limit=1"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    body, _, code = out.rpartition("\n")
    assert code == "200", out
    assert [e["value"] for e in orjson.loads(body)["entries"]] == [{"via": "curl"}]
    # curl without the CA does not trust the server: the certificate is really checked
    refused = subprocess.run(["curl", "-sS", f"{tls_server.url}/healthz"], capture_output=True,
                             text=True, timeout=30)
    assert refused.returncode == 60, refused.stderr  # "peer certificate cannot be authenticated"


# ---- what is refused --------------------------------------------------------------------------

def tls_1_1_client(pki: Pki) -> ssl.SSLContext:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(str(pki.ca.cert))
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 offers TLS 1.1 only at level 0
    return old


def handshake_version(client: ssl.SSLContext, port: int) -> str | None:
    with client.wrap_socket(socket.create_connection((HOST, port), timeout=10),
                            server_hostname=HOST) as sock:
        return sock.version()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_a_tls_1_1_client_is_refused_at_the_handshake(tls_server: GatewayProcess, pki: Pki) -> None:
    client = tls_1_1_client(pki)
    # The control: this client does speak TLS 1.1 to a server that allows it...
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    permissive.load_cert_chain(str(pki.server.cert), str(pki.server.key))
    with socket.create_server((HOST, 0)) as listener:
        def serve_one() -> None:
            conn, _ = listener.accept()
            with permissive.wrap_socket(conn, server_side=True):
                pass
        t = threading.Thread(target=serve_one, daemon=True)
        t.start()
        assert handshake_version(client, listener.getsockname()[1]) == "TLSv1.1"
        t.join(timeout=10)
    # ...and the gateway refuses it, saying why
    with pytest.raises(ssl.SSLError) as refused:
        handshake_version(client, tls_server.port)
    assert refused.value.reason == "TLSV1_ALERT_PROTOCOL_VERSION", refused.value
    assert_serves(tls_server)


def test_plain_http_to_the_tls_port_gets_no_answer_and_hurts_nothing(tls_server: GatewayProcess) -> None:
    conn = http.client.HTTPConnection(HOST, tls_server.port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            conn.request("POST", "/streams/tls", body=b'{"plain":1}', headers=JSON)
            conn.getresponse().read()
    finally:
        conn.close()
    assert_serves(tls_server)


def assert_serves(server: GatewayProcess) -> None:
    status, body, _ = server.request("POST", "/streams/after", b'{"still":"serving"}', JSON)
    assert status == 202, body


def post_with(server: GatewayProcess, context: ssl.SSLContext, event: dict[str, Any]) -> int:
    conn = http.client.HTTPSConnection(HOST, server.port, timeout=10, context=context)
    try:
        conn.request("POST", "/streams/mtls", body=orjson.dumps(event), headers=JSON)
        return conn.getresponse().status
    finally:
        conn.close()


def stored_events(server: GatewayProcess, stream: str) -> list[Any]:
    status, body, _ = server.request("GET", f"/streams/{stream}/entries?limit=1000")
    if status == 404:
        return []
    assert status == 200, body
    return [e["value"] for e in orjson.loads(body)["entries"]]


# What the client hears from the handshake the gateway refuses: OpenSSL's alert.
ALERTS = {("no certificate", ssl.TLSVersion.TLSv1_2): "SSLV3_ALERT_HANDSHAKE_FAILURE",
          ("no certificate", ssl.TLSVersion.TLSv1_3): "TLSV13_ALERT_CERTIFICATE_REQUIRED",
          ("another CA's certificate", ssl.TLSVersion.TLSv1_2): "TLSV1_ALERT_UNKNOWN_CA",
          ("another CA's certificate", ssl.TLSVersion.TLSv1_3): "TLSV1_ALERT_UNKNOWN_CA"}


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_mutual_tls_refuses_a_client_without_a_valid_certificate(mtls_server: GatewayProcess, pki: Pki,
                                                                 who: str) -> None:
    """No HTTP status: the handshake fails, and the client is told why by the
    handshake's alert (1.2 in the handshake, 1.3 on the first read), never an
    empty reply or a reset."""
    cert: Issued | None = pki.stranger if who == "another CA's certificate" else None
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = pki.client_context(cert)
        context.maximum_version = version
        with pytest.raises(ssl.SSLError) as refused:
            post_with(mtls_server, context, {"who": who, "tls": str(version)})
        assert refused.value.reason == ALERTS[who, version], (version, refused.value)
    assert {"who": who} not in [{"who": e.get("who")} for e in stored_events(mtls_server, "mtls")]


def test_curl_without_a_client_certificate_shows_the_handshake_error(mtls_server: GatewayProcess,
                                                                    pki: Pki) -> None:
    """The TLS page's promise, as curl shows it."""
    for limit, code, says in ((["--tls-max", "1.2"], 35, "alert handshake failure"),
                              ([], 56, "alert certificate required")):
        out = subprocess.run(["curl", "-sS", *limit, "--cacert", str(pki.ca.cert), "-X", "POST",
                              "-H", "content-type: application/json", "--data", "{}",
                              f"{mtls_server.url}/streams/mtls"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == code and says in out.stderr, (out.returncode, out.stderr)


def test_mutual_tls_takes_a_client_certificate_of_its_ca(mtls_server: GatewayProcess, pki: Pki) -> None:
    assert post_with(mtls_server, pki.client_context(pki.client), {"who": "client"}) == 202
    assert {"who": "client"} in stored_events(mtls_server, "mtls")


# ---- a renewed certificate ----------------------------------------------------------------------

def renew(pki: Pki, name: str) -> Issued:
    """A new server certificate and key from the CA, moved over the served files
    one after the other (as a renewal tool does)."""
    new = issue(pki.ca, pki.directory / "renewed", name, server=True)
    for src, dst in ((new.cert, pki.server.cert), (new.key, pki.server.key)):
        tmp = dst.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    return new


@dataclass
class TlsPoster(Poster):
    """A poster that keeps the server certificate's serial of each new connection."""

    serials: list[int] = field(default_factory=list)

    def connected(self, conn: http.client.HTTPConnection) -> None:
        self.serials.append(peer_serial(conn.sock))


RENEWALS = 3


@pytest.mark.slow
def test_a_renewed_certificate_is_taken_on_hup_under_load_without_a_failed_request(
        tmp_path: Path) -> None:
    pki = Pki.make(tmp_path / "pki")
    with GatewayProcess(tmp_path / "data", env={**SMALL, **pki.env()}, tls=pki.client_context()) as server:
        server.wait_ready()
        clients = [TlsPoster(server, "fresh", keep_alive=False, batch=2),
                   TlsPoster(server, "keep-0", keep_alive=True, batch=2),
                   TlsPoster(server, "keep-1", keep_alive=True, batch=2)]
        threads = [c.start() for c in clients]
        serial = pki.server.serial
        try:
            for n in range(RENEWALS):
                wait_for("load", lambda: all(len(c.acked) > 20 * (n + 1) for c in clients))
                new = renew(pki, f"server-{n + 1}")
                with server.connect() as sock:  # before the HUP: the running certificate
                    assert peer_serial(sock) == serial
                seen = [len(c.serials) for c in clients]
                server.reload_workers()
                serial = new.serial
                with server.connect() as sock:  # after it, on any worker: the renewed one
                    assert peer_serial(sock) == serial
                # every client opens a connection to a new worker and sees the new certificate
                wait_for("every client on the new certificate",
                         lambda: all(len(c.serials) > s and c.serials[-1] == serial
                                     for c, s in zip(clients, seen)),
                         state=lambda: [(c.name, len(c.acked), c.serials[-3:], c.failures[-3:])
                                        for c in clients])
            so_far = [len(c.acked) for c in clients]
            wait_for("load after the last renewal", lambda: all(len(c.acked) > s + 10
                                                                for c, s in zip(clients, so_far)))
        finally:
            for c in clients:
                c.stop.set()
            for t in threads:
                t.join(timeout=30)
        assert server.stop() == 0
    failures = [f for c in clients for f in c.failures]
    assert not failures, f"{len(failures)} requests without an answer: {failures[:5]}"
    for c in clients:
        assert set(c.statuses) == {202}, (c.name, c.statuses)
    check_stored_once(tmp_path / "data", clients, exact=True)


def test_a_half_done_renewal_at_hup_keeps_the_running_certificate(tmp_path: Path) -> None:
    """The new certificate is in place but the key is still the old one when the HUP
    comes: the master refuses the pair and the new workers keep serving the old one."""
    pki = Pki.make(tmp_path / "pki")
    with GatewayProcess(tmp_path / "data", workers=1, env={**SMALL, **pki.env()},
                        tls=pki.client_context()) as server:
        server.wait_ready()
        new = issue(pki.ca, tmp_path / "renewed", "server-2", server=True)
        shutil.copyfile(new.cert, pki.server.cert)
        server.reload_workers()
        with server.connect() as sock:
            assert peer_serial(sock) == pki.server.serial
        assert_serves(server)
        shutil.copyfile(new.key, pki.server.key)  # the renewal completes; the next HUP takes it
        server.reload_workers()
        with server.connect() as sock:
            assert peer_serial(sock) == new.serial
        assert server.stop() == 0
    log = server.log_path.read_text()
    assert log.count("reload_config_invalid") == 1 and "do not load as a pair" in log
    # the reload that took the renewal says so, with the new certificate's serial
    [reloaded] = [r for r in map(orjson.loads, log.splitlines()) if r.get("event") == "reloaded"]
    assert reloaded["changed"] == ["tls"] and int(reloaded["tls_cert_serial"], 16) == new.serial
    assert reloaded["tls_cert_not_after"].endswith("GMT") and reloaded["tls_client_ca"] is False


# ---- the warning of a plaintext listener -------------------------------------------------------

@pytest.mark.parametrize("bind, tls, auth, warned", [
    ("0.0.0.0", False, {"COMET_AUTH": "off"}, 1),
    ("0.0.0.0", False, {"COMET_TOKENS": "t0ken-t0ken"}, 1),
    ("0.0.0.0", True, {"COMET_TOKENS": "t0ken-t0ken"}, 0),
    (HOST, False, {}, 0),
], ids=["any-auth-off", "any-tokens", "any-tls", "loopback"])
def test_a_plaintext_listener_beyond_loopback_is_warned_of_once(tmp_path: Path, pki: Pki, bind: str,
                                                                tls: bool, auth: dict[str, str],
                                                                warned: int) -> None:
    env = {**SMALL, **auth, **(pki.env() if tls else {})}
    with GatewayProcess(tmp_path / "data", env=env, bind=bind,
                        tls=pki.client_context() if tls else None) as server:
        server.wait_ready()
        assert server.stop() == 0
    lines = [orjson.loads(line) for line in server.log_path.read_bytes().splitlines()
             if b'"plaintext_listener"' in line]
    assert len(lines) == warned, lines
    for line in lines:
        assert line["level"] == "warning" and "clear text" in line["risk"], line


# ---- proxy headers -------------------------------------------------------------------------------

SPOOFED = {**JSON, "x-forwarded-for": "203.0.113.7", "x-forwarded-proto": "https"}


@pytest.mark.parametrize("trusted, client", [(None, HOST), ("127.0.0.1", "203.0.113.7")],
                         ids=["default", "proxy-trusted"])
def test_forwarded_headers_are_believed_only_from_a_trusted_proxy(tmp_path: Path, trusted: str | None,
                                                                  client: str) -> None:
    env = {**SMALL, **({"COMET_FORWARDED_ALLOW_IPS": trusted} if trusted else {})}
    with GatewayProcess(tmp_path / "data", workers=1, env=env) as server:
        server.wait_ready()
        status, body, _ = server.request("POST", "/streams/proxied", b'{"a":1}', SPOOFED)
        assert status == 202, body
        assert server.stop() == 0
    [line] = [orjson.loads(line) for line in server.log_path.read_bytes().splitlines()
              if b'"/streams/proxied"' in line]
    assert line["client"] == client, line


# ---- the configuration ---------------------------------------------------------------------------

def test_tls_settings_load_from_the_environment(pki: Pki) -> None:
    config = load(None, env=pki.env(mutual=True))
    assert config.tls is not None and config.tls.client_ca is not None
    assert config.tls.cert == pki.server.cert.read_bytes()
    assert "PRIVATE KEY" not in repr(config.tls)
    context = config.tls.context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert load(None, env={}).tls is None


@pytest.mark.parametrize("case, message", [
    ("cert only", "tls_cert_file is set but tls_key_file is not"),
    ("key only", "tls_key_file is set but tls_cert_file is not"),
    ("ca only", "tls_client_ca_file is set but tls_cert_file and tls_key_file are not"),
    ("missing cert", "tls_cert_file .*/nowhere.crt cannot be read: No such file"),
    ("unreadable key", "tls_key_file .*/server.key cannot be read: Is a directory"),
    ("wrong key", "certificate .*/server.crt and key .*/stranger.key do not load as a pair"),
    ("not a certificate", "certificate .*/garbage.pem and key .*/server.key do not load as a pair"),
    ("bad ca", "client CA .*/garbage.pem does not load"),
    ("bad proxy", "forwarded_allow_ips: '10.0.0.1/8' is not an IP address or network"),
])
def test_bad_tls_settings_are_config_errors_naming_the_file(tmp_path: Path, pki: Pki, case: str,
                                                           message: str) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    (tmp_path / "dir" / "server.key").mkdir(parents=True)
    cert, key = str(pki.server.cert), str(pki.server.key)
    env = {
        "cert only": {"COMET_TLS_CERT_FILE": cert},
        "key only": {"COMET_TLS_KEY_FILE": key},
        "ca only": {"COMET_TLS_CLIENT_CA_FILE": str(pki.ca.cert)},
        "missing cert": {"COMET_TLS_CERT_FILE": str(tmp_path / "nowhere.crt"), "COMET_TLS_KEY_FILE": key},
        "unreadable key": {"COMET_TLS_CERT_FILE": cert,
                           "COMET_TLS_KEY_FILE": str(tmp_path / "dir" / "server.key")},
        "wrong key": {"COMET_TLS_CERT_FILE": cert, "COMET_TLS_KEY_FILE": str(pki.stranger.key)},
        "not a certificate": {"COMET_TLS_CERT_FILE": str(garbage), "COMET_TLS_KEY_FILE": key},
        "bad ca": {**pki.env(), "COMET_TLS_CLIENT_CA_FILE": str(garbage)},
        "bad proxy": {"COMET_FORWARDED_ALLOW_IPS": "10.0.0.1/8"},
    }[case]
    with pytest.raises(ConfigError, match=message):
        load(None, env=env)


def test_serve_with_a_bad_certificate_stops_before_any_process_starts(tmp_path: Path, pki: Pki) -> None:
    env = {**SMALL, "COMET_TLS_CERT_FILE": str(pki.server.cert), "COMET_TLS_KEY_FILE": str(pki.stranger.key)}
    server = GatewayProcess(tmp_path / "data", workers=1, env=env)
    assert server.proc.wait(timeout=60) == 1
    server.stop()
    assert "do not load as a pair" in server.log_path.read_text()
    assert not (tmp_path / "data").exists()
