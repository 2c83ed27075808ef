"""Admission webhook benchmark: HTTPS with keep-alive against a locally started ``gpuguard serve``.

Run: .venv/bin/python benchmarks/webhook.py [--duration 10] [--concurrency 32] [--workers 1]

Starts ``gpuguard serve`` on 127.0.0.1 with a throw-away CA (certs/generate.py) and measures,
with ``hey`` (Debian package ``hey``; a Python aiohttp load generator is used instead when it is
missing, and the output says so):

- (a) ``POST /null-validate``: the same app reading and answering the AdmissionReview without
  evaluating it — the HTTP + TLS + JSON floor;
- (b) ``POST /validate`` with the built-in policy library;
- (c) ``POST /validate`` with 50 synthetic CEL policies;
- and ``POST /validate`` with no policy that matches a Pod (one for ConfigMaps: an empty policy
  set is refused, as it would allow everything): the webhook's own cost over the null handler;

each at saturation (``--concurrency`` connections) and at a fixed 500 requests/s, printing
throughput and p50 / p99 latency, the throughput ratio gpuguard / null, and the engine's own cost
per evaluation of the same request measured in-process (the ceiling per core). The body is the GPU
pod AdmissionReview of examples/admission/gpu-pod-review.json (denied by the library: every
policy runs). The server logs each decision as in production (to /dev/null here).
Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from certs.generate import generate_ca, generate_serving_cert  # noqa: E402

BODY = ROOT / "examples" / "admission" / "gpu-pod-review.json"
TEMPLATES = (  # as benchmarks/engine.py
    "!has(object.metadata.name) || object.metadata.name.size() < {n}",
    "!has(object.metadata.labels) || !('forbidden-{i}' in object.metadata.labels)",
    "gpu.count <= {n}",
    "gpu.equivalents <= {i}.0 + 100.0",
    "object.kind != 'Forbidden{i}' && gpu.migProfiles.size() <= {n}",
)
FIXED_RATE = 500


def synthetic_policies(count: int = 50) -> str:
    """``count`` GPUPolicies, each with one validation from TEMPLATES."""
    return yaml.safe_dump_all([{
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
        "metadata": {"name": f"synthetic-{i:02d}"},
        "spec": {"validations": [{"expression": TEMPLATES[i % len(TEMPLATES)].format(
            i=i, n=64 + i)}]},
    } for i in range(count)])


def engine_cost(policies: Path | None, rounds: int = 300) -> float:
    """µs per ``Engine.evaluate`` (validations, as /validate) of the benchmark body."""
    import datetime

    from gpuguard import policy_set
    from policies.facts.resource_names import GPUSettings
    from policies.facts.review import from_request

    engine = policy_set.load([str(policies)] if policies else None, GPUSettings()).engine
    review = from_request(json.loads(BODY.read_text())["request"],
                          now=datetime.datetime.now(datetime.UTC))
    for _ in range(30):
        engine.evaluate(review, mutate=False)
    start = time.perf_counter()
    for _ in range(rounds):
        engine.evaluate(review, mutate=False)
    return (time.perf_counter() - start) / rounds * 1e6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A ``gpuguard serve`` process on 127.0.0.1."""

    def __init__(self, directory: Path, workers: int, policies: Path | None) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "gpuguard", "serve", "--cert",
                   str(directory / "tls.crt"), "--key", str(directory / "tls.key"),
                   "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers),
                   "--benchmark-routes", "--shutdown-delay-s", "0"]
        if policies is not None:
            command += ["--policies", str(policies)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw, \
                        context.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n"
                                b"Connection: close\r\n\r\n")
                    if tls.recv(64).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("gpuguard serve did not become ready")

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def run_hey(url: str, body: Path, duration: int, concurrency: int, rate: int | None) -> dict:
    command = ["hey", "-z", f"{duration}s", "-m", "POST", "-T", "application/json",
               "-D", str(body)]
    if rate is None:
        command += ["-c", str(concurrency)]
    else:  # hey's -q is per connection: 10 connections x rate/10
        command += ["-c", "10", "-q", str(rate // 10)]
    output = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    codes = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", output))
    latency = {p: float(v) * 1000 for p, v in re.findall(r"(\d+)%\s+in\s+([\d.]+)\s+secs",
                                                          output)}
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1]),
            "p50": latency.get("50", float("nan")), "p99": latency.get("99", float("nan")),
            "codes": codes}


