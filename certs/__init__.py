"""TLS material of the admission webhook.

Owns, and does nothing else:

- ``certs.tls``: :class:`~certs.tls.ReloadingTLS`, the server :class:`ssl.SSLContext` (TLS ≥ 1.2,
  one object for the process) that reloads the certificate and key files in place when their
  content changes, and :class:`~certs.tls.TLSError`;
- ``certs.generate``: CA and serving-certificate generation with ``cryptography`` (ECDSA P-256,
  Service DNS names as SANs);
- ``certs.bundle``: the webhook ``caBundle`` (base64 of the PEM CA);
- ``certs.inject``: setting that caBundle in ValidatingWebhookConfiguration /
  MutatingWebhookConfiguration files by a targeted text edit that keeps comments and layout;
- ``certs.files``: the file names (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``) and atomic
  writes with private keys mode 0600;
- ``certs.material``: PEM parsing and the checks behind every refusal (expired, not a CA, key does
  not match, not a server certificate), raised as :class:`~certs.material.CertificateError` with
  the file name first.

Must not serve HTTP, evaluate policies, or import the ``kubernetes`` client (setting the
caBundle in the cluster is ``kube.webhooks``, called by ``gpuguard certs inject --live``).
"""
