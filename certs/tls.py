"""The webhook's TLS server context, reloaded in place when the certificate files change.

Owns :class:`ReloadingTLS`: one server-side :class:`ssl.SSLContext` (TLS 1.2 or newer) for the
whole process, loaded from a certificate chain file and a private key file (``tls.crt`` /
``tls.key`` of a Kubernetes TLS Secret), optionally verifying client certificates against a CA
file (``--client-ca``), and :class:`TLSError`.

Protocol and suites. TLS 1.2 is limited to forward-secret AEAD suites — ECDHE key exchange with
AES-GCM or ChaCha20-Poly1305 (:data:`TLS12_CIPHERS`): no CBC (Lucky 13 and other padding
oracles), no static RSA key exchange, no DHE. TLS 1.3 suites are OpenSSL's (all AEAD). Go's
``crypto/tls`` client of kube-apiserver offers these by default. Client-initiated TLS 1.2
renegotiation is off.

Client certificates. With a client CA, a client that presents a certificate must present one
that chains to that CA (and is fit for client authentication), or the handshake fails; a client
that presents none is let through the handshake (``CERT_OPTIONAL``), so that kubelet's probes and
Prometheus can reach ``/healthz``, ``/readyz`` and ``/metrics``, and the webhook refuses its
``/validate`` and ``/mutate`` requests (401, :mod:`webhook.app`). The CA file is read once, at
start: OpenSSL can add CAs to a live context but not remove them, so a changed CA needs a
restart. Must not open sockets, serve HTTP
or schedule its own polling: the server calls :meth:`ReloadingTLS.reload_if_changed` (for example
every few seconds, from the event-loop thread that performs the handshakes).

Change detection. Kubernetes updates Secret and ConfigMap volumes by writing the new files into a
fresh directory and swapping a ``..data`` symlink, so a path's mtime can stay the same, jump
backwards, or change without the content changing (kubelet resyncs). The files are therefore read
at each check and compared by a SHA-256 of their bytes; mtimes (of the files the paths resolve
to) are recorded alongside and reported in :attr:`ReloadingTLS.mtimes`, never trusted alone.

Reload. New material is validated first (PEM, key matches certificate, validity, a server
certificate) and then loaded with :meth:`ssl.SSLContext.load_cert_chain` into the *same* context:
new handshakes present the new certificate, connections already open keep theirs. The bytes that
were validated are exactly the bytes loaded — they go through an anonymous in-memory file (Linux
``memfd``) or a private temporary file — so a file swapped between the check and the load cannot
put unchecked material in the context; and they are first loaded into a scratch context, so that
OpenSSL refusing them cannot leave the live context half updated. On refusal the old certificate
keeps being served and :class:`TLSError` is raised.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography import x509

from certs.material import (
    CertificateError,
    check_is_ca,
    check_is_server,
    check_key_matches,
    check_validity,
    fingerprint,
    parse_certificates,
    parse_private_key,
    read_file,
    subject_alt_names,
    utc_now,
)

NOT_YET_VALID_TOLERANCE = datetime.timedelta(minutes=5)
"""A certificate whose notBefore is at most this far in the future is accepted (clock skew
between the issuer — cert-manager, another node — and this machine)."""

_READ_ATTEMPTS = 3
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL"
"""OpenSSL cipher list of TLS 1.2 (see module docstring); TLS 1.3 suites are not affected."""


class TLSError(CertificateError):
    """TLS material refused; ``str(error)`` is ``"<file>: <problem>"``, one line.

    Problems: file not found, not a PEM certificate / private key, private key does not match
    the certificate, certificate expired / not valid before a date, not a server certificate,
    OpenSSL refused it.

    A subclass of :class:`certs.material.CertificateError` (itself an :class:`Exception`).
    """


@dataclass(frozen=True)
class _Material:
    """Validated certificate chain and key, as read from the files."""

    cert_pem: bytes
    key_pem: bytes
    digest: str
    mtimes: tuple[float, float]
    leaf: x509.Certificate


def _digest(cert_pem: bytes, key_pem: bytes) -> str:
    return hashlib.sha256(hashlib.sha256(cert_pem).digest() + hashlib.sha256(key_pem).digest()
                          ).hexdigest()


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime  # follows the ..data symlink to the real file
    except OSError:
        return 0.0


def _memfd_paths(cert_pem: bytes, key_pem: bytes, fds: list[int]) -> tuple[str, str] | None:
    """``/proc/self/fd`` paths of anonymous in-memory files holding the bytes, or None where
    ``memfd_create`` or ``/proc`` is unavailable (the descriptors opened are added to ``fds``)."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return None
    paths = []
    try:
        for data in (cert_pem, key_pem):
            fd = memfd_create("gpuguard-tls", getattr(os, "MFD_CLOEXEC", 0))
            fds.append(fd)
            with os.fdopen(fd, "wb", closefd=False) as handle:
                handle.write(data)
            path = f"/proc/self/fd/{fd}"
            with open(path, "rb") as check:  # /proc may be missing or restricted
                if check.read() != data:
                    return None
            paths.append(path)
    except OSError:
        return None
    return paths[0], paths[1]


