"""Generate a webhook CA and the serving certificates it signs (``cryptography``).

Owns key and certificate creation: a self-signed CA (CA:TRUE critical, keyCertSign + cRLSign,
subject key identifier) and serving certificates for a Kubernetes Service (CA:FALSE,
digitalSignature + keyEncipherment, extendedKeyUsage serverAuth, the Service DNS names as SANs,
authority key identifier). All functions take and return PEM bytes; none reads or writes files.

Keys are ECDSA P-256: supported by kube-apiserver (Go ``crypto/tls``), OpenSSL and every TLS 1.2+
client, far cheaper to generate than RSA, and with smaller handshakes. Signatures are ECDSA with
SHA-256. Private keys are PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``), unencrypted, as Kubernetes
TLS Secrets hold them.

Every certificate starts :data:`CLOCK_SKEW` in the past so that a machine whose clock is a little
behind still accepts it; a serving certificate never outlives its CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.material import (
    CertificateError,
    check_is_ca,
    check_key_matches,
    check_validity,
    parse_certificates,
    parse_private_key,
    utc_now,
)

CLOCK_SKEW = datetime.timedelta(minutes=5)
"""How far in the past a generated certificate's notBefore is set."""

MAX_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
"""The latest notAfter a certificate can hold: GeneralizedTime ``99991231235959Z`` (RFC 5280
§4.1.2.5, which also gives it as the value for "no well-defined expiration date")."""

# RFC 1123 label: what Kubernetes accepts for a namespace; Service names are a subset.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A host name label (RFC 1123 §2.1: letters, digits and hyphens, not starting or ending with a
# hyphen, at most 63 characters); DNS is case-insensitive, so capitals are allowed.
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
_DOTTED_NUMBERS = re.compile(r"[0-9]+(\.[0-9]+)*")


def max_days(now: datetime.datetime | None = None) -> int:
    """The most whole days a certificate starting at ``now`` (default: the clock) can be valid:
    up to :data:`MAX_NOT_AFTER`."""
    return (MAX_NOT_AFTER - (now or utc_now())).days


def dns_san_problem(name: str) -> str | None:
    """Why ``name`` cannot be a DNS subject alternative name, or None when it can.

    A DNS SAN is an RFC 1123 host name (dot-separated labels of letters, digits and inner
    hyphens, each 1-63 characters, 253 in all) whose last label is not all digits — RFC 1123
    §2.1: a host name never has the dotted-decimal form of an address, so ``999.1.1.1`` (an IPv4
    address out of range) is refused instead of being written as a DNS name no client resolves
    — optionally with a ``*`` wildcard as its whole leftmost label (RFC 6125 §6.4.3).
    """
    if _DOTTED_NUMBERS.fullmatch(name):
        return ("looks like an IPv4 address but is not one (four numbers 0-255 separated by "
                "dots, e.g. 10.0.0.1)") if name.count(".") == 3 else (
            "all digits and dots: neither an IP address nor a host name (RFC 1123 §2.1: the "
            "last label of a host name is not all digits)")
    if len(name) > 253:
        return f"{len(name)} characters: a DNS name has at most 253"
    labels = name.split(".")
    if labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    for label in labels:
        if not _HOST_LABEL.fullmatch(label):
            shown = repr(label) if label else "an empty label"
            return (f"{shown} is not a DNS label (letters, digits and '-', starting and ending "
                    "with a letter or digit, at most 63 characters; '*' only as the whole "
                    "leftmost label)")
    if labels[-1].isdigit():
        return (f"its last label {labels[-1]!r} is all digits: not a host name (RFC 1123 §2.1) "
                "and not an IP address")
    return None


