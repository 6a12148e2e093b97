"""A verification boot: one vLLM engine booted as a pod boots, and what it still compiled.

    python -m tunecache.client.verify_boot ENGINE_ARGS.json RESULT.json

A tuning node runs this after it recorded a vLLM warmup
(:mod:`tunecache.service.tuner.verification`), in a new process whose vLLM caches are all
empty and with ``TUNECACHE_URL`` set to the service: vLLM loads the tunecache plugin, which
fetches the stored run and installs it before vLLM reads anything, exactly as on a pod.
The engine runs in this process (the caller sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so
its worker's counters are this process's; once ``vllm.LLM(**args)`` returned, the boot's
attestation (:func:`tunecache.client.attestation.this_boot`) is written to RESULT.json as a
:class:`tunecache.contract.RunVerification`. Pod code run as a program: the service starts
it and reads its file, and never imports it.

Exit status 0 when RESULT.json was written (also for a boot that failed: its ``error``
says why); 2 for bad arguments.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path

from tunecache.contract import RunVerification


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tunecache.client.verify_boot ENGINE_ARGS.json RESULT.json", file=sys.stderr)
        return 2
    args, result = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    # the plugin's lines in the boot's log (vLLM gives its own logger a handler and stops
    # it there, so nothing is said twice)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from tunecache.client.attestation import mark_boot_started, this_boot

    mark_boot_started()
    started = time.monotonic()
    try:
        from vllm import LLM

        llm = LLM(**args)
        ready = time.monotonic() - started
        verification = RunVerification(compiled=this_boot(), ready_s=round(ready, 2))
        del llm
    except Exception as exc:  # the boot itself failed: that is the verification's finding
        traceback.print_exc()
        verification = RunVerification(error=f"{type(exc).__name__}: {exc}"[:2000])
    result.write_text(verification.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
