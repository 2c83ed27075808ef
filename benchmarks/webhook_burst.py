"""Burst of large AdmissionReviews against a local ``gpuguard serve``: does the event loop keep
answering, and is the memory given back?

Run: .venv/bin/python benchmarks/webhook_burst.py [--concurrency 100] [--size-mib 2.9]
     [--shape annotation|env|containers] [--settle-s 5]

Starts ``gpuguard serve`` (built-in policy library, TLS with a throw-away CA, 127.0.0.1 only),
then, from a separate load process, opens ``--concurrency`` keep-alive TLS connections and posts
one ``--size-mib`` MiB AdmissionReview of a GPU pod on each at the same moment, while a probe
(another process) sends ``GET /readyz`` every ``--probe-ms`` on its own connection. Body shapes:
``annotation`` (one large annotation, e.g. a big ``last-applied-configuration``), ``env`` (tens
of thousands of env vars: many small JSON objects, the costliest to decode) and ``containers``
(hundreds of containers).

Prints the ``/readyz`` latency (p50 / p99 / max) before the load connections open and during the
burst (the connections open just before it: the server closes idle ones beyond
``--max-idle-connections`` after a grace period), the reviews'
statuses and latencies, how many answers were decided by failurePolicy (deadline), and the
server's resident memory (VmRSS; its child processes' — the evaluation processes — apart): at
the start (ready, after one warm-up review), at its peak, after the burst with the connections
still open and idle, and after they close. Machine-readable lines follow, ``name: value``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import multiprocessing
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from certs.generate import generate_ca, generate_serving_cert  # noqa: E402

BODY = ROOT / "examples" / "admission" / "gpu-pod-review.json"
MiB = 1024 * 1024


def review(shape: str, size: int, uid: str) -> bytes:
    """The sample GPU pod review grown to about ``size`` bytes in the given ``shape``."""
    base = json.loads(BODY.read_text())
    base["request"]["uid"] = uid
    obj = base["request"]["object"]
    if shape == "annotation":
        room = size - len(json.dumps(base)) - 40
        obj["metadata"]["annotations"] = {"example.com/blob": "x" * room}
    elif shape == "env":
        container = obj["spec"]["containers"][0]
        container["env"] = []
        while len(json.dumps(base)) < size - 100_000:
            start = len(container["env"])
            container["env"].extend({"name": f"VAR_{i:06d}", "value": f"value-{i:06d}-abcdefgh"}
                                    for i in range(start, start + 1000))
    elif shape == "containers":
        spec = obj["spec"]
        first = spec["containers"][0]
        spec["containers"] = []
        while len(json.dumps(base)) < size - 20_000:
            for _ in range(50):
                container = copy.deepcopy(first)
                container["name"] = f"c{len(spec['containers'])}"
                container["env"] = [{"name": f"E{j}", "value": "v" * 20} for j in range(20)]
                spec["containers"].append(container)
    else:
        raise ValueError(shape)
    return json.dumps(base).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def descendants_rss_kib(pid: int) -> int:
    """Resident KiB of every process below ``pid`` (the evaluation processes of
    ``--eval-processes`` and their forkserver), 0 when there are none."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    total, stack = 0, list(children.get(pid, []))
    while stack:
        child = stack.pop()
        stack.extend(children.get(child, []))
        with contextlib.suppress(OSError, RuntimeError):  # it exited meanwhile
            total += rss_kib(child)
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (``/proc/PID/stat``): what the burst cost
    the server, a figure the other jobs of a shared machine change far less than wall time."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_by_mapping(pid: int) -> dict[str, int]:
    """Resident KiB of the process by kind of mapping: the brk heap, anonymous mappings (malloc
    arenas of threads, large blocks, Python's object arenas) and files (code, libraries)."""
    totals = {"heap": 0, "anonymous": 0, "files": 0}
    kind = "anonymous"
    with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                name = fields[5] if len(fields) > 5 else ""
                kind = "heap" if name == "[heap]" else "files" if name.startswith("/") \
                    else "anonymous"
            elif fields and fields[0] == "Rss:":
                totals[kind] += int(fields[1])
    return totals


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def probe(port: int, ca: str, interval: float, stop: multiprocessing.synchronize.Event,
          out: multiprocessing.queues.Queue, probing: multiprocessing.synchronize.Event) -> None:
    """``GET /readyz`` every ``interval`` s on one keep-alive connection (``probing`` set after
    the first answer); puts ``(sent_at, seconds, status)`` tuples on ``out``, then None."""
    import http.client

    context = ssl.create_default_context(cafile=ca)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    results = []
    while not stop.is_set():
        start = time.time()
        try:
            connection.request("GET", "/readyz", headers={"Host": "localhost"})
            response = connection.getresponse()
            response.read()
            status = response.status
        except OSError as exc:
            status = f"error {type(exc).__name__}"
            connection.close()
        results.append((start, time.time() - start, status))
        probing.set()
        time.sleep(max(0.0, interval - (time.time() - start)))
    connection.close()
    out.put(results)


