"""Where TLS material lives on disk and how it is written.

Owns the file names (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``: the keys of cert-manager
Secrets and of Kubernetes ``kubernetes.io/tls`` Secrets) and the atomic write: a temporary file in
the target's directory, created with the final mode, fsynced, then renamed over the target, and the
directory fsynced — so a reader (the running webhook) sees either the old file or the new one,
never a partial one, and a private key is never readable by others, not even briefly. Must not
parse or create certificates.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

KEY_MODE = 0o600
"""Mode of private key files: owner read/write only."""
CERT_MODE = 0o644
"""Mode of certificate files: world-readable (they are public)."""


def write_atomic(path: str | Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` atomically, the new file having exactly ``mode``.

    Args:
        path: the target file; its directory must exist.
        data: the full new content.
        mode: permission bits (e.g. :data:`KEY_MODE`), applied regardless of the umask.

    Raises:
        OSError: the directory is not writable, the disk is full, … (the target is untouched and
            the temporary file removed).
    """
    target = Path(path)
    directory = target.parent
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        else:  # Windows
            os.chmod(temporary, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Persist the rename (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
