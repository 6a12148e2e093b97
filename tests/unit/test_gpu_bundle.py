"""The GPU machine's bundle (scripts/gpu_vllm_bundle.sh) pins every distribution that
tunecache's two distributions depend on, so that ``tunecache serve`` and the plugin start from
it: a dependency added to a pyproject.toml and not to the bundle failed only on the GPU
machine (``fastapi-offline``, once the offline API docs landed)."""

from __future__ import annotations

import re
import tomllib

from tests.support.paths import ROOT

#: Dependencies the bundle leaves out on purpose, each said in the script itself.
LEFT_OUT = {"boto3", "tunecache-client"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bundle_pins() -> dict[str, str]:
    text = (ROOT / "scripts" / "gpu_vllm_bundle.sh").read_text()
    block = text[text.index("pins=(") + len("pins=("):text.index("\n)\n", text.index("pins=("))]
    pins = {}
    for line in block.splitlines():
        for spec in line.split("#")[0].split():
            name, _, version = spec.partition("==")
            pins[canonical(name)] = version
    return pins


def dependencies(pyproject) -> set[str]:
    doc = tomllib.loads(pyproject.read_text())
    return {canonical(re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0]) for spec in doc["project"]["dependencies"]}


def test_every_dependency_of_both_distributions_is_pinned_in_the_bundle():
    pins = bundle_pins()
    assert len(pins) > 50 and all(pins.values()), pins  # the parse found the list, each with a version
    needed = dependencies(ROOT / "pyproject.toml") | dependencies(ROOT / "client" / "pyproject.toml")
    assert "fastapi-offline" in needed
    assert sorted(needed - set(pins) - LEFT_OUT) == []


def test_what_the_bundle_leaves_out_is_said_in_the_script():
    text = (ROOT / "scripts" / "gpu_vllm_bundle.sh").read_text()
    assert "boto3 (the S3 artifact store) is imported only when" in text