def load(port: int, ca: str, bodies: list[bytes], go: multiprocessing.Event,
         opened: multiprocessing.Event, idle: multiprocessing.Event,
         release: multiprocessing.Event, out: multiprocessing.queues.Queue) -> None:
    """Open one connection per body, wait for ``go``, post them all at once, keep the
    connections idle until ``release``, close them; puts the per-request results on ``out``."""
    import aiohttp

    async def main() -> list[tuple[int, float, dict, bool]]:
        context = ssl.create_default_context(cafile=ca)
        connector = aiohttp.TCPConnector(limit=len(bodies), ssl=context, keepalive_timeout=600)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            base = f"https://localhost:{port}"

            async def warm() -> None:
                async with session.get(f"{base}/healthz") as response:
                    await response.read()
                    await asyncio.sleep(0.5)  # hold it so that each warm-up gets its own

            await asyncio.gather(*(warm() for _ in bodies))
            opened.set()
            while not go.is_set():
                await asyncio.sleep(0.01)

            async def send(client: aiohttp.ClientSession, body: bytes) -> tuple[int, bytes]:
                async with client.post(f"{base}/validate", data=body,
                                       headers={"Content-Type": "application/json"}) as r:
                    return r.status, await r.read()

            async def post(body: bytes) -> tuple[int, float, dict, bool]:
                start = time.time()
                retried = False
                try:
                    status, raw = await send(session, body)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    # The server closed this idle connection (--max-idle-connections) as the
                    # post went out: once more on a new one (not another pooled one, closed
                    # too perhaps), as Go's transport (kube-apiserver) retries a request on a
                    # connection closed idle.
                    retried = True
                    fresh = aiohttp.TCPConnector(ssl=context, force_close=True)
                    async with aiohttp.ClientSession(connector=fresh, timeout=timeout) as one:
                        status, raw = await send(one, body)
                seconds = time.time() - start
                try:
                    answer = json.loads(raw)
                except ValueError:
                    answer = {"raw": raw[:200].decode("latin-1")}
                return status, seconds, answer, retried

            results = await asyncio.gather(*(post(body) for body in bodies))
            idle.set()
            while not release.is_set():
                await asyncio.sleep(0.05)
        return results

    out.put(asyncio.run(main()))


def start_server(directory: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gpuguard", "serve", "--cert", str(directory / "tls.crt"),
               "--key", str(directory / "tls.key"), "--host", "127.0.0.1", "--port", str(port),
               "--shutdown-delay-s", "0", "--log-level", "warning", *extra]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=open(directory / "server.log", "wb"))  # noqa: SIM115
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, \
                    context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                if tls.recv(64).startswith(b"HTTP/1.1 200"):
                    return process
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("gpuguard serve did not become ready")


def post_once(port: int, ca: str, body: bytes) -> int:
    import http.client

    context = ssl.create_default_context(cafile=ca)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    connection.request("POST", "/validate", body=body,
                       headers={"Host": "localhost", "Content-Type": "application/json"})
    status = connection.getresponse().status
    connection.close()
    return status


