"""Whole installs: a real `tunecache pull --jit-workspace --warm-state` killed (SIGKILL) at each of
its renames in turn, then the next install; every kind on disk must then be of one run, and
nothing an install keeps for a roll back (``.NAME.old-*``) or stages (``.tunecache-*``) may
survive it. And a newer run's compile cache and model inspections replace those of the same names.

Two signed runs of one key differ in every kind under the same names: the tactics (one entry
fewer), the JIT module's ``.so``, the model-inspection file, the compile cache's artifact; the
Triton kernel (named by its hash) differs in name. The kill is deterministic: the command runs
under a wrapper that counts the process's renames (``os.rename``, ``os.replace``, ``os.link``)
and kills itself with SIGKILL before the N-th, for N = 1, 2, ... until an install finishes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support.builders import run_payload, signed
from tests.support.cli import MODEL
from tests.support.jit import fake_workspace
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.vllm_stand_in import node_scratch
from tunecache.formats.jit_module import module_tarball

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

MODULE = "batch_prefill_bf16_h128"
MODELINFO = "vllm-model_executor-models-llama-LlamaForCausalLM.json"
ARTIFACT = "artifact_compile_range_1_8192_subgraph_0"

#: Runs the `tunecache` command and kills it (SIGKILL) before the KILL_AT-th rename it makes.
KILLED = '''
import os, signal, sys
from importlib.metadata import entry_points
at, count = int(os.environ["KILL_AT"]), [0]
def counted(call):
    def wrapper(*args, **kwargs):
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return call(*args, **kwargs)
    return wrapper
os.rename, os.replace, os.link = counted(os.rename), counted(os.replace), counted(os.link)
[main] = [e for e in entry_points(group="console_scripts") if e.name == "tunecache"]
sys.argv = ["tunecache", *sys.argv[1:]]
sys.exit(main.load()())
'''


def _rewritten(blob: bytes, edit) -> bytes:
    """The gzipped tarball ``blob`` with each member passed through ``edit(name, data) -> (name, data)``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(blob)) as source, tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None
            name, data = edit(member.name, data)
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = member.type, member.mode, member.mtime
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _second(name: str, data: bytes | None) -> tuple[str, bytes | None]:
    """Run two's warm state: the same names with other bytes; its Triton kernel under another hash."""
    if data is not None and name.endswith((ARTIFACT, MODELINFO, "/model")):
        data = data + b" (run two)" if not name.endswith(MODELINFO) else json.dumps({"hash": "h2", "modelinfo": {}}).encode()
    return name.replace("HASHB", "HASHC"), data


def _push(server, signing_key, tactics: bytes, blobs: list[tuple[dict, bytes]], summary: dict) -> int:
    for blob in [tactics] + [b for _, b in blobs]:
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code in (200, 201)
    payload = run_payload(CUDNN_FILE)
    payload["artifacts"][0]["sha256"] = hashlib.sha256(tactics).hexdigest()
    payload["summary"]["entries"] = sum(1 for k in json.loads(tactics) if not k.startswith("_"))
    payload["artifacts"] += [{**spec, "sha256": hashlib.sha256(blob).hexdigest()} for spec, blob in blobs]
    payload["summary"]["vllm_compile"] = summary
    answer = as_admin.post(f"{server}/v1/tunings", json=signed(payload, signing_key))
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def two_runs(server, tmp_path, signing_key) -> dict[str, dict]:
    """Runs one and two, one current; what each installs: ``{run: {kind: bytes, "id": run id}}``."""
    from tunecache.service.tuner.vllm_warmup import harvest_warm_state

    scratch = node_scratch(tmp_path, "/node/work/vllm-scratch/model", block_size=32)
    out = tmp_path / "harvest"
    out.mkdir()
    artifacts, summary = harvest_warm_state(scratch, out)
    shutil.rmtree(scratch)
    spec = lambda a: a.model_dump(mode="json", include={"kind", "name", "media_type"})  # noqa: E731
    warm = [(spec(a), (out / a.path).read_bytes()) for a in artifacts]
    document = json.loads(CUDNN_FILE.read_bytes())
    del document[[k for k in document if not k.startswith("_")][0]]
    fewer = json.dumps(document).encode()  # the same environment, one entry fewer
    jit = {"kind": "flashinfer_jit_module", "name": f"flashinfer-jit/{MODULE}.tar.gz", "media_type": "application/gzip"}
    first_ws, second_ws = fake_workspace(tmp_path / "node-one", MODULE), fake_workspace(tmp_path / "node-two", MODULE)
    (second_ws / "cached_ops" / MODULE / f"{MODULE}.so").write_bytes(b"\x7fELF run two")
    runs = {}
    for name, tactics, module, blobs in (
            ("one", fewer, module_tarball(first_ws, MODULE), warm),
            ("two", CUDNN_FILE.read_bytes(), module_tarball(second_ws, MODULE),
             [(s, _rewritten(b, _second)) for s, b in warm])):
        run_id = _push(server, signing_key, tactics, [(jit, module), *blobs], summary)
        runs[name] = {"id": run_id, "tactics": tactics, "jit": b"\x7fELF fake module" if name == "one" else b"\x7fELF run two",
                      "modelinfos": json.dumps({"hash": "h" if name == "one" else "h2", "modelinfo": {}}).encode(),
                      "triton": "HASHB" if name == "one" else "HASHC"}
    assert as_admin.post(f"{server}/v1/tunings/{runs['one']['id']}/promote").status_code == 200
    return runs


