"""Certificates for TLS tests, made in the test (the ``cryptography`` package):
CAs, a server certificate for 127.0.0.1, client certificates; the COMET_TLS_*
settings of a gateway that serves with them, and client contexts."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def serial(self) -> int:
        return self.certificate.serial_number


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)  # as docs/tls.md asks: the gateway warns of a key others can read
    return Issued(cert_path, key_path, cert, key)


def make_ca(directory: Path, name: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY).not_valid_after(now + DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _write(directory, name, cert, key)


def issue(ca: Issued, directory: Path, name: str, *, server: bool) -> Issued:
    """A leaf signed by ``ca``: for 127.0.0.1 (server) or a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca.certificate.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - DAY).not_valid_after(now + DAY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return _write(directory, name, builder.sign(ca.private_key, hashes.SHA256()), key)


@dataclass(frozen=True)
class Pki:
    """A CA with a server certificate for 127.0.0.1 and a client certificate;
    another CA with a client certificate of its own (which the first CA's
    gateway must refuse)."""

    directory: Path
    ca: Issued
    server: Issued
    client: Issued
    other_ca: Issued
    stranger: Issued

    @classmethod
    def make(cls, directory: Path) -> Pki:
        ca, other = make_ca(directory, "test-ca"), make_ca(directory, "other-ca")
        return cls(directory, ca, issue(ca, directory, "server", server=True),
                   issue(ca, directory, "client", server=False), other,
                   issue(other, directory, "stranger", server=False))

    def env(self, *, mutual: bool = False) -> dict[str, str]:
        """The COMET_TLS_* settings of a gateway serving ``server`` (and, mutual,
        requiring a client certificate of ``ca``)."""
        env = {"COMET_TLS_CERT_FILE": str(self.server.cert), "COMET_TLS_KEY_FILE": str(self.server.key)}
        if mutual:
            env["COMET_TLS_CLIENT_CA_FILE"] = str(self.ca.cert)
        return env

    def client_context(self, cert: Issued | None = None) -> ssl.SSLContext:
        """A client trusting ``ca`` (and presenting ``cert``, if given)."""
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        if cert is not None:
            ctx.load_cert_chain(str(cert.cert), str(cert.key))
        return ctx
