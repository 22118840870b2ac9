"""Make the test broker's TLS material (scripts/kafka.sh, at each fresh format): a CA, a
server certificate for 127.0.0.1 signed by it, and a client certificate signed by it,
each key PKCS#8 PEM without a password (test material only, never a real secret).

    python scripts/kafka_tls.py DIR

    file         what                                     read by
    -----------  ---------------------------------------  --------------------------------
    ca.pem       the CA certificate                       clients (ssl_cafile), the broker
    server.pem   the server's key, then its certificate   the broker (PEM keystore)
    client.pem   the client's certificate (CN weir-sink)  a mutual-TLS client (ssl_certfile)
    client.key   the client's key                         that client (ssl_keyfile)
    other-ca.pem a CA that signed nothing here            the test of an untrusted server
"""
from __future__ import annotations

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.UTC)
VALID = (NOW - datetime.timedelta(days=1), NOW + datetime.timedelta(days=3650))


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: str, issuer: x509.Name, key: rsa.RSAPrivateKey) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(VALID[0]).not_valid_after(VALID[1]))


def _ca(subject: str) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = _key()
    cert = (_builder(subject, _name(subject), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(subject: str, usage: x509.ObjectIdentifier, ca_key: rsa.RSAPrivateKey,
          ca: x509.Certificate, server: bool) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = _key()
    builder = (_builder(subject, ca.subject, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def main(directory: Path) -> None:
    """Write the files of the table above into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("weir-test-ca")
    server_key, server = _leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, ca_key, ca, True)
    client_key, client = _leaf("weir-sink", ExtendedKeyUsageOID.CLIENT_AUTH, ca_key, ca, False)
    (directory / "ca.pem").write_bytes(_cert_pem(ca))
    (directory / "server.pem").write_bytes(_key_pem(server_key) + _cert_pem(server))
    (directory / "client.pem").write_bytes(_cert_pem(client))
    (directory / "client.key").write_bytes(_key_pem(client_key))
    (directory / "other-ca.pem").write_bytes(_cert_pem(_ca("weir-test-other-ca")[1]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