def server_metrics(port: int, ca: str) -> dict[str, float]:
    """The gpuguard_* samples of ``/metrics`` that say what the server did with the burst."""
    import http.client

    context = ssl.create_default_context(cafile=ca)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    connection.request("GET", "/metrics", headers={"Host": "localhost"})
    text = connection.getresponse().read().decode()
    connection.close()
    wanted = ("gpuguard_memory_trims_total", "gpuguard_http_connections_closed_total",
              "gpuguard_http_connections_open", "gpuguard_admission_requests_total")
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(wanted)}


def summarize(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"{name}: n={len(ms)} p50 {percentile(ms, 0.5):.1f} ms, p99 "
            f"{percentile(ms, 0.99):.1f} ms, max {max(ms, default=float('nan')):.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--size-mib", type=float, default=2.9)
    parser.add_argument("--shape", default="annotation",
                        choices=("annotation", "env", "containers"))
    parser.add_argument("--probe-ms", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=8.0,
                        help="seconds after the burst (and after closing) before RSS is read")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra gpuguard serve argument (repeatable)")
    args = parser.parse_args()
    size = int(args.size_mib * MiB)
    directory = Path(tempfile.mkdtemp(prefix="gpuguard-burst-"))
    context = multiprocessing.get_context("spawn")
    try:
        ca_cert, ca_key = generate_ca("gpuguard burst benchmark CA", 1)
        cert, key = generate_serving_cert(ca_cert, ca_key, "gpuguard", "gpuguard-system", 1,
                                          extra_sans=("localhost", "127.0.0.1"))
        for name, data in (("ca.crt", ca_cert), ("tls.crt", cert), ("tls.key", key)):
            (directory / name).write_bytes(data)
        ca = str(directory / "ca.crt")
        # One body built (the env shape takes seconds), each copy with its own uid.
        template = review(args.shape, size, "burst-uid-0000")
        bodies = [template.replace(b'"burst-uid-0000"', f'"burst-uid-{i:04d}"'.encode())
                  for i in range(args.concurrency)]
        port = free_port()
        server = start_server(directory, port, args.server_arg)
        try:
            rss_ready = rss_kib(server.pid)
            warm_status = post_once(port, ca, template.replace(b'"burst-uid-0000"',
                                                               b'"burst-warm-up"'))
            time.sleep(1.0)
            rss_start = rss_kib(server.pid)
            workers_start = descendants_rss_kib(server.pid)
            stop, go, probing = context.Event(), context.Event(), context.Event()
            opened, idle, release = context.Event(), context.Event(), context.Event()
            probes: multiprocessing.queues.Queue = context.Queue()
            results: multiprocessing.queues.Queue = context.Queue()
            # Daemons: a failed run must not leave them running.
            prober = context.Process(target=probe, args=(port, ca, args.probe_ms / 1000, stop,
                                                         probes, probing), daemon=True)
            loader = context.Process(target=load, args=(port, ca, bodies, go, opened,
                                                        idle, release, results), daemon=True)
            prober.start()
            probing.wait(120)  # the process takes seconds to start on a loaded machine
            time.sleep(2.0)  # idle probes: the baseline
            baseline_end = time.time()
            # The connections open just before the burst: the server closes idle ones beyond
            # --max-idle-connections after a grace period, and a post racing that close fails.
            loader.start()
            opened.wait(120)
            peak = [rss_kib(server.pid)]
            cpu_start = cpu_seconds(server.pid)
            burst_start = time.time()
            go.set()

            def sample() -> None:
                while not idle.is_set():
                    peak.append(rss_kib(server.pid))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            while not idle.wait(0.5):
                if not loader.is_alive():
                    raise RuntimeError("the load process failed (its traceback is above)")
            burst_end = time.time()
            cpu_burst = cpu_seconds(server.pid) - cpu_start
            sampler.join()
            time.sleep(args.settle_s)
            rss_idle = rss_kib(server.pid)
            release.set()
            answers = results.get(timeout=60)
            loader.join(60)
            time.sleep(args.settle_s)
            rss_closed = rss_kib(server.pid)
            workers_closed = descendants_rss_kib(server.pid)
            mappings = rss_by_mapping(server.pid)
            counters = server_metrics(port, ca)
            stop.set()
            samples = probes.get(timeout=60)
            prober.join(60)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        before = [s for at, s, _ in samples if at < baseline_end]
        during = [s for at, s, _ in samples if burst_start <= at <= burst_end]
        probe_statuses: dict[str, int] = {}
        for _, _, status in samples:
            probe_statuses[str(status)] = probe_statuses.get(str(status), 0) + 1
        statuses: dict[str, int] = {}
        fallbacks = 0
        for status, _, answer, _ in answers:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            text = json.dumps(answer.get("response", {}))
            fallbacks += "did not finish within" in text
        latencies = [seconds for _, seconds, _, _ in answers]
        evaluated = statuses.get("200", 0)
        retries = sum(retried for *_, retried in answers)
        print(f"gpuguard serve on 127.0.0.1 (TLS, built-in library), {args.concurrency} reviews "
              f"of {len(bodies[0])} bytes ({args.shape}) posted at once; warm-up answer "
              f"{warm_status}; server args {args.server_arg or 'none'}")
        print(summarize("/readyz before the burst", before))
        print(summarize("/readyz during the burst", during),
              f"(statuses {json.dumps(probe_statuses)})")
        slowest = sorted(((s, at) for at, s, _ in samples if burst_start <= at <= burst_end),
                         reverse=True)[:5]
        print("slowest /readyz during the burst:", ", ".join(
            f"{s * 1000:.0f} ms at +{at - burst_start:.2f} s" for s, at in slowest))
        print(summarize("reviews", latencies), f"statuses {json.dumps(statuses)}, "
              f"{fallbacks} decided by failurePolicy at the deadline, {retries} sent again on "
              f"a new connection (the server had closed theirs idle); burst lasted "
              f"{burst_end - burst_start:.1f} s, the server used {cpu_burst:.2f} CPU s "
              f"({1000 * cpu_burst / max(1, evaluated):.0f} ms per review answered 200)")
        print(f"RSS: ready {rss_ready / 1024:.1f} MiB, start (after one warm-up review) "
              f"{rss_start / 1024:.1f} MiB, peak {max(peak) / 1024:.1f} MiB, after the burst "
              f"with {args.concurrency} idle connections {rss_idle / 1024:.1f} MiB, after they "
              f"closed {rss_closed / 1024:.1f} MiB "
              f"({100 * (rss_closed - rss_start) / rss_start:+.1f} % of the start)")
        print(f"RSS of the server's child processes (evaluation processes): start "
              f"{workers_start / 1024:.1f} MiB, after the connections closed "
              f"{workers_closed / 1024:.1f} MiB")
        print("RSS after they closed, by mapping:",
              ", ".join(f"{k} {v / 1024:.1f} MiB" for k, v in mappings.items()))
        print("server metrics:", ", ".join(f"{k} {v:g}" for k, v in counters.items()))
        print()
        figures = {
            "readyz_p99_during_burst_ms": percentile(during, 0.99) * 1000,
            "readyz_max_during_burst_ms": max(during, default=float("nan")) * 1000,
            "review_p50_ms": percentile(latencies, 0.5) * 1000,
            "reviews_answered_200": evaluated,
            "server_cpu_s_during_burst": cpu_burst,
            "rss_start_mib": rss_start / 1024, "rss_peak_mib": max(peak) / 1024,
            "rss_idle_connections_mib": rss_idle / 1024, "rss_closed_mib": rss_closed / 1024,
            "rss_closed_vs_start_percent": 100 * (rss_closed - rss_start) / rss_start,
            "children_rss_start_mib": workers_start / 1024,
            "children_rss_closed_mib": workers_closed / 1024,
            "total_rss_closed_vs_start_percent": 100 * (
                rss_closed + workers_closed - rss_start - workers_start) / (
                rss_start + workers_start),
        }
        for name, value in figures.items():
            print(f"{name}: {value:.1f}")
        print("statuses_5xx:", sum(n for s, n in statuses.items() if s.startswith("5")))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
