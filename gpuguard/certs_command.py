"""``gpuguard certs``: create, renew and publish the webhook's TLS material.

Sub-commands:

- ``generate --service NAME --namespace NS [--out DIR] [--days N] [--ca-days N] [--san SAN]
  [--force]``: a new CA and a serving certificate signed by it (``ca.crt``, ``ca.key``,
  ``tls.crt``, ``tls.key``; keys mode 0600).
- ``renew [--out DIR] [--days N] [--service NAME --namespace NS] [--san SAN]``: a new serving key
  and certificate from the existing CA in DIR (same names as the old certificate unless
  ``--service``/``--namespace`` are given). ``ca.crt`` is untouched, so the caBundle does not
  change and a running server reloads the new certificate by itself.
- ``ca-bundle [--ca FILE]``: print the base64 caBundle of the CA certificate.
- ``inject [--ca FILE] [FILE...] [--live KIND/NAME]... [--kubeconfig FILE]``: set
  ``webhooks[*].clientConfig.caBundle`` in Validating/MutatingWebhookConfiguration files in place
  (comments and layout kept), and with ``--live`` in the cluster through :mod:`kube.webhooks`.

Exit codes: 0 success; 2 refused material or bad input, with a message naming the file. This
module parses arguments and prints; the work is done by ``certs``.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from certs.bundle import ca_bundle
from certs.files import CA_CERT, CA_KEY, CERT_MODE, KEY_MODE, TLS_CERT, TLS_KEY, write_atomic
from certs.generate import (
    check_san,
    days_beyond_limit,
    generate_ca,
    generate_serving_cert,
    issue_serving_cert,
    max_days,
)
from certs.inject import InjectError, inject_ca_bundle
from certs.material import (
    CertificateError,
    fingerprint,
    parse_certificates,
    read_file,
    subject_alt_names,
    timestamp,
    utc_now,
)
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE
from policies.facts.resource_names import GPUSettings

EXIT_ERROR = EXIT_USAGE

DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650


class _CASources(TypedDict):
    """Where the CA certificate and key were read from, for the certs functions' errors."""

    ca_cert_source: str
    ca_key_source: str


class _Refused(Exception):
    """A refusal already phrased for the user (``"<file>: <problem>"``)."""


