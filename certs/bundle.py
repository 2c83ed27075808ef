"""The ``caBundle`` of webhook configurations: base64 of the PEM CA certificate(s).

Owns turning a CA file into the value kube-apiserver expects in
``webhooks[*].clientConfig.caBundle`` (base64 of PEM bytes, not of DER), refusing material that
cannot be a trust anchor. Must not read or edit webhook configuration files (``certs.inject`` does).
"""

from __future__ import annotations

import base64

from certs.material import (
    check_is_ca,
    check_validity,
    parse_certificates,
    to_pem,
    utc_now,
)


def ca_bundle(ca_pem: bytes, source: str) -> str:
    """The caBundle value for the CA certificate(s) in ``ca_pem``.

    Several certificates are allowed (old and new CA during a CA rotation); text around the PEM
    blocks is dropped.

    Args:
        ca_pem: content of the CA file (``ca.crt``).
        source: its file name, for messages.

    Returns:
        One line of base64 (no newline) encoding the PEM certificate blocks.

    Raises:
        CertificateError: not PEM, a certificate that is not a CA, or expired / not yet valid
            (message ``"<source>: …"``).
    """
    certs = parse_certificates(ca_pem, source)
    now = utc_now()
    for cert in certs:
        check_is_ca(cert, source)
        check_validity(cert, source, now)
    return base64.b64encode(to_pem(certs)).decode("ascii")
