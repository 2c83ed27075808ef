"""Read, parse and check PEM certificates and private keys.

Owns the checks every other ``certs`` module relies on — readable file, PEM certificate, PEM
private key, key matches certificate, validity window, CA certificate, server certificate — and
:class:`CertificateError`, whose message always starts with the file (or the named source) and says
what is wrong. Must not write files, open sockets or build TLS contexts.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY_SUFFIX = b"PRIVATE KEY-----"


class CertificateError(Exception):
    """TLS material refused. ``str(error)`` is ``"<file or source>: <problem>"``, one line."""


def utc_now() -> datetime.datetime:
    """The current time, timezone-aware UTC (the one clock read of the ``certs`` package)."""
    return datetime.datetime.now(datetime.UTC)


def timestamp(moment: datetime.datetime) -> str:
    """``moment`` as ``2030-01-31T12:00:00Z`` (UTC, second precision) for messages."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_file(path: str | Path) -> bytes:
    """The bytes of ``path``.

    Raises:
        CertificateError: ``"<path>: file not found"``, ``"<path>: is a directory, not a file"``
            or ``"<path>: cannot read: <reason>"``.
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise CertificateError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise CertificateError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse_certificates(data: bytes, source: str) -> list[x509.Certificate]:
    """Every certificate of a PEM file, in file order (the first is the leaf of a chain).

    Args:
        data: the file content; text around the PEM blocks is ignored.
        source: the file name (or a label such as ``"CA certificate"``) for messages.

    Raises:
        CertificateError: ``"<source>: not a PEM certificate (no '-----BEGIN CERTIFICATE-----'
            block)"`` or ``"<source>: invalid PEM certificate: <reason>"``.
    """
    if _PEM_CERT not in data:
        raise CertificateError(
            f"{source}: not a PEM certificate (no '-----BEGIN CERTIFICATE-----' block)"
        )
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise CertificateError(f"{source}: invalid PEM certificate: {exc}") from None


def parse_private_key(data: bytes, source: str) -> PrivateKeyTypes:
    """The unencrypted private key of a PEM file (PKCS#8, SEC1 ``EC`` or PKCS#1 ``RSA``).

    Raises:
        CertificateError: ``"<source>: not a PEM private key (no '-----BEGIN PRIVATE KEY-----'
            block)"``, ``"<source>: private key is encrypted; an unencrypted key is needed"`` or
            ``"<source>: invalid PEM private key: <reason>"``.
    """
    if _PEM_KEY_SUFFIX not in data:
        raise CertificateError(
            f"{source}: not a PEM private key (no '-----BEGIN PRIVATE KEY-----' block)"
        )
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CertificateError(
            f"{source}: private key is encrypted; an unencrypted key is needed"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CertificateError(f"{source}: invalid PEM private key: {reason}") from None


def _spki(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def check_key_matches(
    cert: x509.Certificate, key: PrivateKeyTypes, cert_source: str, key_source: str
) -> None:
    """Refuse a private key whose public half is not the certificate's public key.

    Raises:
        CertificateError: ``"<key_source>: private key does not match the certificate in
            <cert_source>"``.
    """
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise CertificateError(
            f"{key_source}: private key does not match the certificate in {cert_source}"
        )


def subject_text(cert: x509.Certificate) -> str:
    """The subject as an RFC 4514 string (``CN=gpuguard CA``), or ``(empty subject)``."""
    return cert.subject.rfc4514_string() or "(empty subject)"


def check_validity(
    cert: x509.Certificate,
    source: str,
    now: datetime.datetime,
    not_yet_valid_tolerance: datetime.timedelta = datetime.timedelta(0),
) -> None:
    """Refuse a certificate outside its validity window at ``now``.

    Args:
        cert: the certificate.
        source: file name or label for messages.
        now: timezone-aware time to check against.
        not_yet_valid_tolerance: accept a notBefore up to this far in the future (clock skew
            between the machine that issued the certificate and this one).

    Raises:
        CertificateError: ``"<source>: certificate <subject> expired at <notAfter>"`` or
            ``"<source>: certificate <subject> is not valid before <notBefore>"`` (times as
            ``2030-01-31T12:00:00Z``).
    """
    not_after = cert.not_valid_after_utc
    not_before = cert.not_valid_before_utc
    if now >= not_after:
        raise CertificateError(
            f"{source}: certificate {subject_text(cert)} expired at {timestamp(not_after)}"
        )
    if now + not_yet_valid_tolerance < not_before:
        raise CertificateError(
            f"{source}: certificate {subject_text(cert)} is not valid before "
            f"{timestamp(not_before)}"
        )


def _extension(cert: x509.Certificate, kind: type[x509.ExtensionType]) -> x509.ExtensionType | None:
    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def is_ca(cert: x509.Certificate) -> bool:
    """Whether the certificate has basicConstraints ``CA:TRUE``."""
    constraints = _extension(cert, x509.BasicConstraints)
    return isinstance(constraints, x509.BasicConstraints) and constraints.ca


def check_is_ca(cert: x509.Certificate, source: str) -> None:
    """Refuse a certificate that cannot sign certificates.

    Raises:
        CertificateError: ``"<source>: not a CA certificate: basicConstraints is not CA:TRUE"``
            or ``"<source>: not a CA certificate: keyUsage lacks keyCertSign"``.
    """
    if not is_ca(cert):
        raise CertificateError(f"{source}: not a CA certificate: basicConstraints is not CA:TRUE")
    usage = _extension(cert, x509.KeyUsage)
    if isinstance(usage, x509.KeyUsage) and not usage.key_cert_sign:
        raise CertificateError(f"{source}: not a CA certificate: keyUsage lacks keyCertSign")


def check_is_server(cert: x509.Certificate, source: str) -> None:
    """Refuse a certificate a TLS client (kube-apiserver) would not accept for a server.

    Raises:
        CertificateError: ``"<source>: not a server certificate: <why>"`` where why is ``it is a
            CA certificate (CA:TRUE)``, ``extendedKeyUsage lacks serverAuth``, ``keyUsage lacks
            digitalSignature and keyEncipherment`` or ``no subjectAltName (clients ignore the
            common name)``.
    """
    why = None
    usage = _extension(cert, x509.KeyUsage)
    extended = _extension(cert, x509.ExtendedKeyUsage)
    if is_ca(cert):
        why = "it is a CA certificate (CA:TRUE)"
    elif isinstance(extended, x509.ExtendedKeyUsage) and (
        ExtendedKeyUsageOID.SERVER_AUTH not in list(extended)
    ):
        why = "extendedKeyUsage lacks serverAuth"
    elif isinstance(usage, x509.KeyUsage) and not (
        usage.digital_signature or usage.key_encipherment
    ):
        why = "keyUsage lacks digitalSignature and keyEncipherment"
    elif _extension(cert, x509.SubjectAlternativeName) is None:
        why = "no subjectAltName (clients ignore the common name)"
    if why:
        raise CertificateError(f"{source}: not a server certificate: {why}")


def subject_alt_names(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses of the subjectAltName, in certificate order."""
    sans = _extension(cert, x509.SubjectAlternativeName)
    if not isinstance(sans, x509.SubjectAlternativeName):
        return []
    return [str(name.value) for name in sans
            if isinstance(name, x509.DNSName | x509.IPAddress)]


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the DER certificate as ``AB:CD:…`` (as ``openssl x509 -fingerprint`` prints)."""
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def to_pem(certs: list[x509.Certificate]) -> bytes:
    """The certificates as concatenated PEM blocks (text around them dropped)."""
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
