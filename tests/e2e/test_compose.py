"""docker-compose.yml: the structure the deployment relies on, and the compose tool's own validation."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from tests.support.images import dockerfile_targets, documented_builds, resolved
from tests.support.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (v1), whichever works here."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_structure():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert set(services) == {"postgres", "tunecache", "seaweedfs"}
    # the object store is optional: only with --profile object-store, and unset means the database
    assert services["seaweedfs"]["profiles"] == ["object-store"]
    assert services["tunecache"]["environment"]["TUNECACHE_ARTIFACT_STORE"] == "${TUNECACHE_ARTIFACT_STORE:-}"
    service = services["tunecache"]
    assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert service["environment"]["TUNECACHE_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "tunecache db upgrade" in " ".join(service["command"])
    for name in ("postgres", "tunecache"):
        assert services[name]["healthcheck"]["test"]
    assert {"pgdata", "tunecache-data", "seaweedfs-data"} <= set(doc["volumes"])


def test_compose_config_validates_offline():
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed (.ci/run installs docker-compose)")
    result = subprocess.run([*command, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    assert rendered["services"]["tunecache"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_compose_builds_the_tuner_target_under_the_name_the_guide_gives_it():
    """The compose file's service is the GPU node's tuner: the Dockerfile's ``tuner`` target on
    the vLLM image its name's release says, named as docs/kubernetes.md builds it (and as
    deploy/kubernetes/tuner.yaml runs it), with its variable at its default and set."""
    service = yaml.safe_load(COMPOSE.read_text())["services"]["tunecache"]
    assert service["build"]["target"] == "tuner" and "tuner" in dockerfile_targets()
    [tuner] = [build for build in documented_builds() if build.target == "tuner"]
    assert resolved(service["image"], {}) == tuner.tag
    assert resolved(service["build"]["args"]["BASE_IMAGE"], {}) == tuner.args["BASE_IMAGE"] == dockerfile_targets()["tuner"]
    upgraded = {"VLLM_RELEASE": "v0.34.0"}  # one variable moves the base and the name together
    assert resolved(service["image"], upgraded) == "tunecache-tuner:v0.34.0"
    assert resolved(service["build"]["args"]["BASE_IMAGE"], upgraded) == "vllm/vllm-openai:v0.34.0"
