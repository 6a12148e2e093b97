"""torch's own AOT compile on the CPU (what vLLM 0.33/0.34's mega artifact is made with:
``torch.compile(...).aot_compile``, ``save_compiled_function``, ``torch.compiler.load_compiled_function``):
an artifact saved under one HOME, Inductor cache and package prefix loads under another, and what
torch's ``SystemInfo.check_compatibility`` refuses (another torch version in the saved system
info) is what :func:`tunecache.engines.vllm.aot.system_differences` names before the boot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

MODULE = "def forward(x):\n    import torch\n    return torch.sin(x) * 2 + 1\n"

SAVE = textwrap.dedent('''
    import dataclasses, json, sys, torch
    from torch._dynamo.package import SystemInfo
    if len(sys.argv) > 2:  # the saving torch says it is another version
        torch.__version__ = sys.argv[2]
    import aot_model
    compiled = torch.compile(aot_model.forward, fullgraph=True).aot_compile(((torch.randn(4),), {}))
    compiled.save_compiled_function(sys.argv[1])
    print(json.dumps(dataclasses.asdict(SystemInfo.current())))
''')

LOAD = textwrap.dedent('''
    import dataclasses, json, sys, torch
    from torch._dynamo.package import SystemInfo
    import aot_model
    try:
        with open(sys.argv[1], "rb") as f:
            loaded = torch.compiler.load_compiled_function(f, f_globals=aot_model.forward.__globals__)
        print(json.dumps({"result": loaded(torch.ones(4)).tolist(), "system": dataclasses.asdict(SystemInfo.current())}))
    except Exception as exc:
        print(json.dumps({"refused": str(exc), "system": dataclasses.asdict(SystemInfo.current())}))
''')


def _run(tmp_path, side, script, *args, inductor_of=None):
    """Run ``script`` as ``side`` (its own HOME, package prefix and caches; ``inductor_of``: another
    side's Inductor cache, so that a second save of the same function compiles nothing)."""
    prefix = tmp_path / side / "site-packages"
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "aot_model.py").write_text(MODULE)
    (tmp_path / f"{side}.py").write_text(script)
    env = {**os.environ, "HOME": str(tmp_path / side / "home"), "PYTHONPATH": str(prefix),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / (inductor_of or side) / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / side / "triton")}
    done = subprocess.run([sys.executable, str(tmp_path / f"{side}.py"), *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_aot_artifact_loads_under_another_home_and_prefix_and_torchs_system_check_is_named(tmp_path):
    from tunecache.engines.vllm.aot import system_differences

    artifact = tmp_path / "model"
    _run(tmp_path, "node", SAVE, str(artifact))
    (tmp_path / "pod-copy").mkdir()
    moved = tmp_path / "pod-copy" / "model"
    moved.write_bytes(artifact.read_bytes())
    loaded = _run(tmp_path, "pod", LOAD, str(moved))
    assert "result" in loaded and all(abs(v - (2 * 0.8414709848078965 + 1)) < 1e-5 for v in loaded["result"]), loaded

    node = _run(tmp_path, "node2", SAVE, str(artifact), "2.99.0+other", inductor_of="node")
    refused = _run(tmp_path, "pod2", LOAD, str(artifact), inductor_of="pod")  # the pod's kernels compiled already
    # torch's message names the loading torch's version (current.check_compatibility(saved)); tunecache names both
    assert refused["refused"].startswith("Compile package was created with a different PyTorch version: ")
    assert system_differences(node, refused["system"], on_gpu=False) == [
        f"torch: tuner \"2.99.0+other\", pod \"{refused['system']['torch_version']}\""]