@contextmanager
def _private_files(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """Paths holding exactly these bytes, readable only by this process, removed on exit.

    Linux: anonymous in-memory files (works with a read-only root filesystem). Elsewhere: a
    private temporary directory (mode 0700, key file 0600), deleted on exit.
    """
    fds: list[int] = []
    try:
        paths = _memfd_paths(cert_pem, key_pem, fds)
        if paths is not None:
            yield paths
            return
    finally:
        for fd in fds:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix="gpuguard-tls-") as directory:
        written = []
        for name, data in (("tls.crt", cert_pem), ("tls.key", key_pem)):
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            written.append(path)
        yield written[0], written[1]


class ReloadingTLS:
    """A server :class:`ssl.SSLContext` that follows changes of a certificate and key file.

    Args:
        cert_file: PEM certificate chain, the serving certificate first (``tls.crt``).
        key_file: its unencrypted PEM private key (``tls.key``).
        client_ca: PEM CA certificates that client certificates must chain to (see module
            docstring); None: client certificates are not asked for.

    Raises:
        TLSError: the initial material is refused (see :class:`TLSError`), or the client CA
            file holds no CA certificate.

    Attributes are read-only: :attr:`context`, :attr:`not_after`, :attr:`fingerprint`,
    :attr:`serial_number`, :attr:`subject_alt_names`, :attr:`mtimes`, :attr:`cert_file`,
    :attr:`key_file`, :attr:`client_ca`. :meth:`reload_if_changed` is thread-safe with itself.
    """

    def __init__(self, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str],
                 *, client_ca: str | os.PathLike[str] | None = None) -> None:
        self._cert_file = os.fspath(cert_file)
        self._key_file = os.fspath(key_file)
        self._client_ca = os.fspath(client_ca) if client_ca is not None else None
        self._lock = threading.Lock()
        material = self._read_and_validate()
        context = server_context()
        if self._client_ca is not None:
            _require_client_ca(context, self._client_ca)
        self._load(context, material)
        self._context = context
        self._material = material

    @property
    def context(self) -> ssl.SSLContext:
        """The server-side context (TLS ≥ 1.2); the same object for the life of this instance."""
        return self._context

    @property
    def client_ca(self) -> str | None:
        """The client CA file path, as given; None when client certificates are not asked for."""
        return self._client_ca

    @property
    def cert_file(self) -> str:
        """The certificate chain file path, as given."""
        return self._cert_file

    @property
    def key_file(self) -> str:
        """The private key file path, as given."""
        return self._key_file

    @property
    def not_after(self) -> datetime.datetime:
        """The notAfter of the serving certificate now loaded (timezone-aware UTC)."""
        return self._material.leaf.not_valid_after_utc

    @property
    def fingerprint(self) -> str:
        """SHA-256 fingerprint of the serving certificate now loaded, ``AB:CD:…`` (95 chars)."""
        return fingerprint(self._material.leaf)

    @property
    def serial_number(self) -> int:
        """Serial number of the serving certificate now loaded."""
        return self._material.leaf.serial_number

    @property
    def subject_alt_names(self) -> list[str]:
        """DNS names and IP addresses of the serving certificate now loaded."""
        return subject_alt_names(self._material.leaf)

    @property
    def mtimes(self) -> tuple[float, float]:
        """Modification times (epoch seconds) of the loaded certificate and key files.

        As seen when the loaded material was read (the files the paths resolved to then).
        """
        return self._material.mtimes

    def reload_if_changed(self) -> bool:
        """Load the files again if their content changed since the last load.

        Returns:
            True when a new certificate was loaded into :attr:`context`; False when the content
            is unchanged (a new mtime with identical bytes is not a change).

        Raises:
            TLSError: the files changed but the new material is refused, or a file cannot be
                read; the old certificate stays loaded and is still served. Raised on every
                call while the files hold refused material.
        """
        with self._lock:
            cert_pem, key_pem = self._read_pair()
            if _digest(cert_pem, key_pem) == self._material.digest:
                return False
            material = self._read_and_validate()
            if material.digest == self._material.digest:
                return False
            self._load(self._context, material)
            self._material = material
            return True

    def _read_pair(self) -> tuple[bytes, bytes]:
        try:
            return read_file(self._cert_file), read_file(self._key_file)
        except CertificateError as exc:
            raise TLSError(str(exc)) from None

    def _read_and_validate(self) -> _Material:
        """Read both files consistently (re-reading while a swap is in progress) and check them."""
        error: TLSError | None = None
        previous = None
        for _ in range(_READ_ATTEMPTS):
            mtimes = (_mtime(self._cert_file), _mtime(self._key_file))
            cert_pem, key_pem = self._read_pair()
            digest = _digest(cert_pem, key_pem)
            try:
                leaf = self._validate(cert_pem, key_pem)
                return _Material(cert_pem, key_pem, digest, mtimes, leaf)
            except TLSError as exc:
                error = exc
            if digest == previous:
                break  # stable content, genuinely refused
            previous = digest
        assert error is not None
        raise error

    def _validate(self, cert_pem: bytes, key_pem: bytes) -> x509.Certificate:
        try:
            leaf = parse_certificates(cert_pem, self._cert_file)[0]
            key = parse_private_key(key_pem, self._key_file)
            check_key_matches(leaf, key, self._cert_file, self._key_file)
            check_validity(leaf, self._cert_file, utc_now(), NOT_YET_VALID_TOLERANCE)
            check_is_server(leaf, self._cert_file)
        except CertificateError as exc:
            raise TLSError(str(exc)) from None
        return leaf

    def _load(self, context: ssl.SSLContext, material: _Material) -> None:
        with _private_files(material.cert_pem, material.key_pem) as (cert_path, key_path):
            try:
                scratch = server_context()
                scratch.load_cert_chain(cert_path, key_path)
            except (ssl.SSLError, OSError) as exc:
                raise TLSError(
                    f"{self._cert_file}: OpenSSL refused the certificate or key "
                    f"{self._key_file}: {exc}"
                ) from None
            context.load_cert_chain(cert_path, key_path)


