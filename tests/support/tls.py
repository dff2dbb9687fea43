"""Throwaway TLS material for the HTTPS and mutual-TLS tests, made with ``cryptography``.

`make_tls` writes into a directory (a test's ``tmp_path``) a fresh CA, a server certificate for
127.0.0.1, 127.0.0.2 and localhost, and a client certificate, all signed by that CA, as PEM files;
the private keys are mode 600. Nothing is trusted outside the process that is told about the CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["SERVER_HOSTS", "TlsFiles", "make_tls"]

SERVER_HOSTS = ("127.0.0.1", "127.0.0.2", "localhost")
_VALIDITY = datetime.timedelta(days=7)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate a clock a little behind


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of the PEM files `make_tls` wrote."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_name: str  # the client certificate's common name

    def server_context(self) -> ssl.SSLContext:
        """A server ``SSLContext`` presenting the server certificate (no client certificate
        asked for). For ``asyncio.start_server(ssl=...)``."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.server_cert), str(self.server_key))
        return context

    def client_context(self, with_cert: bool = True) -> ssl.SSLContext:
        """A client ``SSLContext`` that trusts only this CA (hostname checked), presenting the
        client certificate when ``with_cert``. For ``httpx.Client(verify=...)``."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_tls(directory: Path | str, *, client_name: str = "cardfence-test-client") -> TlsFiles:
    """A fresh CA, server certificate (SERVER_HOSTS) and client certificate in ``directory``
    (created if missing) as ``ca.pem``, ``server.pem``/``server.key``, ``client.pem``/
    ``client.key``. Each call makes a new CA: material from two calls does not trust each other."""
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cardfence test CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (
            _builder(name, ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server_sans: list[x509.GeneralName] = []
    for host in SERVER_HOSTS:
        try:
            server_sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            server_sans.append(x509.DNSName(host))
    server_cert, server_key = leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, server_sans)
    client_cert, client_key = leaf(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    files = TlsFiles(
        ca=where / "ca.pem",
        server_cert=where / "server.pem",
        server_key=where / "server.key",
        client_cert=where / "client.pem",
        client_key=where / "client.key",
        client_name=client_name,
    )
    _write_cert(files.ca, ca_cert)
    _write_cert(files.server_cert, server_cert)
    _write_key(files.server_key, server_key)
    _write_cert(files.client_cert, client_cert)
    _write_key(files.client_key, client_key)
    return files


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    path.chmod(0o600)  # the file may have existed with a wider mode
