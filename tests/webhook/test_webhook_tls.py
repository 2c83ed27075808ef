"""TLS of the webhook against real clients: TLS 1.2 only with forward-secret AEAD suites (ECDHE
with AES-GCM or ChaCha20-Poly1305), TLS 1.3 as OpenSSL offers it, the TLS handshake timeout,
a 3 MiB review over TLS read in 64 KiB pieces, and client-certificate authentication of the API
server (``--client-ca``): ``/validate`` and ``/mutate`` need a certificate from that CA, the
health and metrics endpoints do not, a certificate from another CA or one not fit for client
authentication is refused at the handshake.
"""

import asyncio
import datetime
import json
import socket
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.generate import generate_ca
from certs.tls import ReloadingTLS, TLSError
from tests.fakes.webhook_harness import bug_review, gpu_policy, write_policies
from tests.webhook.test_webhook_server import WAIT_S, running, tls_files
from webhook.settings import MiB

POLICY = gpu_policy("max-gpus", {"validations": [{"expression": "gpu.count <= 8"}]})


def client_cert(ca, name, *, usage=ExtendedKeyUsageOID.CLIENT_AUTH):
    """A client certificate (and key) signed by ``ca``, as kube-apiserver's would be."""
    ca_cert = x509.load_pem_x509_certificate(ca[0])
    ca_key = serialization.load_pem_private_key(ca[1], None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def client_context(ca, *, cert=None, tmp_path=None, version=None, ciphers=None):
    context = ssl.create_default_context(cadata=ca[0].decode())
    if version is not None:
        context.minimum_version = context.maximum_version = version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    if cert is not None:
        (tmp_path / "client.crt").write_bytes(cert[0])
        (tmp_path / "client.key").write_bytes(cert[1])
        context.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    return context


def https(port, context, request):
    """Send one HTTP/1.1 request over a new TLS connection; returns (status, body bytes, the
    negotiated cipher and version). Raises what the handshake or the read raises."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(request)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
        cipher = tls.cipher()
    if not data:
        raise ConnectionError("the server closed the connection without an answer")
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body, cipher


def get(path):
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()


def post(path, body):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data


def review(uid="tls", pad=0):
    body = bug_review("kyverno-kyverno-532.yaml")
    body["request"]["uid"] = uid
    if pad:
        body["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * pad}
    return body


@pytest.fixture
def ca():
    return generate_ca("test webhook CA", 1)


@pytest.mark.asyncio
@pytest.mark.parametrize(("version", "ciphers", "accepted"), [
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256", True),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES256-GCM-SHA384", True),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-CHACHA20-POLY1305", True),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-SHA256", False),  # CBC
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES256-SHA", False),  # CBC, SHA-1
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-CCM", False),  # AEAD, but not GCM / ChaCha
    (ssl.TLSVersion.TLSv1_3, None, True),
])
async def test_tls12_takes_only_ecdhe_aead_suites(tmp_path, ca, version, ciphers, accepted):
    """The serving certificate has a P-256 key (certs/generate.py), so the server's suites are
    the ECDSA ones; the server context itself is also checked for RSA and DHE suites."""
    tls_files(tmp_path, ca, "tls")
    tls = ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    path = write_policies(tmp_path, POLICY)
    async with running([path], tls=tls) as server:
        context = client_context(ca, version=version, ciphers=ciphers)
        if not accepted:
            with pytest.raises(ssl.SSLError):
                await asyncio.to_thread(https, server.port, context, get("/healthz"))
            return
        status, body, (name, protocol, _) = await asyncio.to_thread(
            https, server.port, context, get("/healthz"))
        assert status == 200 and json.loads(body) == {"status": "ok"}
        assert protocol == ("TLSv1.3" if version is ssl.TLSVersion.TLSv1_3 else "TLSv1.2")
        if ciphers is not None:
            assert name == ciphers


@pytest.mark.asyncio
async def test_a_tls_handshake_that_does_not_complete_is_cut_at_the_header_timeout(tmp_path,
                                                                                   ca):
    tls_files(tmp_path, ca, "tls")
    tls = ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    async with running([write_policies(tmp_path, POLICY)], tls=tls,
                       header_timeout_s=0.2) as server:
        def silent():
            with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
                return sock.recv(1)  # no ClientHello sent: the server closes
        assert await asyncio.to_thread(silent) == b""


@pytest.mark.asyncio
async def test_a_3_mib_review_over_tls_is_answered(tmp_path, ca):
    tls_files(tmp_path, ca, "tls")
    tls = ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    async with running([write_policies(tmp_path, POLICY)], tls=tls) as server:
        big = review("big", pad=int(2.9 * MiB))
        status, body, _ = await asyncio.to_thread(https, server.port, client_context(ca),
                                                  post("/validate", big))
        assert status == 200 and json.loads(body)["response"]["uid"] == "big"
        assert json.loads(body)["response"]["allowed"] is True


@pytest.mark.asyncio
async def test_client_ca_requires_a_certificate_from_that_ca_on_admission_only(tmp_path, ca):
    tls_files(tmp_path, ca, "tls")
    client_ca = generate_ca("kube-apiserver client CA", 1)
    (tmp_path / "client-ca.crt").write_bytes(client_ca[0])
    tls = ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key",
                       client_ca=tmp_path / "client-ca.crt")
    assert tls.client_ca == str(tmp_path / "client-ca.crt")
    apiserver = client_cert(client_ca, "kube-apiserver")
    async with running([write_policies(tmp_path, POLICY)], tls=tls,
                       client_auth=True) as server:
        anonymous = client_context(ca)
        for path in ("/healthz", "/readyz", "/metrics"):  # probes and scrapers: no certificate
            status, _, _ = await asyncio.to_thread(https, server.port, anonymous, get(path))
            assert status == 200, path
        for endpoint in ("/validate", "/mutate"):
            status, body, _ = await asyncio.to_thread(https, server.port, anonymous,
                                                      post(endpoint, review()))
            assert status == 401
            assert json.loads(body)["kind"] == "Status"
            assert json.loads(body)["reason"] == "Unauthorized"
        good = client_context(ca, cert=apiserver, tmp_path=tmp_path)
        status, body, _ = await asyncio.to_thread(https, server.port, good,
                                                  post("/validate", review()))
        assert status == 200 and json.loads(body)["response"]["uid"] == "tls"
        # Another CA's certificate, and one of the right CA not fit for client authentication:
        # refused in the handshake (TLS 1.3 reports it on the first read).
        for cert in (client_cert(generate_ca("someone else", 1), "intruder"),
                     client_cert(client_ca, "not-a-client", usage=ExtendedKeyUsageOID.SERVER_AUTH)):
            refused = client_context(ca, cert=cert, tmp_path=tmp_path)
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await asyncio.to_thread(https, server.port, refused,
                                        post("/validate", review()))


def test_the_tls12_suites_are_ecdhe_with_aes_gcm_or_chacha20_only():
    from certs.tls import server_context

    suites = {c["name"]: c for c in server_context().get_ciphers()}
    tls12 = {name for name, c in suites.items() if c["protocol"] == "TLSv1.2"}
    assert tls12 == {"ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
                     "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
                     "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305"}
    assert all(c["aead"] for c in suites.values())  # TLS 1.3's too


def test_a_client_ca_that_is_not_a_ca_is_refused(tmp_path, ca):
    tls_files(tmp_path, ca, "tls")
    with pytest.raises(TLSError, match=r"--client-ca .*tls.crt: not a CA certificate"):
        ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key", client_ca=tmp_path / "tls.crt")
    with pytest.raises(TLSError, match=r"--client-ca .*missing.crt: file not found"):
        ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key",
                     client_ca=tmp_path / "missing.crt")
    (tmp_path / "empty.crt").write_text("no certificate here\n")
    with pytest.raises(TLSError, match=r"--client-ca .*empty.crt"):
        ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key", client_ca=tmp_path / "empty.crt")