def server_context() -> ssl.SSLContext:
    """A server context with gpuguard's protocol settings and no certificate yet: TLS 1.2 or
    newer, TLS 1.2 limited to :data:`TLS12_CIPHERS` (the server's order), no renegotiation."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _require_client_ca(context: ssl.SSLContext, path: str) -> None:
    """Verify client certificates against the CA certificates of ``path`` (see module
    docstring).

    Raises:
        TLSError: the file cannot be read, holds no PEM certificate, holds a certificate that
            is not a CA, or OpenSSL refuses it.
    """
    try:
        data = read_file(path)
        certificates = parse_certificates(data, path)
        for certificate in certificates:
            check_is_ca(certificate, path)
    except CertificateError as exc:
        raise TLSError(f"--client-ca {exc}") from None
    try:
        context.load_verify_locations(cadata=data.decode("ascii", "replace"))
    except ssl.SSLError as exc:
        raise TLSError(f"--client-ca {path}: OpenSSL refused the CA certificates: {exc}"
                       ) from None
    context.verify_mode = ssl.CERT_OPTIONAL


def describe(tls: ReloadingTLS) -> str:
    """One line for logs: ``<cert_file>: serial <hex>, SHA-256 <fingerprint>, notAfter <time>``."""
    return (f"{tls.cert_file}: serial {tls.serial_number:x}, SHA-256 {tls.fingerprint}, "
            f"notAfter {tls.not_after:%Y-%m-%dT%H:%M:%SZ}")


__all__ = ["NOT_YET_VALID_TOLERANCE", "TLS12_CIPHERS", "ReloadingTLS", "TLSError", "describe",
           "server_context"]