async def _python_load(url: str, body: bytes, duration: int, concurrency: int,
                       rate: int | None, ca: Path) -> dict:
    import aiohttp

    context = ssl.create_default_context(cafile=str(ca))
    timings: list[float] = []
    codes: dict[str, int] = {}
    end = time.perf_counter() + duration
    interval = None if rate is None else concurrency / rate

    async def worker(session: aiohttp.ClientSession) -> None:
        next_at = time.perf_counter()
        while time.perf_counter() < end:
            if interval is not None:
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            start = time.perf_counter()
            async with session.post(url, data=body, ssl=context,
                                    headers={"Content-Type": "application/json"}) as response:
                await response.read()
                codes[str(response.status)] = codes.get(str(response.status), 0) + 1
            timings.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    timings.sort()
    return {"rps": len(timings) / elapsed, "p50": statistics.median(timings) * 1000,
            "p99": timings[int(len(timings) * 0.99) - 1] * 1000, "codes": codes}


def measure(url: str, duration: int, concurrency: int, rate: int | None, ca: Path,
            use_hey: bool) -> dict:
    if use_hey:
        return run_hey(url, BODY, duration, concurrency, rate)
    return asyncio.run(_python_load(url, BODY.read_bytes(), duration,
                                    concurrency if rate is None else 10, rate, ca))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="connections at saturation")
    parser.add_argument("--workers", type=int, default=1, help="gpuguard serve --workers")
    args = parser.parse_args()
    use_hey = shutil.which("hey") is not None
    print("load generator:", "hey (TLS, keep-alive)" if use_hey else
          "hey not found (apt-get install -y hey): using the Python aiohttp load generator, "
          "which itself needs CPU and understates the server")
    print(f"{os.cpu_count()} CPUs; server workers: {args.workers}; {args.duration} s per run; "
          f"saturation at {args.concurrency} connections; body {BODY.name} "
          f"({BODY.stat().st_size} bytes)")
    directory = Path(tempfile.mkdtemp(prefix="gpuguard-bench-"))
    try:
        ca_cert, ca_key = generate_ca("gpuguard benchmark CA", 1)
        cert, key = generate_serving_cert(ca_cert, ca_key, "gpuguard", "gpuguard-system", 1,
                                          extra_sans=("localhost", "127.0.0.1"))
        for name, data in (("ca.crt", ca_cert), ("tls.crt", cert), ("tls.key", key)):
            (directory / name).write_bytes(data)
        synthetic = directory / "policies"
        synthetic.mkdir()
        (synthetic / "synthetic.yaml").write_text(synthetic_policies(50))
        empty = directory / "no-match"
        empty.mkdir()
        (empty / "configmaps.yaml").write_text(yaml.safe_dump({
            "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
            "metadata": {"name": "configmaps-only"},
            "spec": {"match": {"resources": ["configmaps"]},
                     "validations": [{"expression": "true"}]}}))
        scenarios = [("null handler", None, "/null-validate"),
                     ("no matching policy", empty, "/validate"),
                     ("built-in library", None, "/validate"),
                     ("50 policies", synthetic, "/validate")]
        results: dict[str, dict[str, dict]] = {}
        servers: dict[Path | None, Server] = {}
        try:
            for name, policies, path in scenarios:
                if policies not in servers:
                    servers[policies] = Server(directory, args.workers, policies)
                server = servers[policies]
                measure(server.url(path), 2, args.concurrency, None, directory / "ca.crt",
                        use_hey)  # warm-up
                results[name] = {
                    "saturation": measure(server.url(path), args.duration, args.concurrency,
                                          None, directory / "ca.crt", use_hey),
                    "fixed": measure(server.url(path), args.duration, args.concurrency,
                                     FIXED_RATE, directory / "ca.crt", use_hey),
                }
        finally:
            for server in servers.values():
                server.stop()
        print()
        print(f"{'scenario':<18} {'saturation req/s':>17} {'p50 ms':>8} {'p99 ms':>8}   "
              f"{'@500/s req/s':>12} {'p50 ms':>8} {'p99 ms':>8}  statuses")
        for name, result in results.items():
            sat, fixed = result["saturation"], result["fixed"]
            print(f"{name:<18} {sat['rps']:>17.0f} {sat['p50']:>8.2f} {sat['p99']:>8.2f}   "
                  f"{fixed['rps']:>12.0f} {fixed['p50']:>8.2f} {fixed['p99']:>8.2f}  "
                  f"{json.dumps(sat['codes'])}")
        null = results["null handler"]["saturation"]["rps"]
        print()
        for name in ("no matching policy", "built-in library", "50 policies"):
            rps = results[name]["saturation"]["rps"]
            print(f"ratio gpuguard/null ({name}): {rps / null:.2f}   "
                  f"({rps / args.workers:.0f} req/s per worker)")
        print()
        for name, policies in (("built-in library", None), ("50 policies", synthetic)):
            micros = engine_cost(policies)
            print(f"engine alone ({name}, same request, in-process): {micros:.0f} µs per "
                  f"/validate evaluation -> at most {1e6 / micros:.0f} evaluations/s per core")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
