"""Certificates and keys for the test tier's control plane (kube-apiserver, its admin client).

Owns what kube-apiserver needs to start on loopback and what its admin client presents: one CA, a
serving certificate for ``127.0.0.1`` / ``localhost``, a client certificate in ``system:masters``
(the group RBAC's bootstrap binds to cluster-admin) and the service-account signing key pair.
gpuguard's own ``certs/`` code makes only CAs and *serving* certificates (its job is the webhook's
TLS), so the client certificate is made here with ``cryptography``, the library ``certs/`` uses.

Must not be used outside ``tests/controlplane``: keys are written unencrypted into a temporary
directory that the fixture removes.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ControlPlanePKI:
    """Paths of the PEM files made by :func:`make_pki` (all in one directory).

    Attributes:
        ca_cert: the CA that signs the serving and client certificates (``--client-ca-file``).
        serving_cert / serving_key: kube-apiserver's ``--tls-cert-file`` / ``--tls-private-key-file``.
        admin_cert / admin_key: the client certificate ``CN=gpuguard-test-admin,
            O=system:masters``.
        sa_key / sa_pub: the service-account signing key and its public key.
    """

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def make_pki(directory: Path, *, days: int = 2) -> ControlPlanePKI:
    """Write a fresh CA, serving and admin certificates and the SA key pair into ``directory``.

    Keys are ECDSA P-256 (kube-apiserver accepts ES256 service-account signing keys). Validity
    starts an hour in the past (clock skew) and lasts ``days`` days.

    Returns:
        The :class:`ControlPlanePKI` with the file paths.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuguard-test-control-plane-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(subject: x509.Name, usage: x509.ObjectIdentifier,
             sans: list[x509.GeneralName]) -> tuple[bytes, bytes]:
        key = _key()
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       ca_key.public_key()), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    serving_cert, serving_key = leaf(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.DNSName("kubernetes.default.svc"),
         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    admin_cert, admin_key = leaf(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuguard-test-admin"),
                   x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")]),
        ExtendedKeyUsageOID.CLIENT_AUTH, [])
    sa_key = _key()
    return ControlPlanePKI(
        ca_cert=_write(directory / "ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        serving_cert=_write(directory / "apiserver.crt", serving_cert),
        serving_key=_write(directory / "apiserver.key", serving_key, 0o600),
        admin_cert=_write(directory / "admin.crt", admin_cert),
        admin_key=_write(directory / "admin.key", admin_key, 0o600),
        sa_key=_write(directory / "sa.key", _key_pem(sa_key), 0o600),
        sa_pub=_write(directory / "sa.pub", sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)),
    )