def check_san(text: str) -> str:
    """``text`` stripped when it is an IP address or a DNS name a SAN can hold.

    Raises:
        ValueError: ``"subject alternative name '<text>': <why>"`` (:func:`dns_san_problem`).
    """
    name = text.strip()
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    problem = "empty" if not name else dns_san_problem(name)
    if problem:
        raise ValueError(f"subject alternative name {text!r}: {problem}; expected a DNS name "
                         "or an IP address")
    return name


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The four DNS names a client can use for a Service, shortest first.

    ``NAME``, ``NAME.NS``, ``NAME.NS.svc``, ``NAME.NS.svc.cluster.local`` (kube-apiserver calls
    ``NAME.NS.svc``).

    Raises:
        ValueError: ``service`` or ``namespace`` is not an RFC 1123 DNS label.
    """
    for what, value in (("service", service), ("namespace", namespace)):
        if not _DNS_LABEL.match(value):
            raise ValueError(
                f"{what} {value!r}: not a DNS label (lowercase letters, digits and '-', "
                "starting and ending with a letter or digit, at most 63 characters)"
            )
    base = f"{service}.{namespace}"
    return [service, base, f"{base}.svc", f"{base}.svc.cluster.local"]


def _general_names(sans: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for san in sans:
        text = san.strip()
        if not text or text in seen:
            continue
        seen.add(text)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(text)))
            continue
        except ValueError:
            pass
        names.append(x509.DNSName(check_san(text)))
    if not names:
        raise ValueError("a serving certificate needs at least one subject alternative name")
    return names


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _window(
    days: int, not_before: datetime.datetime | None
) -> tuple[datetime.datetime, datetime.datetime]:
    """(notBefore, notAfter) of a certificate valid ``days`` from ``not_before`` (default: now,
    started :data:`CLOCK_SKEW` earlier).

    Raises:
        ValueError: ``days`` < 1, a notAfter past :data:`MAX_NOT_AFTER`, a naive ``not_before``.
    """
    if days < 1:
        raise ValueError(f"days {days}: a certificate must be valid for at least 1 day")
    if not_before is not None and not_before.tzinfo is None:
        raise ValueError("not_before must be timezone-aware")
    now = utc_now().replace(microsecond=0)
    start = now if not_before is None else not_before.astimezone(datetime.UTC)
    if days > max_days(start):  # checked first: the sum would overflow datetime
        raise ValueError(days_beyond_limit(days, start))
    end = start + datetime.timedelta(days=days)
    return (now - CLOCK_SKEW if not_before is None else start), end


def days_beyond_limit(days: int, start: datetime.datetime) -> str:
    """The message for ``days`` past :func:`max_days` of ``start``."""
    return (f"{days} days from {start:%Y-%m-%d} would end after {MAX_NOT_AFTER:%Y-%m-%d}, the "
            f"latest notAfter a certificate can hold (RFC 5280 §4.1.2.5): at most "
            f"{max_days(start)} days")


def generate_ca(
    common_name: str, days: int, *, not_before: datetime.datetime | None = None
) -> tuple[bytes, bytes]:
    """A new self-signed CA.

    Args:
        common_name: the subject CN (e.g. ``"gpuguard webhook CA"``).
        days: validity in days from now (or from ``not_before``), at least 1.
        not_before: start of validity (timezone-aware); default now minus :data:`CLOCK_SKEW`.
            Tests use a fixed past date to make expired CAs.

    Returns:
        ``(cert_pem, key_pem)``: the CA certificate (basicConstraints CA:TRUE, pathLen 0,
        critical; keyUsage keyCertSign + cRLSign + digitalSignature, critical; subject and
        authority key identifiers) and its PKCS#8 P-256 private key.

    Raises:
        ValueError: empty ``common_name``, ``days`` < 1 or a naive ``not_before``.
    """
    if not common_name.strip():
        raise ValueError("common_name: a CA needs a non-empty common name")
    start, end = _window(days, not_before)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue_serving_cert(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    common_name: str,
    sans: Sequence[str],
    days: int,
    *,
    not_before: datetime.datetime | None = None,
    ca_cert_source: str = "CA certificate",
    ca_key_source: str = "CA key",
) -> tuple[bytes, bytes]:
    """A new serving certificate and key for explicit subject alternative names.

    Args:
        ca_cert_pem: the CA certificate PEM (the first certificate of the data is used).
        ca_key_pem: the CA private key PEM.
        common_name: the subject CN (informational: clients match the SANs).
        sans: DNS names (``*.`` wildcards allowed) and IP addresses; duplicates are dropped.
        days: validity in days, at least 1; cut to the CA's notAfter.
        not_before: start of validity (timezone-aware); default now minus :data:`CLOCK_SKEW`.
        ca_cert_source: the CA certificate's file name, for messages.
        ca_key_source: the CA key's file name, for messages.

    Returns:
        ``(cert_pem, key_pem)`` of the leaf (CA:FALSE; digitalSignature + keyEncipherment;
        serverAuth; SANs; authority key identifier = the CA's subject key identifier).

    Raises:
        CertificateError: the CA material is not PEM, the key does not match the CA
            certificate, the certificate is not a CA, or the CA is expired or not yet valid;
            the message starts with the source name.
        ValueError: a bad SAN, ``days`` < 1, or a validity window that ends before it starts
            once cut to the CA's notAfter.
    """
    ca_cert = parse_certificates(ca_cert_pem, ca_cert_source)[0]
    ca_key = parse_private_key(ca_key_pem, ca_key_source)
    check_is_ca(ca_cert, ca_cert_source)
    check_key_matches(ca_cert, ca_key, ca_cert_source, ca_key_source)
    check_validity(ca_cert, ca_cert_source, utc_now())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(
            f"{ca_key_source}: unsupported CA key type {type(ca_key).__name__} "
            "(ECDSA or RSA expected)"
        )
    names = _general_names(sans)
    start, end = _window(days, not_before)
    end = min(end, ca_cert.not_valid_after_utc)
    if end <= start:
        raise ValueError(
            f"the serving certificate would end ({end:%Y-%m-%dT%H:%M:%SZ}) before it starts "
            f"({start:%Y-%m-%dT%H:%M:%SZ}): the CA expires first"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(aki, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def generate_serving_cert(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    service: str,
    namespace: str,
    days: int,
    extra_sans: Sequence[str] = (),
    *,
    not_before: datetime.datetime | None = None,
    ca_cert_source: str = "CA certificate",
    ca_key_source: str = "CA key",
) -> tuple[bytes, bytes]:
    """A serving certificate for the Service ``service`` in ``namespace``, signed by the CA.

    SANs: ``NAME``, ``NAME.NS``, ``NAME.NS.svc``, ``NAME.NS.svc.cluster.local``, then
    ``extra_sans`` (IP addresses such as ``127.0.0.1`` become IP SANs, for local development).
    The subject CN is ``NAME.NS.svc``. See :func:`issue_serving_cert` for the other arguments,
    the returned ``(cert_pem, key_pem)`` and the extensions.

    Raises:
        CertificateError: the CA material is refused (message starts with its source).
        ValueError: ``service`` / ``namespace`` not a DNS label, a bad extra SAN, ``days`` < 1.
    """
    names = service_dns_names(service, namespace)
    return issue_serving_cert(
        ca_cert_pem, ca_key_pem, names[2], [*names, *extra_sans], days,
        not_before=not_before, ca_cert_source=ca_cert_source, ca_key_source=ca_key_source,
    )