def pull_args(server, root: Path, model: str = MODEL) -> list[str]:
    return ["pull", "--server", server, "--model", model, "--max-num-batched-tokens", "8192",
            "--dest", str(root / "dest"), "--file-name", "tactics.json", "--environment", str(CUDNN_FILE),
            "--jit-workspace", str(root / "workspace"), "--warm-state", "--vllm-cache-root", str(root / "vllm"),
            "--triton-cache-dir", str(root / "triton")]


def run_pull(args: list[str], root: Path, kill_at: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNECACHE_STATE_DIR": str(root / "state")}
    if kill_at is None:
        return subprocess.run([shutil.which("tunecache"), *args], capture_output=True, text=True, timeout=120, env=env)
    script = root.parent / "killed.py"
    script.write_text(KILLED)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                          env={**env, "KILL_AT": str(kill_at)})


def kinds_on_disk(root: Path, runs: dict[str, dict]) -> dict[str, str]:
    """Which run each kind on disk is of: ``one``, ``two``, or ``neither``."""
    def which(kind: str, found: bytes | None) -> str:
        return next((name for name, of in runs.items() if of[kind] == found), "neither")

    read = lambda path: path.read_bytes() if path.is_file() else None  # noqa: E731
    compiled = root / "vllm" / "torch_compile_cache"
    artifacts = sorted(compiled.rglob(ARTIFACT))
    models = sorted(compiled.rglob("torch_aot_compile/*/rank_0_0/model"))
    compile_cache = {read(p) for p in artifacts} | {read(p).replace(b"aot model", b"inductor artifact") for p in models}
    return {
        "tactics": which("tactics", read(root / "dest" / "tactics.json")),
        "jit": which("jit", read(root / "workspace" / "cached_ops" / MODULE / f"{MODULE}.so")),
        "modelinfos": which("modelinfos", read(root / "vllm" / "modelinfos" / MODELINFO)),
        "triton": "two" if (root / "triton" / "HASHC").is_dir() else "one" if (root / "triton" / "HASHB").is_dir() else "neither",
        "compile cache": ("one" if compile_cache == {b"inductor artifact"} and len(artifacts) == len(models) == 1
                          else "two" if compile_cache == {b"inductor artifact (run two)"} and len(artifacts) == len(models) == 1
                          else f"neither: {sorted(compile_cache)}"),
    }


def leftovers(root: Path) -> list[str]:
    """What an install keeps for a roll back or stages, left behind."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*")
                  if ".old-" in p.name or p.name.startswith((".tunecache-", ".unpack-")))


def test_a_pull_killed_at_any_rename_leaves_one_runs_kinds_after_the_next_install(server, tmp_path, node_signing_key):
    runs = two_runs(server, tmp_path, node_signing_key)
    first = tmp_path / "first"
    pulled = run_pull(pull_args(server, first), first)
    assert pulled.returncode == 0, pulled.stderr
    assert set(kinds_on_disk(first, runs).values()) == {"one"}, kinds_on_disk(first, runs)
    assert as_admin.post(f"{server}/v1/tunings/{runs['two']['id']}/promote").status_code == 200
    failures = []
    for kill_at in range(1, 200):
        root = tmp_path / f"killed-{kill_at}"
        shutil.copytree(first, root, symlinks=True)
        killed = run_pull(pull_args(server, root), root, kill_at)
        if killed.returncode == 0:  # past the install's last rename: it finished
            assert set(kinds_on_disk(root, runs).values()) == {"two"}, kinds_on_disk(root, runs)
            break
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        # the next install, one that installs nothing (another model, a miss), first finishes or undoes the killed one's
        missed = run_pull(pull_args(server, root, model="another/model"), root)
        assert missed.returncode != 0, missed.stderr
        after_miss = kinds_on_disk(root, runs)
        if len(set(after_miss.values())) != 1 or "neither" in after_miss.values() or leftovers(root):
            failures.append(f"killed before rename {kill_at}, then a miss: {after_miss}, left {leftovers(root)}")
        again = run_pull(pull_args(server, root), root)
        assert again.returncode == 0, again.stderr
        after = kinds_on_disk(root, runs)
        if set(after.values()) != {"two"} or leftovers(root):
            failures.append(f"killed before rename {kill_at}, then installed again: {after}, left {leftovers(root)}")
        shutil.rmtree(root)
    else:
        raise AssertionError("the install never finished")
    assert kill_at > 5  # every kind's renames were killed before
    assert not failures, "\n".join(failures)


def test_a_newer_runs_compile_cache_and_model_inspections_replace_those_of_the_same_names(server, tmp_path,
                                                                                      node_signing_key):
    runs = two_runs(server, tmp_path, node_signing_key)
    root = tmp_path / "pod"
    assert run_pull(pull_args(server, root), root).returncode == 0
    assert as_admin.post(f"{server}/v1/tunings/{runs['two']['id']}/promote").status_code == 200
    pulled = run_pull(pull_args(server, root), root)
    assert pulled.returncode == 0, pulled.stderr
    assert "modelinfos (1 files), compile cache (2 of 2 directories)" in pulled.stderr, pulled.stderr
    assert kinds_on_disk(root, runs) == {kind: "two" for kind in ("tactics", "jit", "modelinfos", "triton", "compile cache")}
    assert leftovers(root) == []
