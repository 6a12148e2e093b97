"""A recorded vLLM warmup's verification boot: does the stored run boot a new engine clean?

After ``tune --warmup vllm`` recorded its run, the node boots
vLLM once more, in a new process, as a fresh pod would: the same engine arguments as the
tuner's engine (:func:`tunecache.service.tuner.vllm_warmup.vllm_command`), every vLLM cache
empty (``VLLM_CACHE_ROOT``, ``TRITON_CACHE_DIR``, ``DG_JIT_CACHE_DIR``,
``TORCHINDUCTOR_CACHE_DIR``, the autotune directory; the node's FlashInfer workspace is
its own, as the run's JIT modules are valid only at its path), and ``TUNECACHE_URL`` set
to the service that stored the run, so that vLLM's tunecache plugin fetches the run
(checking its signature against the node's own key when the run is signed) and installs
it before vLLM reads anything. The pod program :mod:`tunecache.client.verify_boot` boots
the engine and writes what it still compiled; :func:`verify_run` returns that as a
:class:`tunecache.contract.RunVerification`, which the caller stores with the run
(``PUT /v1/tunings/{id}/verification``). A run that does not boot clean says so there.

The boot runs under the same guards as the tuner (:mod:`tunecache.service.tuner.guard`):
the GPU's lock for its whole life, and death with the process that started it. It starts
this module as a launcher (``python -m tunecache.service.tuner.verification``) that takes
both and runs the pod program in its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tunecache.contract import RunVerification, compiled_summary
from tunecache.service.tuner.guard import PARENT_PID_VARIABLE, die_with_parent, hold_gpu_lock
from tunecache.service.tuner.stages import TuneSpec
from tunecache.service.tuner.vllm_warmup import vllm_command

#: The pod program the launcher runs (a module of tunecache-client; never imported here).
POD_PROGRAM = "tunecache.client.verify_boot"
#: Lines of the boot's log kept in an error.
LOG_TAIL_LINES = 20


def verification_command(spec: TuneSpec, scratch: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The launcher's command line and the environment the boot adds: the tuner's engine
    arguments (in ``scratch/engine-args.json``) and empty caches under ``scratch``."""
    command, env = vllm_command(spec, scratch, python)
    args = scratch / "engine-args.json"
    args.write_text(command[3])
    env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
           # the pod's key as the run's: the plugin reads these for the key's dtype and quantization
           "TUNECACHE_DTYPE": spec.deployment.dtype, "TUNECACHE_QUANTIZATION": spec.deployment.quantization}
    return [python, "-m", __name__, str(args), str(scratch / "verification.json"), str(scratch / "verification.log")], env


def verify_run(spec: TuneSpec, server_url: str, scratch: Path, timeout_s: float, *, trusted_keys: str | None = None,
               python: str = sys.executable) -> RunVerification:
    """Boot the run stored on ``server_url`` for ``spec``'s key in a new vLLM process
    (module docstring) and return what that boot still compiled, or why it did not boot
    (within ``timeout_s`` seconds; its log is ``scratch/verification.log``). The boot trusts
    ``trusted_keys`` alone (``TUNECACHE_TRUSTED_KEYS``; ``None``: no key) and reads the
    server with this process's own token settings. Never raises for the boot's own
    failures: they are the verification's finding."""
    scratch.mkdir(parents=True, exist_ok=True)
    command, env = verification_command(spec, scratch, python)
    env = {**os.environ, **env, PARENT_PID_VARIABLE: str(os.getpid()), "TUNECACHE_URL": server_url,
           "TUNECACHE_REPORT": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("TUNECACHE_TRUSTED_KEYS", None)
    if trusted_keys:
        env["TUNECACHE_TRUSTED_KEYS"] = trusted_keys
    launcher = subprocess.Popen(command, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = launcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        return RunVerification(error=f"the verification boot did not finish within {timeout_s:g} s")
    result = scratch / "verification.json"
    if code == 0 and result.is_file():
        return RunVerification.model_validate_json(result.read_text())
    log = scratch / "verification.log"
    tail = log.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:] if log.is_file() else []
    return RunVerification(error=f"the verification boot exited with status {code}: " + " | ".join(tail)[-1500:])


def main(argv: list[str]) -> int:
    """The launcher: die with the caller, hold the GPU, run the pod program (its output in argv[2])."""
    args, result, log = argv
    die_with_parent()
    gpu_lock = hold_gpu_lock()  # noqa: F841 - held open until this process exits
    with open(log, "wb") as out:
        return subprocess.run([sys.executable, "-m", POD_PROGRAM, args, result], stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode


def shown(verification: RunVerification) -> str:
    """One line for ``tune``'s output and a job's log: what the verification boot found."""
    if verification.error:
        return f"verification boot failed: {verification.error}"
    ready = f" in {verification.ready_s:.1f} s" if verification.ready_s is not None else ""
    return (f"verification boot: compiled nothing, ready{ready}" if verification.clean else
            f"verification boot still compiled {compiled_summary(verification.compiled)} (ready{ready}): "
            "the run does not boot clean")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
