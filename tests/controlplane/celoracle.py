"""The Kubernetes CEL oracle from Python: one ``celoracle`` process, batches of expressions.

Owns talking to ``tests/controlplane/kube/celoracle`` (a Go program built by ``build.sh`` beside
kube-apiserver, from the same ``k8s.io/apiserver`` module): its JSON-lines protocol, and turning
its tagged values and gpuguard's plain values into one comparable form (:func:`canonical_oracle`,
:func:`canonical_gpuguard`). Must not decide what counts as a difference between the two; the
differential tests do.

Protocol (see the Go program's doc comment): a request is ``{"id", "expression", "vars",
"variables", "mutation", "hasParams", "authorizer"}``; an answer is one of ``{"value", "type",
"cost"}``, ``{"error", "cost"}``, ``{"compileError", "storedOnly"}``, ``{"inputError"}``.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class OracleError(Exception):
    """The oracle process died or answered out of protocol; the message has its stderr."""


@dataclass(frozen=True)
class Outcome:
    """One evaluation, by either side, in a comparable form.

    ``kind`` is ``value``, ``error`` or ``compile``; ``value`` is canonical (see
    :func:`canonical_oracle`) when ``kind == "value"``; ``message`` is the error text otherwise.
    """

    kind: str
    value: Any = None
    message: str = ""
    type_name: str = ""
    cost: int | None = None


class CelOracle:
    """A running ``celoracle``; use as a context manager. Not thread-safe (one batch at a time).

    Args:
        binary: the ``celoracle`` executable (``control_plane_bin / "celoracle"``).
    """

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self._process: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []

    def __enter__(self) -> CelOracle:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def info(self) -> dict[str, str]:
        """``{"kubernetes": "1.37", "compatibilityVersion": "1.36"}`` of the built oracle."""
        done = subprocess.run([str(self.binary), "-info"], capture_output=True, text=True,
                              check=True, timeout=60)
        return dict(json.loads(done.stdout))

    def start(self) -> None:
        """Start the process (stdin/stdout pipes; stderr kept for error messages)."""
        self._process = subprocess.Popen(
            [str(self.binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, encoding="utf-8", bufsize=1 << 16)
        assert self._process.stderr is not None
        stderr = self._process.stderr
        threading.Thread(target=lambda: self._stderr.extend(stderr), daemon=True).start()

    def stop(self) -> None:
        """Close stdin and wait for the process to exit (killed after 10 s)."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def evaluate(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Send ``requests`` (protocol objects without ``id``) and return the answers in order.

        Raises:
            OracleError: the process is not running, exited, or answered out of order.
        """
        process = self._process
        if process is None or process.poll() is not None:
            raise OracleError(f"celoracle is not running; stderr: {''.join(self._stderr)}")
        assert process.stdin is not None and process.stdout is not None
        stdin = process.stdin
        lines = [json.dumps({**request, "id": i}, allow_nan=False) + "\n"
                 for i, request in enumerate(requests)]
        failure: list[BaseException] = []

        def write() -> None:  # a writer thread: the pipes would deadlock on a large batch
            try:
                stdin.writelines(lines)
                stdin.flush()
            except OSError as exc:
                failure.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        answers = []
        for i in range(len(lines)):
            line = process.stdout.readline()
            if not line:
                writer.join(5)
                raise OracleError(f"celoracle exited after {i} of {len(lines)} answers "
                                  f"({failure or process.poll()}); stderr: "
                                  f"{''.join(self._stderr)[-2000:]}")
            answer = json.loads(line)
            if answer.get("id") != i:
                raise OracleError(f"answer {i} has id {answer.get('id')!r}: {line[:200]}")
            answers.append(answer)
        writer.join()
        return answers

    def outcomes(self, requests: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        """:meth:`evaluate`, each answer as an :class:`Outcome` (an input error raises)."""
        return [oracle_outcome(answer) for answer in self.evaluate(requests)]


def oracle_outcome(answer: Mapping[str, Any]) -> Outcome:
    """An oracle answer as an :class:`Outcome`.

    Raises:
        OracleError: the oracle refused the request itself (``inputError``).
    """
    if "inputError" in answer:
        raise OracleError(f"celoracle refused request {answer.get('id')}: {answer['inputError']}")
    if "compileError" in answer:
        return Outcome("compile", message=str(answer["compileError"]))
    if "error" in answer:
        return Outcome("error", message=str(answer["error"]), cost=answer.get("cost"))
    return Outcome("value", canonical_oracle(answer["value"]), type_name=str(answer["type"]),
                   cost=answer.get("cost"))


# --- one comparable form ------------------------------------------------------------------------
#
# Canonical values: None, bool, int, str, list as themselves; ("double", float), ("bytes", bytes),
# ("timestamp", aware datetime), ("duration", microseconds), ("optional", v | NONE),
# ("opaque", type, string), ("map", tuple of (key, value) sorted by repr). A CEL uint becomes an
# int, a type value its name, and timestamps and durations keep microseconds, because gpuguard's
# plain values (Python int, str, datetime, timedelta) cannot say more; the differential tests
# compare those inside CEL (type(x) == uint, d == duration('100ns')) instead.

NONE = ("optionalNone",)


def _double(value: float) -> tuple[str, float] | tuple[str, str]:
    return ("double", "NaN") if math.isnan(value) else ("double", value)


def _sorted_map(pairs: Iterable[tuple[Any, Any]]) -> tuple[str, tuple[tuple[Any, Any], ...]]:
    return "map", tuple(sorted(pairs, key=repr))


def _timestamp(text: str) -> datetime.datetime:
    # Go's RFC 3339 with up to 9 fractional digits; Python keeps microseconds.
    head, _, frac = text.rstrip("Z").partition(".")
    micros = int((frac + "000000")[:6]) if frac else 0
    parsed = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    return parsed.replace(microsecond=micros)


def canonical_oracle(value: Any) -> Any:
    """The canonical form of a tagged oracle value (see the module's comment)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, list):
        return [canonical_oracle(v) for v in value]
    if not isinstance(value, dict) or len(value) not in (1, 2):
        raise OracleError(f"untagged oracle value {value!r}")
    [tag, *_] = value
    inner = value[tag]
    if tag == "uint":
        return int(inner)
    if tag == "double":
        return _double(float(inner))
    if tag == "bytes":
        return "bytes", base64.b64decode(inner)
    if tag == "timestamp":
        return "timestamp", _timestamp(inner)
    if tag == "duration":
        return "duration", int(inner) // 1000
    if tag == "type":
        return str(inner).lower()
    if tag == "optional":
        return "optional", canonical_oracle(inner)
    if tag == "optionalNone":
        return "optional", NONE
    if tag == "map":
        return _sorted_map((_hashable(canonical_oracle(k)), canonical_oracle(v)) for k, v in inner)
    if tag == "opaque":
        return "opaque", OPAQUE_NAMES.get(inner, inner), value.get("string")
    raise OracleError(f"unknown oracle tag {tag!r} in {value!r}")


# gpuguard carries the Kubernetes opaque types as one-key maps (policies/cel/library/).
OPAQUE_NAMES = {
    "kubernetes.Quantity": "quantity", "net.IP": "ip", "net.CIDR": "cidr",
    "kubernetes.URL": "url", "kubernetes.Semver": "semver",
    "kubernetes.NamedFormat": "format",
    # policies/cel/library/authz.py
    "kubernetes.authorization.Authorizer": "authz",
    "kubernetes.authorization.PathCheck": "authz_path",
    "kubernetes.authorization.GroupCheck": "authz_group",
    "kubernetes.authorization.ResourceCheck": "authz_resource",
    "kubernetes.authorization.Decision": "authz_decision",
}


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def canonical_gpuguard(value: Any, opaque_string: Any = None) -> Any:
    """The canonical form of a plain value from gpuguard's :class:`CompiledExpression`.

    ``opaque_string`` turns gpuguard's one-key map form of an opaque type (``{"__ip__": …}``)
    into its ``string()``; without it the map is compared as a map.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _double(value)
    if isinstance(value, bytes):
        return "bytes", value
    if isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return "timestamp", aware.astimezone(datetime.UTC)
    if isinstance(value, datetime.timedelta):
        return "duration", value // datetime.timedelta(microseconds=1)
    if isinstance(value, list | tuple):
        return [canonical_gpuguard(v, opaque_string) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and opaque_string is not None:
            [(key, _)] = value.items()
            if isinstance(key, str) and key.startswith("__") and key.endswith("__"):
                return "opaque", key.strip("_"), opaque_string(value)
        return _sorted_map((_hashable(canonical_gpuguard(k, opaque_string)),
                            canonical_gpuguard(v, opaque_string)) for k, v in value.items())
    raise TypeError(f"no canonical form for {type(value).__name__} {value!r}")