def _error(subcommand: str, message: object) -> int:
    print(f"gpuguard certs {subcommand}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _describe(path: Path, cert_pem: bytes) -> str:
    cert = parse_certificates(cert_pem, str(path))[0]
    return (f"serial {cert.serial_number:x}, notAfter {timestamp(cert.not_valid_after_utc)}, "
            f"SHA-256 {fingerprint(cert)}")


def _out_dir(out: str) -> Path:
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise _Refused(f"{directory}: not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise _Refused(f"{directory}: cannot create: {exc.strerror or exc}") from None
    return directory


def _write(path: Path, data: bytes, mode: int) -> None:
    try:
        write_atomic(path, data, mode)
    except OSError as exc:
        raise _Refused(f"{path}: cannot write: {exc.strerror or exc}") from None


def _ends_with_ca(leaf_pem: bytes, ca_pem: bytes) -> str | None:
    leaf = parse_certificates(leaf_pem, TLS_CERT)[0]
    ca = parse_certificates(ca_pem, CA_CERT)[0]
    if leaf.not_valid_after_utc >= ca.not_valid_after_utc:
        return (f"note: the serving certificate ends with the CA at "
                f"{timestamp(ca.not_valid_after_utc)}; before then run 'gpuguard certs "
                "generate --force' (new CA: the caBundle changes)")
    return None


def generate(args: argparse.Namespace) -> int:
    """``certs generate``: write a new CA and serving certificate into ``args.out``."""
    directory = _out_dir(args.out)
    paths = {name: directory / name for name in (CA_KEY, CA_CERT, TLS_KEY, TLS_CERT)}
    if not args.force:
        for path in paths.values():
            if path.exists():
                raise _Refused(
                    f"{path}: already exists; 'gpuguard certs renew --out {directory}' issues a "
                    "new serving certificate from this CA, --force replaces the CA (the caBundle "
                    "changes)"
                )
    ca_name = args.ca_name or f"gpuguard webhook CA ({args.service}.{args.namespace})"
    ca_cert, ca_key = generate_ca(ca_name, args.ca_days)
    tls_cert, tls_key = generate_serving_cert(
        ca_cert, ca_key, args.service, args.namespace, args.days, args.san
    )
    _write(paths[CA_KEY], ca_key, KEY_MODE)
    _write(paths[CA_CERT], ca_cert, CERT_MODE)
    _write(paths[TLS_KEY], tls_key, KEY_MODE)
    _write(paths[TLS_CERT], tls_cert, CERT_MODE)
    sans = subject_alt_names(parse_certificates(tls_cert, TLS_CERT)[0])
    print(f"wrote {paths[CA_CERT]}: CA {ca_name!r}, {_describe(paths[CA_CERT], ca_cert)}")
    print(f"wrote {paths[CA_KEY]} (mode 0600)")
    print(f"wrote {paths[TLS_CERT]}: {', '.join(sans)}; {_describe(paths[TLS_CERT], tls_cert)}")
    print(f"wrote {paths[TLS_KEY]} (mode 0600)")
    if note := _ends_with_ca(tls_cert, ca_cert):
        print(note)
    print(f"next: kubectl -n {args.namespace} create secret tls {args.service}-tls "
          f"--cert={paths[TLS_CERT]} --key={paths[TLS_KEY]}")
    print(f"      gpuguard certs inject --ca {paths[CA_CERT]} WEBHOOK_CONFIGURATION.yaml")
    return EXIT_OK


def renew(args: argparse.Namespace) -> int:
    """``certs renew``: a new serving key and certificate from the CA in ``args.out``."""
    if (args.service is None) != (args.namespace is None):
        raise _Refused("--service and --namespace go together")
    directory = Path(args.out)
    ca_cert_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
    tls_cert_path, tls_key_path = directory / TLS_CERT, directory / TLS_KEY
    ca_cert = read_file(ca_cert_path)
    ca_key = read_file(ca_key_path)
    sources = _CASources(ca_cert_source=str(ca_cert_path), ca_key_source=str(ca_key_path))
    if args.service is not None:
        tls_cert, tls_key = generate_serving_cert(
            ca_cert, ca_key, args.service, args.namespace, args.days, args.san, **sources
        )
    else:
        if not tls_cert_path.exists():
            raise _Refused(
                f"{tls_cert_path}: file not found; give --service and --namespace to name the "
                "new serving certificate"
            )
        old = parse_certificates(read_file(tls_cert_path), str(tls_cert_path))[0]
        sans = subject_alt_names(old)
        if not sans:
            raise _Refused(f"{tls_cert_path}: the certificate has no subjectAltName to reuse; "
                           "give --service and --namespace")
        common_name = old.subject.rfc4514_string().removeprefix("CN=") or sans[0]
        tls_cert, tls_key = issue_serving_cert(
            ca_cert, ca_key, common_name, [*sans, *args.san], args.days, **sources
        )
    _write(tls_key_path, tls_key, KEY_MODE)
    _write(tls_cert_path, tls_cert, CERT_MODE)
    sans = subject_alt_names(parse_certificates(tls_cert, TLS_CERT)[0])
    print(f"wrote {tls_cert_path}: {', '.join(sans)}; {_describe(tls_cert_path, tls_cert)}")
    print(f"wrote {tls_key_path} (mode 0600)")
    print(f"{ca_cert_path} unchanged, so the caBundle is unchanged; a running server loads the "
          "new certificate on its next reload (update the Secret if it is mounted from one)")
    if note := _ends_with_ca(tls_cert, ca_cert):
        print(note)
    return EXIT_OK


def print_ca_bundle(args: argparse.Namespace) -> int:
    """``certs ca-bundle``: print the caBundle of ``args.ca``."""
    print(ca_bundle(read_file(args.ca), args.ca))
    return EXIT_OK


def inject(args: argparse.Namespace) -> int:
    """``certs inject``: set the caBundle in every webhook of ``args.files``; all or nothing."""
    targets: list[tuple[str, str]] = []
    if args.live:
        # The kubernetes client (~0.15 s of CPU) only for --live: generate, renew, ca-bundle and
        # file injection never talk to a cluster.
        from kube.webhooks import parse_target  # noqa: PLC0415

        targets = [parse_target(target) for target in args.live]
    if not args.files and not targets:
        raise _Refused("give the webhook configuration files to edit, or --live KIND/NAME")
    value = ca_bundle(read_file(args.ca), args.ca)
    planned: list[tuple[Path, str, int]] = []
    errors: list[str] = []
    reports: list[str] = []
    for name in args.files:
        try:
            path = Path(os.path.realpath(name))  # edit the file a symlink points to
            raw = read_file(name)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _Refused(f"{name}: not UTF-8 text") from None
            result = inject_ca_bundle(text, value, name)
        except (CertificateError, InjectError, _Refused) as exc:
            errors.append(str(exc))
            continue
        if result.changed:
            planned.append((path, result.text, stat.S_IMODE(path.stat().st_mode)))
            reports.append(f"{name}: caBundle set on {len(result.changed)} of "
                           f"{len(result.webhooks)} webhook(s)")
        else:
            reports.append(f"{name}: up to date ({len(result.webhooks)} webhook(s))")
    if errors:
        for message in errors:
            _error("inject", message)
        print("gpuguard certs inject: no file written", file=sys.stderr)
        return EXIT_ERROR
    for path, text, mode in planned:
        _write(path, text.encode("utf-8"), mode)
    for line in reports:
        print(line)
    return _inject_live(targets, value, args.kubeconfig) if targets else EXIT_OK


def _inject_live(targets: list[tuple[str, str]], value: str, kubeconfig: str | None) -> int:
    """Patch the caBundle of each (kind, name) in the cluster; exit 2 if any is refused (not
    found, forbidden, changed meanwhile), 3 if the API server cannot be reached."""
    from kube.config import ClusterConfigError, detect  # noqa: PLC0415 - see inject
    from kube.webhooks import (  # noqa: PLC0415
        ApiUnreachable,
        WebhookConfigError,
        admission_api,
        set_ca_bundle,
    )

    try:
        cluster = detect(kubeconfig)
    except ClusterConfigError as exc:
        raise _Refused(f"--live: {exc}") from None
    if cluster is None:
        raise _Refused("--live: no cluster configured (no in-cluster service account, "
                       "$KUBECONFIG or ~/.kube/config); give --kubeconfig FILE")
    api = admission_api(cluster.api_client)
    code = EXIT_OK
    for kind, name in targets:
        try:
            result = set_ca_bundle(api, kind, name, value)
        except ApiUnreachable as exc:
            _error("inject", exc)
            return EXIT_ENVIRONMENT  # every other target would fail the same way
        except WebhookConfigError as exc:
            _error("inject", exc)
            code = EXIT_ERROR
            continue
        if result.changed:
            print(f"{kind}/{name} ({cluster.source}): caBundle set on {len(result.changed)} of "
                  f"{len(result.webhooks)} webhook(s)")
        else:
            print(f"{kind}/{name} ({cluster.source}): up to date "
                  f"({len(result.webhooks)} webhook(s))")
    return code


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": generate,
    "renew": renew,
    "ca-bundle": print_ca_bundle,
    "inject": inject,
}


def run(args: argparse.Namespace) -> int:
    """Dispatch ``gpuguard certs SUBCOMMAND``; refusals become one stderr line and exit 2."""
    try:
        return _HANDLERS[args.certs_command](args)
    except (CertificateError, InjectError, _Refused, ValueError) as exc:
        return _error(args.certs_command, exc)
    except OSError as exc:  # e.g. a file vanished between reading and stat
        return _error(args.certs_command, f"{exc.filename}: {exc.strerror or exc}")


def _days(text: str) -> int:
    """``--days`` / ``--ca-days``: a whole number of days, at least 1, and short enough that the
    certificate ends by 9999-12-31 (:data:`certs.generate.MAX_NOT_AFTER`), refused here rather
    than once the CA is made."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1 day")
    now = utc_now()
    if value > max_days(now):
        raise argparse.ArgumentTypeError(days_beyond_limit(value, now))
    return value


def _san(text: str) -> str:
    """``--san``: an IP address or a DNS name (:func:`certs.generate.check_san`)."""
    try:
        return check_san(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard certs``; returns (name, handler)."""
    parser = commands.add_parser(
        "certs", help="create, renew and publish the webhook's TLS certificates",
        description="Create a CA and serving certificate for the admission webhook, renew the "
        "serving certificate from the same CA, print the caBundle, or set it in webhook "
        "configuration files. Files: ca.crt, ca.key, tls.crt, tls.key (keys mode 0600).",
    )
    sub = parser.add_subparsers(dest="certs_command", metavar="SUBCOMMAND", required=True)

    gen = sub.add_parser(
        "generate", help="new CA and serving certificate",
        description="Write a new CA (ca.crt, ca.key) and a serving certificate (tls.crt, "
        "tls.key) for the Service NAME in NS, with SANs NAME, NAME.NS, NAME.NS.svc and "
        "NAME.NS.svc.cluster.local.",
    )
    gen.add_argument("--service", required=True, metavar="NAME", help="the webhook Service name")
    gen.add_argument("-n", "--namespace", required=True, metavar="NS", help="its namespace")
    gen.add_argument("--force", action="store_true",
                     help="replace existing files, including the CA (the caBundle changes)")
    gen.add_argument("--ca-days", type=_days, default=DEFAULT_CA_DAYS, metavar="N",
                     help=f"CA validity in days (default {DEFAULT_CA_DAYS})")
    gen.add_argument("--ca-name", metavar="CN", help="CA common name")

    ren = sub.add_parser(
        "renew", help="new serving certificate from the existing CA",
        description="Issue a new serving key and certificate from ca.crt / ca.key in DIR. The "
        "CA is kept, so the caBundle does not change. Without --service/--namespace the names "
        "of the current tls.crt are reused.",
    )
    ren.add_argument("--service", metavar="NAME", help="the webhook Service name")
    ren.add_argument("-n", "--namespace", metavar="NS", help="its namespace")
    for command in (gen, ren):
        command.add_argument("--out", default=".", metavar="DIR",
                             help="directory of ca.crt, ca.key, tls.crt, tls.key (default .)")
        command.add_argument("--days", type=_days, default=DEFAULT_DAYS, metavar="N",
                             help=f"serving certificate validity in days (default "
                             f"{DEFAULT_DAYS}; never beyond the CA)")
        command.add_argument("--san", action="append", default=[], metavar="SAN", type=_san,
                             help="extra DNS name or IP address (repeatable), e.g. 127.0.0.1")

    bundle = sub.add_parser("ca-bundle", help="print the base64 caBundle",
                            description="Print the caBundle value (base64 of the PEM CA "
                            "certificate) for webhook configurations.")
    bundle.add_argument("--ca", default=CA_CERT, metavar="FILE",
                        help=f"CA certificate (default {CA_CERT})")

    inj = sub.add_parser(
        "inject", help="set the caBundle in webhook configuration files",
        description="Set webhooks[*].clientConfig.caBundle in every ValidatingWebhookConfiguration "
        "and MutatingWebhookConfiguration of the files, in place; comments and layout are kept. "
        "Nothing is written unless every file can be edited. --live patches the objects in the "
        "cluster (JSON patch guarded by resourceVersion).",
    )
    inj.add_argument("--ca", default=CA_CERT, metavar="FILE",
                     help=f"CA certificate (default {CA_CERT})")
    inj.add_argument("--live", action="append", default=[], metavar="KIND/NAME",
                     help="also patch this configuration in the cluster, e.g. "
                     "validatingwebhookconfiguration/gpuguard (repeatable)")
    inj.add_argument("--kubeconfig", metavar="FILE",
                     help="for --live: kubeconfig (default: in-cluster, then $KUBECONFIG, "
                     "then ~/.kube/config)")
    inj.add_argument("files", nargs="*", metavar="FILE", help="webhook configuration YAML/JSON")
    return "certs", lambda args, settings: run(args)
