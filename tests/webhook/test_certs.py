"""certs/ and ``gpuguard certs``: generation, TLS serving with reload, caBundle, inject, refusals.

Every TLS check is a real handshake with Python's ``ssl`` on 127.0.0.1 (client context trusting
only the generated CA, hostname verification on, X.509 strict mode), never a time measurement.
"""

import base64
import datetime
import json
import os
import shutil
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.bundle import ca_bundle
from certs.files import write_atomic
from certs.generate import (
    CLOCK_SKEW,
    MAX_NOT_AFTER,
    dns_san_problem,
    generate_ca,
    generate_serving_cert,
    max_days,
)
from certs.inject import InjectError, inject_ca_bundle
from certs.material import CertificateError
from certs.tls import ReloadingTLS, TLSError
from gpuguard.cli import main
from tests.paths import TESTS

WEBHOOK_DATA = TESTS / "data" / "webhooks"
SERVICE, NAMESPACE = "gpuguard", "gpuguard-system"
NAMES = ["gpuguard", "gpuguard.gpuguard-system", "gpuguard.gpuguard-system.svc",
         "gpuguard.gpuguard-system.svc.cluster.local"]
UTC = datetime.UTC
IO_TIMEOUT = 60  # seconds a blocked socket may wait before the test fails instead of hanging


# --- helpers -------------------------------------------------------------------------------------

class EchoServer:
    """A tiny TLS echo server on 127.0.0.1 wrapping each accepted socket with ``context``."""

    def __init__(self, context: ssl.SSLContext):
        self.context = context
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshake_errors: list[Exception] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self._stopping.is_set():
                conn.close()
                return
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _echo(self, conn: socket.socket):
        conn.settimeout(IO_TIMEOUT)
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                while data := tls.recv(1024):
                    tls.sendall(data)
        except (ssl.SSLError, OSError) as exc:
            self.handshake_errors.append(exc)

    def close(self):
        # Wake the blocking accept() with one last plain connection, then close.
        self._stopping.set()
        with socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT):
            pass
        self._accept.join(IO_TIMEOUT)
        self.sock.close()


@pytest.fixture
def serve():
    servers = []

    def start(context):
        server = EchoServer(context)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    return context


def connect(server: EchoServer, ca_pem: bytes, hostname: str = NAMES[2]) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=IO_TIMEOUT)
    try:
        return client_context(ca_pem).wrap_socket(raw, server_hostname=hostname)
    except BaseException:
        raw.close()
        raise


def peer_serial(conn: ssl.SSLSocket) -> int:
    return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True)).serial_number


def echo(conn: ssl.SSLSocket, payload: bytes = b"admission") -> bytes:
    conn.sendall(payload)
    return conn.recv(1024)


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def ext(certificate: x509.Certificate, kind):
    return certificate.extensions.get_extension_for_class(kind)


@pytest.fixture(scope="module")
def ca():
    return generate_ca("gpuguard test CA", 30)


@pytest.fixture(scope="module")
def leaf(ca):
    return generate_serving_cert(*ca, SERVICE, NAMESPACE, 10, ["127.0.0.1"])


def write_pair(directory: Path, cert_pem: bytes, key_pem: bytes) -> tuple[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert_pem)
    (directory / "tls.key").write_bytes(key_pem)
    return str(directory / "tls.crt"), str(directory / "tls.key")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["certs", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


# --- generation ----------------------------------------------------------------------------------

def test_ca_is_a_p256_ca_with_cert_sign_and_key_identifiers(ca):
    ca_cert = cert(ca[0])
    constraints = ext(ca_cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ext(ca_cert, x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    ski = ext(ca_cert, x509.SubjectKeyIdentifier).value
    assert ext(ca_cert, x509.AuthorityKeyIdentifier).value.key_identifier == ski.digest
    assert ca_cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "gpuguard test CA"
    assert isinstance(ca_cert.public_key(), ec.EllipticCurvePublicKey)
    assert ca_cert.public_key().curve.name == "secp256r1"
    ca_cert.verify_directly_issued_by(ca_cert)  # self-signed
    assert ca[1].startswith(b"-----BEGIN PRIVATE KEY-----")


def test_validity_starts_in_the_past_by_the_clock_skew_margin(ca):
    ca_cert = cert(ca[0])
    span = ca_cert.not_valid_after_utc - ca_cert.not_valid_before_utc
    assert span == datetime.timedelta(days=30) + CLOCK_SKEW
    fixed = cert(generate_ca("x", 2, not_before=datetime.datetime(2030, 1, 1, tzinfo=UTC))[0])
    assert fixed.not_valid_before_utc == datetime.datetime(2030, 1, 1, tzinfo=UTC)
    assert fixed.not_valid_after_utc == datetime.datetime(2030, 1, 3, tzinfo=UTC)


def test_serving_cert_has_the_service_sans_usages_and_chains_to_the_ca(ca, leaf):
    ca_cert, leaf_cert = cert(ca[0]), cert(leaf[0])
    sans = ext(leaf_cert, x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == NAMES
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    constraints = ext(leaf_cert, x509.BasicConstraints)
    assert constraints.critical and not constraints.value.ca
    usage = ext(leaf_cert, x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment and not usage.key_cert_sign
    assert list(ext(leaf_cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert ext(leaf_cert, x509.AuthorityKeyIdentifier).value.key_identifier == \
        ext(ca_cert, x509.SubjectKeyIdentifier).value.digest
    assert leaf_cert.issuer == ca_cert.subject
    assert leaf_cert.subject.rfc4514_string() == "CN=gpuguard.gpuguard-system.svc"
    leaf_cert.verify_directly_issued_by(ca_cert)
    assert leaf_cert.public_key().curve.name == "secp256r1"
    assert leaf_cert.serial_number != ca_cert.serial_number


def test_serving_cert_never_outlives_its_ca(ca):
    leaf_cert = cert(generate_serving_cert(*ca, SERVICE, NAMESPACE, 3650)[0])
    assert leaf_cert.not_valid_after_utc == cert(ca[0]).not_valid_after_utc


@pytest.mark.parametrize(("service", "namespace", "extra", "message"), [
    ("Gpuguard", NAMESPACE, (), "service 'Gpuguard': not a DNS label (lowercase letters, digits "
     "and '-', starting and ending with a letter or digit, at most 63 characters)"),
    (SERVICE, "ns.x", (), "namespace 'ns.x': not a DNS label (lowercase letters, digits and "
     "'-', starting and ending with a letter or digit, at most 63 characters)"),
    (SERVICE, NAMESPACE, ("bad name",), "subject alternative name 'bad name': 'bad name' is "
     "not a DNS label (letters, digits and '-', starting and ending with a letter or digit, at "
     "most 63 characters; '*' only as the whole leftmost label); expected a DNS name or an IP "
     "address"),
    (SERVICE, NAMESPACE, ("999.1.1.1",), "subject alternative name '999.1.1.1': looks like an "
     "IPv4 address but is not one (four numbers 0-255 separated by dots, e.g. 10.0.0.1); "
     "expected a DNS name or an IP address"),
])
def test_bad_names_are_refused(ca, service, namespace, extra, message):
    with pytest.raises(ValueError) as raised:
        generate_serving_cert(*ca, service, namespace, 1, extra)
    assert str(raised.value) == message


@pytest.mark.parametrize(("san", "problem"), [
    ("999.1.1.1", "looks like an IPv4 address but is not one (four numbers 0-255 separated by "
     "dots, e.g. 10.0.0.1)"),
    ("1.2.3", "all digits and dots: neither an IP address nor a host name (RFC 1123 §2.1: the "
     "last label of a host name is not all digits)"),
    ("host.123", "its last label '123' is all digits: not a host name (RFC 1123 §2.1) and not "
     "an IP address"),
    ("a..b", "an empty label is not a DNS label (letters, digits and '-', starting and ending "
     "with a letter or digit, at most 63 characters; '*' only as the whole leftmost label)"),
    ("-a.example", "'-a' is not a DNS label (letters, digits and '-', starting and ending with a "
     "letter or digit, at most 63 characters; '*' only as the whole leftmost label)"),
    ("web.*.example", "'*' is not a DNS label (letters, digits and '-', starting and ending with "
     "a letter or digit, at most 63 characters; '*' only as the whole leftmost label)"),
    ("*", "'*' is not a DNS label (letters, digits and '-', starting and ending with a letter or "
     "digit, at most 63 characters; '*' only as the whole leftmost label)"),
    ("a" * 64 + ".example", f"'{'a' * 64}' is not a DNS label (letters, digits and '-', starting "
     "and ending with a letter or digit, at most 63 characters; '*' only as the whole leftmost "
     "label)"),
    (".".join(["abcdefgh"] * 29), "260 characters: a DNS name has at most 253"),
])
def test_dns_sans_are_rfc_1123_host_names(san, problem):
    assert dns_san_problem(san) == problem


@pytest.mark.parametrize("san", ["localhost", "*.gpuguard.example", "Web-1.Example.COM",
                                 "3com.example", "a.b-c.d"])
def test_host_names_and_a_leftmost_wildcard_are_dns_sans(ca, san):
    assert dns_san_problem(san) is None
    leaf_cert = cert(generate_serving_cert(*ca, SERVICE, NAMESPACE, 1, [san])[0])
    assert ext(leaf_cert, x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == [*NAMES, san]


def test_a_lifetime_past_9999_is_refused_not_an_overflow(ca):
    start = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    limit = max_days(start)
    assert limit == (MAX_NOT_AFTER - start).days == 2910981
    last = cert(generate_ca("x", limit, not_before=start)[0])
    assert last.not_valid_after_utc.date() == datetime.date(9999, 12, 31)
    for days in (limit + 1, 99999999, 10**12):
        with pytest.raises(ValueError) as raised:
            generate_ca("x", days, not_before=start)
        assert str(raised.value) == (
            f"{days} days from 2030-01-01 would end after 9999-12-31, the latest notAfter a "
            "certificate can hold (RFC 5280 §4.1.2.5): at most 2910981 days")
        with pytest.raises(ValueError):
            generate_serving_cert(*ca, SERVICE, NAMESPACE, days, not_before=start)


@pytest.fixture()
def fixed_clock(monkeypatch):
    """The certs' clock (and the CLI's bound on --days) at 2030-01-01T00:00:00Z."""
    moment = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    monkeypatch.setattr("certs.generate.utc_now", lambda: moment)
    monkeypatch.setattr("gpuguard.certs_command.utc_now", lambda: moment)
    return moment


@pytest.mark.parametrize(("command", "flag", "value"), [
    ("generate", "--days", "99999999"), ("generate", "--ca-days", "3000000"),
    ("generate", "--days", "2910982"), ("renew", "--days", "99999999")])
def test_the_cli_refuses_days_past_9999_at_parsing(tmp_path, capsys, fixed_clock, command, flag,
                                                    value):
    if command == "renew":
        assert run_cli(capsys, "generate", "--service", SERVICE, "--namespace", NAMESPACE,
                       "--out", tmp_path)[0] == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    names = ["--service", SERVICE, "--namespace", NAMESPACE] if command == "generate" else []
    rc, _, err = run_cli(capsys, command, *names, "--out", tmp_path, flag, value)
    assert rc == 2
    assert err.splitlines()[-1] == (
        f"gpuguard certs {command}: error: argument {flag}: {value} days from 2030-01-01 would "
        "end after 9999-12-31, the latest notAfter a certificate can hold (RFC 5280 §4.1.2.5): "
        "at most 2910981 days")
    assert "Traceback" not in err and "internal error" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize("command", ["generate", "renew"])
def test_the_cli_refuses_an_invalid_ipv4_san_instead_of_a_dns_san(tmp_path, capsys, command):
    if command == "renew":
        assert run_cli(capsys, "generate", "--service", SERVICE, "--namespace", NAMESPACE,
                       "--out", tmp_path)[0] == 0
    tls = (tmp_path / "tls.crt").read_bytes() if command == "renew" else None
    names = ["--service", SERVICE, "--namespace", NAMESPACE] if command == "generate" else []
    rc, _, err = run_cli(capsys, command, *names, "--out", tmp_path, "--san", "999.1.1.1")
    assert rc == 2
    assert err.splitlines()[-1] == (
        f"gpuguard certs {command}: error: argument --san: subject alternative name "
        "'999.1.1.1': looks like an IPv4 address but is not one (four numbers 0-255 separated "
        "by dots, e.g. 10.0.0.1); expected a DNS name or an IP address")
    if tls is None:
        assert not (tmp_path / "tls.crt").exists()
    else:
        assert (tmp_path / "tls.crt").read_bytes() == tls


# --- refusing CA material ------------------------------------------------------------------------

def test_expired_ca_is_refused(ca):
    old = generate_ca("old CA", 1, not_before=datetime.datetime(2000, 1, 1, tzinfo=UTC))
    with pytest.raises(CertificateError) as raised:
        generate_serving_cert(*old, SERVICE, NAMESPACE, 1)
    assert str(raised.value) == \
        "CA certificate: certificate CN=old CA expired at 2000-01-02T00:00:00Z"


def test_mismatched_ca_key_is_refused(ca):
    other_key = generate_ca("other", 1)[1]
    with pytest.raises(CertificateError) as raised:
        generate_serving_cert(ca[0], other_key, SERVICE, NAMESPACE, 1,
                              ca_cert_source="ca.crt", ca_key_source="ca.key")
    assert str(raised.value) == "ca.key: private key does not match the certificate in ca.crt"


def test_non_ca_certificate_is_refused_as_ca(leaf):
    with pytest.raises(CertificateError) as raised:
        generate_serving_cert(*leaf, SERVICE, NAMESPACE, 1)
    assert str(raised.value) == \
        "CA certificate: not a CA certificate: basicConstraints is not CA:TRUE"


@pytest.mark.parametrize(("cert_pem", "key_pem", "message"), [
    (b"hello", None, "CA certificate: not a PEM certificate (no '-----BEGIN CERTIFICATE-----' "
     "block)"),
    (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", None,
     "CA certificate: invalid PEM certificate: "),
    (None, b"garbage", "CA key: not a PEM private key (no '-----BEGIN PRIVATE KEY-----' block)"),
])
def test_garbage_pem_is_refused(ca, cert_pem, key_pem, message):
    with pytest.raises(CertificateError) as raised:
        generate_serving_cert(cert_pem or ca[0], key_pem or ca[1], SERVICE, NAMESPACE, 1)
    if message.endswith(": "):
        assert str(raised.value).startswith(message)
    else:
        assert str(raised.value) == message


# --- TLS serving ---------------------------------------------------------------------------------

def test_handshake_verifies_the_chain_and_every_san(tmp_path, ca, leaf, serve):
    tls = ReloadingTLS(*write_pair(tmp_path, *leaf))
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.serial_number == cert(leaf[0]).serial_number
    assert tls.not_after == cert(leaf[0]).not_valid_after_utc
    assert tls.fingerprint == cert(leaf[0]).fingerprint(hashes.SHA256()).hex(":").upper()
    server = serve(tls.context)
    for hostname in [*NAMES, "127.0.0.1"]:
        with connect(server, ca[0], hostname) as conn:
            assert conn.version() in ("TLSv1.2", "TLSv1.3")
            assert peer_serial(conn) == tls.serial_number
            assert echo(conn) == b"admission"


def test_serving_works_without_memfd(tmp_path, ca, leaf, serve, monkeypatch):
    # Where os.memfd_create is missing (macOS) the chain is loaded through a private temp dir.
    monkeypatch.delattr(os, "memfd_create", raising=False)
    cert_file, key_file = write_pair(tmp_path, *leaf)
    tls = ReloadingTLS(cert_file, key_file)
    server = serve(tls.context)
    new = generate_serving_cert(*ca, SERVICE, NAMESPACE, 10, ["127.0.0.1"])
    write_pair(tmp_path, *new)
    assert tls.reload_if_changed() is True
    with connect(server, ca[0]) as conn:
        assert peer_serial(conn) == cert(new[0]).serial_number


def test_handshake_fails_for_a_name_not_in_the_sans(tmp_path, ca, leaf, serve):
    server = serve(ReloadingTLS(*write_pair(tmp_path, *leaf)).context)
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        connect(server, ca[0], "gpuguard.other-namespace.svc")


def test_handshake_fails_for_a_client_trusting_another_ca(tmp_path, leaf, serve):
    server = serve(ReloadingTLS(*write_pair(tmp_path, *leaf)).context)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        connect(server, generate_ca("someone else", 1)[0])


def test_reload_is_a_no_op_when_only_the_mtime_changes(tmp_path, leaf):
    cert_file, key_file = write_pair(tmp_path, *leaf)
    tls = ReloadingTLS(cert_file, key_file)
    os.utime(cert_file, (1_000_000_000, 1_000_000_000))
    os.utime(key_file, (1_000_000_000, 1_000_000_000))
    assert tls.reload_if_changed() is False
    assert tls.serial_number == cert(leaf[0]).serial_number


def test_reload_follows_a_kubernetes_data_symlink_swap_with_identical_mtimes(tmp_path, ca, leaf):
    # The layout kubelet writes for Secret volumes: tls.crt -> ..data/tls.crt, ..data -> ..<ts>.
    write_pair(tmp_path / "..2025_01_01", *leaf)
    (tmp_path / "..data").symlink_to("..2025_01_01")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    tls = ReloadingTLS(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    context = tls.context
    new = generate_serving_cert(*ca, SERVICE, NAMESPACE, 10)
    write_pair(tmp_path / "..2025_02_01", *new)
    for name in ("tls.crt", "tls.key"):  # same mtimes as the old files: content must decide
        old_stat = (tmp_path / "..2025_01_01" / name).stat()
        os.utime(tmp_path / "..2025_02_01" / name, ns=(old_stat.st_atime_ns, old_stat.st_mtime_ns))
    (tmp_path / "..data_tmp").symlink_to("..2025_02_01")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert tls.reload_if_changed() is True
    assert tls.serial_number == cert(new[0]).serial_number
    assert tls.context is context
    assert tls.reload_if_changed() is False


def test_renew_keeps_the_ca_and_the_running_context_serves_the_new_leaf(tmp_path, capsys, serve):
    out = tmp_path / "certs"
    assert run_cli(capsys, "generate", "--service", SERVICE, "--namespace", NAMESPACE,
                   "--out", out, "--san", "127.0.0.1")[0] == 0
    ca_pem = (out / "ca.crt").read_bytes()
    bundle_before = run_cli(capsys, "ca-bundle", "--ca", out / "ca.crt")[1]
    tls = ReloadingTLS(str(out / "tls.crt"), str(out / "tls.key"))
    context, old_serial = tls.context, tls.serial_number
    server = serve(tls.context)
    with connect(server, ca_pem) as open_conn:
        assert peer_serial(open_conn) == old_serial
        assert echo(open_conn, b"before") == b"before"

        rc, stdout, _ = run_cli(capsys, "renew", "--out", out)
        assert rc == 0
        assert f"{out / 'ca.crt'} unchanged, so the caBundle is unchanged" in stdout
        assert (out / "ca.crt").read_bytes() == ca_pem
        assert run_cli(capsys, "ca-bundle", "--ca", out / "ca.crt")[1] == bundle_before
        new_leaf = cert((out / "tls.crt").read_bytes())
        assert new_leaf.serial_number != old_serial
        assert ext(new_leaf, x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName) == NAMES  # names reused from the old certificate
        assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600

        assert tls.reload_if_changed() is True
        assert tls.context is context
        assert tls.serial_number == new_leaf.serial_number
        with connect(server, ca_pem) as new_conn:  # new handshakes see the new certificate
            assert peer_serial(new_conn) == new_leaf.serial_number
            assert echo(new_conn, b"new") == b"new"
        # The connection opened before the reload keeps working, with its certificate.
        assert echo(open_conn, b"after") == b"after"
        assert peer_serial(open_conn) == old_serial
    assert tls.reload_if_changed() is False


def test_bad_new_material_is_refused_and_the_old_certificate_kept(tmp_path, ca, leaf, serve):
    cert_file, key_file = write_pair(tmp_path, *leaf)
    tls = ReloadingTLS(cert_file, key_file)
    server = serve(tls.context)
    new = generate_serving_cert(*ca, SERVICE, NAMESPACE, 10, ["127.0.0.1"])

    Path(cert_file).write_bytes(b"not a certificate\n")
    with pytest.raises(TLSError) as raised:
        tls.reload_if_changed()
    assert str(raised.value) == \
        f"{cert_file}: not a PEM certificate (no '-----BEGIN CERTIFICATE-----' block)"
    with pytest.raises(TLSError):  # refused again while the files stay bad
        tls.reload_if_changed()

    Path(cert_file).write_bytes(new[0])  # a half-finished update: new cert, old key
    with pytest.raises(TLSError) as raised:
        tls.reload_if_changed()
    assert str(raised.value) == \
        f"{key_file}: private key does not match the certificate in {cert_file}"
    with connect(server, ca[0]) as conn:
        assert peer_serial(conn) == cert(leaf[0]).serial_number

    Path(key_file).write_bytes(new[1])
    assert tls.reload_if_changed() is True
    with connect(server, ca[0]) as conn:
        assert peer_serial(conn) == cert(new[0]).serial_number


def test_a_removed_file_is_reported_and_the_old_certificate_kept(tmp_path, leaf):
    cert_file, key_file = write_pair(tmp_path, *leaf)
    tls = ReloadingTLS(cert_file, key_file)
    os.unlink(key_file)
    with pytest.raises(TLSError) as raised:
        tls.reload_if_changed()
    assert str(raised.value) == f"{key_file}: file not found"
    assert tls.serial_number == cert(leaf[0]).serial_number


def _refusals(tmp_path: Path, ca, leaf):
    """(name, cert bytes or None for missing, key bytes, expected message with {cert}/{key})."""
    expired = generate_serving_cert(
        *ca, SERVICE, NAMESPACE, 1, not_before=datetime.datetime(2001, 1, 1, tzinfo=UTC))
    long_ca = generate_ca("long CA", 36500)
    future = generate_serving_cert(
        *long_ca, SERVICE, NAMESPACE, 1, not_before=datetime.datetime(2099, 1, 1, tzinfo=UTC))
    other = generate_serving_cert(*ca, SERVICE, NAMESPACE, 1)
    return [
        ("missing", None, leaf[1], "{cert}: file not found"),
        ("not PEM", b"\x00\x01binary", leaf[1],
         "{cert}: not a PEM certificate (no '-----BEGIN CERTIFICATE-----' block)"),
        ("key not PEM", leaf[0], leaf[0],
         "{key}: not a PEM private key (no '-----BEGIN PRIVATE KEY-----' block)"),
        ("mismatch", leaf[0], other[1],
         "{key}: private key does not match the certificate in {cert}"),
        ("expired", *expired,
         "{cert}: certificate CN=gpuguard.gpuguard-system.svc expired at 2001-01-02T00:00:00Z"),
        ("not yet valid", *future, "{cert}: certificate CN=gpuguard.gpuguard-system.svc is not "
         "valid before 2099-01-01T00:00:00Z"),
        ("CA served", *ca, "{cert}: not a server certificate: it is a CA certificate (CA:TRUE)"),
    ]


def test_initial_material_is_refused_with_a_message_naming_the_file(tmp_path, ca, leaf):
    for name, cert_pem, key_pem, message in _refusals(tmp_path, ca, leaf):
        directory = tmp_path / name.replace(" ", "-")
        cert_file, key_file = write_pair(directory, cert_pem or b"", key_pem)
        if cert_pem is None:
            os.unlink(cert_file)
        with pytest.raises(TLSError) as raised:
            ReloadingTLS(cert_file, key_file)
        assert str(raised.value) == message.format(cert=cert_file, key=key_file), name
        assert isinstance(raised.value, CertificateError)


def test_a_certificate_without_server_auth_is_refused(tmp_path, ca):
    # A client certificate (extendedKeyUsage clientAuth) signed by the same CA.
    ca_cert = cert(ca[0])
    ca_key = serialization.load_pem_private_key(ca[1], None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(UTC)
    client = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client")]))
              .issuer_name(ca_cert.subject).public_key(key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(hours=1))
              .not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
              .add_extension(x509.SubjectAlternativeName([x509.DNSName("client")]), False)
              .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_file, key_file = write_pair(tmp_path, client.public_bytes(serialization.Encoding.PEM),
                                     key_pem)
    with pytest.raises(TLSError) as raised:
        ReloadingTLS(cert_file, key_file)
    assert str(raised.value) == \
        f"{cert_file}: not a server certificate: extendedKeyUsage lacks serverAuth"


# --- files ---------------------------------------------------------------------------------------

def test_generate_writes_the_four_files_with_private_keys_0600(tmp_path, capsys):
    out = tmp_path / "certs"
    previous = os.umask(0)  # the modes must not depend on the umask
    try:
        rc, stdout, _ = run_cli(capsys, "generate", "--service", SERVICE, "--namespace",
                                NAMESPACE, "--out", out, "--days", "30")
    finally:
        os.umask(previous)
    assert rc == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}
    assert f"wrote {out / 'tls.key'} (mode 0600)" in stdout
    leaf_cert, ca_cert = cert((out / "tls.crt").read_bytes()), cert((out / "ca.crt").read_bytes())
    leaf_cert.verify_directly_issued_by(ca_cert)
    assert ext(leaf_cert, x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == NAMES
    assert leaf_cert.not_valid_after_utc - leaf_cert.not_valid_before_utc == \
        datetime.timedelta(days=30) + CLOCK_SKEW


def test_generate_refuses_to_replace_an_existing_ca_without_force(tmp_path, capsys):
    args = ["generate", "--service", SERVICE, "--namespace", NAMESPACE, "--out", tmp_path]
    assert run_cli(capsys, *args)[0] == 0
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    rc, _, err = run_cli(capsys, *args)
    assert rc == 2
    assert err == (f"gpuguard certs generate: error: {tmp_path / 'ca.key'}: already exists; "
                   f"'gpuguard certs renew --out {tmp_path}' issues a new serving certificate "
                   "from this CA, --force replaces the CA (the caBundle changes)\n")
    assert (tmp_path / "ca.crt").read_bytes() == ca_pem
    assert run_cli(capsys, *args, "--force")[0] == 0
    assert (tmp_path / "ca.crt").read_bytes() != ca_pem


def test_write_atomic_replaces_without_leftovers(tmp_path):
    target = tmp_path / "tls.key"
    target.write_bytes(b"old")
    target.chmod(0o644)
    write_atomic(target, b"new", 0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["tls.key"]


# --- renew refusals ------------------------------------------------------------------------------

def _generated(tmp_path: Path, capsys) -> Path:
    out = tmp_path / "certs"
    assert run_cli(capsys, "generate", "--service", SERVICE, "--namespace", NAMESPACE,
                   "--out", out)[0] == 0
    return out


def test_renew_refuses_an_expired_ca(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    old_cert, old_key = generate_ca("old CA", 1,
                                    not_before=datetime.datetime(2000, 1, 1, tzinfo=UTC))
    (out / "ca.crt").write_bytes(old_cert)
    (out / "ca.key").write_bytes(old_key)
    tls_before = (out / "tls.crt").read_bytes()
    rc, _, err = run_cli(capsys, "renew", "--out", out)
    assert rc == 2
    assert err == (f"gpuguard certs renew: error: {out / 'ca.crt'}: certificate CN=old CA "
                   "expired at 2000-01-02T00:00:00Z\n")
    assert (out / "tls.crt").read_bytes() == tls_before


def test_renew_refuses_a_ca_key_that_does_not_match(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    (out / "ca.key").write_bytes(generate_ca("other", 1)[1])
    rc, _, err = run_cli(capsys, "renew", "--out", out)
    assert rc == 2
    assert err == (f"gpuguard certs renew: error: {out / 'ca.key'}: private key does not match "
                   f"the certificate in {out / 'ca.crt'}\n")


def test_renew_refuses_a_serving_certificate_used_as_ca(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    shutil.copy(out / "tls.crt", out / "ca.crt")
    shutil.copy(out / "tls.key", out / "ca.key")
    rc, _, err = run_cli(capsys, "renew", "--out", out)
    assert rc == 2
    assert err == (f"gpuguard certs renew: error: {out / 'ca.crt'}: not a CA certificate: "
                   "basicConstraints is not CA:TRUE\n")


def test_renew_refuses_garbage_and_missing_files(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    (out / "ca.crt").write_text("-- not PEM --\n")
    rc, _, err = run_cli(capsys, "renew", "--out", out)
    assert rc == 2
    assert err == (f"gpuguard certs renew: error: {out / 'ca.crt'}: not a PEM certificate (no "
                   "'-----BEGIN CERTIFICATE-----' block)\n")
    rc, _, err = run_cli(capsys, "renew", "--out", tmp_path / "nowhere")
    assert rc == 2
    assert err == f"gpuguard certs renew: error: {tmp_path / 'nowhere' / 'ca.crt'}: file not found\n"


def test_renew_with_new_names(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    rc, _, _ = run_cli(capsys, "renew", "--out", out, "--service", "gg", "--namespace", "ops",
                       "--san", "localhost")
    assert rc == 0
    sans = ext(cert((out / "tls.crt").read_bytes()), x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "gg", "gg.ops", "gg.ops.svc", "gg.ops.svc.cluster.local", "localhost"]
    rc, _, err = run_cli(capsys, "renew", "--out", out, "--service", "gg")
    assert (rc, err) == (2, "gpuguard certs renew: error: --service and --namespace go together\n")


# --- caBundle ------------------------------------------------------------------------------------

def test_ca_bundle_prints_base64_of_the_ca_pem(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    rc, stdout, _ = run_cli(capsys, "ca-bundle", "--ca", out / "ca.crt")
    assert rc == 0
    assert stdout.endswith("\n") and stdout.count("\n") == 1
    assert base64.b64decode(stdout.strip(), validate=True) == (out / "ca.crt").read_bytes()


def test_ca_bundle_refuses_non_ca_expired_and_garbage(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    rc, _, err = run_cli(capsys, "ca-bundle", "--ca", out / "tls.crt")
    assert (rc, err) == (2, f"gpuguard certs ca-bundle: error: {out / 'tls.crt'}: not a CA "
                            "certificate: basicConstraints is not CA:TRUE\n")
    old = tmp_path / "old-ca.crt"
    old.write_bytes(generate_ca("old CA", 1,
                                not_before=datetime.datetime(2000, 1, 1, tzinfo=UTC))[0])
    rc, _, err = run_cli(capsys, "ca-bundle", "--ca", old)
    assert (rc, err) == (2, f"gpuguard certs ca-bundle: error: {old}: certificate CN=old CA "
                            "expired at 2000-01-02T00:00:00Z\n")
    rc, _, err = run_cli(capsys, "ca-bundle", "--ca", out / "ca.key")
    assert (rc, err) == (2, f"gpuguard certs ca-bundle: error: {out / 'ca.key'}: not a PEM "
                            "certificate (no '-----BEGIN CERTIFICATE-----' block)\n")


# --- inject --------------------------------------------------------------------------------------

def _without_bundles(value):
    """A parsed document with every caBundle removed (to compare the rest)."""
    if isinstance(value, dict):
        return {k: _without_bundles(v) for k, v in value.items() if k != "caBundle"}
    if isinstance(value, list):
        return [_without_bundles(v) for v in value]
    return value


def _bundles(value):
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "caBundle"] + \
            [b for v in value.values() for b in _bundles(v)]
    if isinstance(value, list):
        return [b for v in value for b in _bundles(v)]
    return []


def test_inject_sets_every_cabundle_and_keeps_the_rest_of_the_files(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    files = []
    for source in sorted(WEBHOOK_DATA.iterdir()):
        shutil.copy(source, tmp_path / source.name)
        files.append(tmp_path / source.name)
    (tmp_path / "gpuguard-webhooks.yaml").chmod(0o640)
    rc, stdout, err = run_cli(capsys, "inject", "--ca", out / "ca.crt", *files)
    assert (rc, err) == (0, "")
    assert stdout == (f"{files[0]}: caBundle set on 3 of 3 webhook(s)\n"
                      f"{files[1]}: caBundle set on 1 of 1 webhook(s)\n"
                      f"{files[2]}: caBundle set on 1 of 1 webhook(s)\n")
    expected = base64.b64encode((out / "ca.crt").read_bytes()).decode()
    for path in files:
        before = (WEBHOOK_DATA / path.name).read_text()
        after = path.read_text()
        old_docs = list(yaml.safe_load_all(before))
        new_docs = list(yaml.safe_load_all(after))
        assert [_without_bundles(d) for d in new_docs] == [_without_bundles(d) for d in old_docs]
        assert _bundles(new_docs) and set(_bundles(new_docs)) == {expected}
        # Only caBundle lines differ (comments, quoting and layout are kept).
        def kept(text):
            return [ln for ln in text.splitlines() if "caBundle" not in ln]
        if path.suffix == ".yaml":
            assert kept(after) == kept(before)
            assert [ln for ln in before.splitlines() if ln.lstrip().startswith("#")] == \
                [ln for ln in after.splitlines() if ln.lstrip().startswith("#")]
    text = files[0].read_text()
    assert f"caBundle: {expected}   # placeholder, replaced by the real CA" in text
    assert f'caBundle: "{expected}"\n' in text  # quoting style kept
    assert f"    # no caBundle yet: inject adds it\n    caBundle: {expected}\n    service:" in text
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o640
    assert base64.b64decode(expected) == (out / "ca.crt").read_bytes()

    # Idempotent: a second run changes nothing.
    snapshot = [p.read_bytes() for p in files]
    rc, stdout, _ = run_cli(capsys, "inject", "--ca", out / "ca.crt", *files)
    assert rc == 0
    assert stdout.splitlines()[0] == f"{files[0]}: up to date (3 webhook(s))"
    assert [p.read_bytes() for p in files] == snapshot


def test_renewal_leaves_injected_files_up_to_date(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    target = tmp_path / "webhooks.yaml"
    shutil.copy(WEBHOOK_DATA / "k8sdocs-pod-policy.yaml", target)
    assert run_cli(capsys, "inject", "--ca", out / "ca.crt", target)[0] == 0
    assert run_cli(capsys, "renew", "--out", out)[0] == 0
    rc, stdout, _ = run_cli(capsys, "inject", "--ca", out / "ca.crt", target)
    assert (rc, stdout) == (0, f"{target}: up to date (1 webhook(s))\n")


def test_inject_writes_nothing_when_one_file_is_bad(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    good = tmp_path / "good.yaml"
    shutil.copy(WEBHOOK_DATA / "k8sdocs-pod-policy.yaml", good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: admissionregistration.k8s.io/v1\n"
                   "kind: MutatingWebhookConfiguration\n"
                   "metadata: {name: broken}\n"
                   "webhooks:\n"
                   "- name: no-client-config.example.com\n"
                   "  sideEffects: None\n")
    service = tmp_path / "service.yaml"
    service.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: gpuguard}\n")
    missing = tmp_path / "missing.yaml"
    rc, stdout, err = run_cli(capsys, "inject", "--ca", out / "ca.crt", good, bad, service,
                              missing)
    assert (rc, stdout) == (2, "")
    assert err == (
        f"gpuguard certs inject: error: {bad}:5: document 0: MutatingWebhookConfiguration/broken:"
        " webhooks[0] (no-client-config.example.com): clientConfig is missing\n"
        f"gpuguard certs inject: error: {service}: no ValidatingWebhookConfiguration or "
        "MutatingWebhookConfiguration found\n"
        f"gpuguard certs inject: error: {missing}: file not found\n"
        "gpuguard certs inject: no file written\n"
    )
    assert good.read_bytes() == (WEBHOOK_DATA / "k8sdocs-pod-policy.yaml").read_bytes()


def test_inject_refuses_a_non_ca_bundle(tmp_path, capsys):
    out = _generated(tmp_path, capsys)
    target = tmp_path / "webhooks.yaml"
    shutil.copy(WEBHOOK_DATA / "k8sdocs-pod-policy.yaml", target)
    rc, _, err = run_cli(capsys, "inject", "--ca", out / "tls.crt", target)
    assert (rc, err) == (2, f"gpuguard certs inject: error: {out / 'tls.crt'}: not a CA "
                            "certificate: basicConstraints is not CA:TRUE\n")
    assert target.read_bytes() == (WEBHOOK_DATA / "k8sdocs-pod-policy.yaml").read_bytes()
    rc, _, err = run_cli(capsys, "inject", "--ca", out / "ca.crt")
    assert (rc, err) == (2, "gpuguard certs inject: error: give the webhook configuration files "
                            "to edit, or --live KIND/NAME\n")


# --- inject --live (kube/webhooks.py, with a stand-in for the API server) ------------------------

class FakeAdmissionApi:
    """The two AdmissionregistrationV1Api methods per kind that kube.webhooks calls."""

    def __init__(self, objects):
        from kubernetes import client

        self.api_client = client.ApiClient()
        self.objects = objects  # name -> model
        self.patches = []

    def read_validating_webhook_configuration(self, name):
        from kubernetes.client.exceptions import ApiException

        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects[name]

    def patch_validating_webhook_configuration(self, name, body, **options):
        self.patches.append((name, body, options))
        for op in body[1:]:
            index = int(op["path"].split("/")[2])
            self.objects[name].webhooks[index].client_config.ca_bundle = op["value"]


def _live_object(bundles):
    from kubernetes import client

    return client.V1ValidatingWebhookConfiguration(
        metadata=client.V1ObjectMeta(name="gpuguard-validating", resource_version="4711"),
        webhooks=[client.V1ValidatingWebhook(
            name=f"w{i}.gpuguard.io", side_effects="None", admission_review_versions=["v1"],
            client_config=client.AdmissionregistrationV1WebhookClientConfig(
                service=client.AdmissionregistrationV1ServiceReference(
                    name="gpuguard", namespace=NAMESPACE), ca_bundle=bundle))
            for i, bundle in enumerate(bundles)])


def test_live_injection_sends_one_json_patch_guarded_by_resource_version():
    from kube.webhooks import WebhookConfigError, set_ca_bundle

    api = FakeAdmissionApi({"gpuguard-validating": _live_object([None, "QUJD", "Cg=="])})
    result = set_ca_bundle(api, "ValidatingWebhookConfiguration", "gpuguard-validating", "QUJD")
    assert result.webhooks == ("w0.gpuguard.io", "w1.gpuguard.io", "w2.gpuguard.io")
    assert result.changed == ("w0.gpuguard.io", "w2.gpuguard.io")
    assert api.patches == [("gpuguard-validating", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "4711"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "QUJD"},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "QUJD"},
    ], {})]
    again = set_ca_bundle(api, "ValidatingWebhookConfiguration", "gpuguard-validating", "QUJD")
    assert again.changed == () and len(api.patches) == 1  # nothing sent when up to date
    with pytest.raises(WebhookConfigError) as raised:
        set_ca_bundle(api, "ValidatingWebhookConfiguration", "absent", "QUJD")
    assert str(raised.value) == "ValidatingWebhookConfiguration/absent: not found in the cluster"


@pytest.mark.parametrize(("text", "expected"), [
    ("validatingwebhookconfiguration/gpuguard", ("ValidatingWebhookConfiguration", "gpuguard")),
    ("MutatingWebhookConfigurations/m", ("MutatingWebhookConfiguration", "m")),
    ("mutatingwebhookconfigurations.admissionregistration.k8s.io/m",
     ("MutatingWebhookConfiguration", "m")),
])
def test_live_targets(text, expected):
    from kube.webhooks import parse_target

    assert parse_target(text) == expected


def test_live_injection_from_the_command_line(tmp_path, capsys, monkeypatch):
    from kube.config import ClusterConfig

    out = _generated(tmp_path, capsys)
    bundle = base64.b64encode((out / "ca.crt").read_bytes()).decode()
    api = FakeAdmissionApi({"gpuguard-validating": _live_object(["Cg=="])})
    # certs inject imports the kubernetes client only for --live, from these modules.
    monkeypatch.setattr("kube.config.detect",
                        lambda kubeconfig: ClusterConfig(None, "kubeconfig k"))
    monkeypatch.setattr("kube.webhooks.admission_api", lambda api_client: api)
    rc, stdout, err = run_cli(capsys, "inject", "--ca", out / "ca.crt", "--live",
                              "validatingwebhookconfiguration/gpuguard-validating", "--live",
                              "validatingwebhookconfiguration/absent")
    assert rc == 2
    assert stdout == ("ValidatingWebhookConfiguration/gpuguard-validating (kubeconfig k): "
                      "caBundle set on 1 of 1 webhook(s)\n")
    assert err == ("gpuguard certs inject: error: ValidatingWebhookConfiguration/absent: not "
                   "found in the cluster\n")
    assert api.objects["gpuguard-validating"].webhooks[0].client_config.ca_bundle == bundle
    rc, _, err = run_cli(capsys, "inject", "--ca", out / "ca.crt", "--live", "pods/x")
    assert (rc, err) == (2, "gpuguard certs inject: error: --live 'pods/x': expected "
                            "validatingwebhookconfiguration/NAME or "
                            "mutatingwebhookconfiguration/NAME\n")


def test_live_injection_without_a_cluster_is_refused(tmp_path, capsys, monkeypatch):
    out = _generated(tmp_path, capsys)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    rc, _, err = run_cli(capsys, "inject", "--ca", out / "ca.crt", "--live",
                         "validatingwebhookconfiguration/gpuguard")
    assert (rc, err) == (2, "gpuguard certs inject: error: --live: no cluster configured (no "
                            "in-cluster service account, $KUBECONFIG or ~/.kube/config); give "
                            "--kubeconfig FILE\n")


@pytest.mark.parametrize(("text", "expected"), [
    ("kind: ValidatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig:\n"
     "    caBundle:\n    url: https://x\n",
     "kind: ValidatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig:\n"
     "    caBundle: QUJD\n    url: https://x\n"),
    ("kind: ValidatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig: {}\n",
     'kind: ValidatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig: {caBundle: "QUJD"}\n'),
    ("kind: MutatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig:\n"
     "    caBundle: 'old'\n    url: https://x\n",
     "kind: MutatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig:\n"
     "    caBundle: 'QUJD'\n    url: https://x\n"),
    ("kind: MutatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig:\n"
     "    caBundle: |\n      old\n    url: https://x\n",
     "kind: MutatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig:\n"
     "    caBundle: QUJD\n    url: https://x\n"),
    ("kind: MutatingWebhookConfiguration\nmetadata: {name: m}\nwebhooks: []\n---\n"
     "kind: ValidatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig: {url: u}\n",
     "kind: MutatingWebhookConfiguration\nmetadata: {name: m}\nwebhooks: []\n---\n"
     'kind: ValidatingWebhookConfiguration\nwebhooks:\n- name: a\n  clientConfig: {caBundle: "QUJD", url: u}\n'),
])
def test_inject_text_edits(text, expected):
    assert inject_ca_bundle(text, "QUJD", "f.yaml").text == expected


@pytest.mark.parametrize(("text", "message"), [
    ("kind: ValidatingWebhookConfiguration\nwebhooks: {a: 1}\n",
     "f.yaml:2: document 0: ValidatingWebhookConfiguration/(no name): webhooks is not a list"),
    ("kind: ValidatingWebhookConfiguration\nmetadata: {name: v}\nwebhooks:\n- name: a\n"
     "  clientConfig: [1]\n",
     "f.yaml:5: document 0: ValidatingWebhookConfiguration/v: webhooks[0] (a): clientConfig is "
     "not a mapping"),
    ("kind: ValidatingWebhookConfiguration\nmetadata: {name: v}\nwebhooks:\n- name: a\n"
     "  clientConfig:\n    caBundle: [x]\n",
     "f.yaml:6: document 0: ValidatingWebhookConfiguration/v: webhooks[0] (a): "
     "clientConfig.caBundle is not a string"),
    ("kind: ValidatingWebhookConfiguration\nwebhooks: [\n", "f.yaml:3: invalid YAML: while "
     "parsing a flow node; expected the node content, but found '<stream end>'"),
])
def test_inject_errors(text, message):
    with pytest.raises(InjectError) as raised:
        inject_ca_bundle(text, "QUJD", "f.yaml")
    assert str(raised.value) == message


def test_ca_bundle_accepts_a_rotation_bundle_of_two_cas():
    first, second = generate_ca("old", 5)[0], generate_ca("new", 5)[0]
    value = ca_bundle(b"# rotation\n" + first + second, "ca.crt")
    assert base64.b64decode(value) == first + second


def test_inject_live_against_an_unreachable_api_server_is_the_environment(tmp_path, capsys,
                                                                         closed_port):
    # A kubeconfig whose server refuses connections (a bound, not listening port): exit 3 in one line,
    # not 2 (a refused object) and not 70 (the client's urllib3 error escaping as a crash).
    out = _generated(tmp_path, capsys)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{closed_port}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    rc, _, err = run_cli(capsys, "inject", "--ca", out / "ca.crt", "--live",
                         "validatingwebhookconfiguration/gpuguard", "--live",
                         "mutatingwebhookconfiguration/gpuguard", "--kubeconfig", kubeconfig)
    assert rc == 3, err
    [line] = err.splitlines()  # the second target is not tried: it would fail the same way
    assert line.startswith("gpuguard certs inject: error: ValidatingWebhookConfiguration/"
                           "gpuguard: cannot reach the API server")
