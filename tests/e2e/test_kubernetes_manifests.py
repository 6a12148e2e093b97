"""The Kubernetes manifests in deploy/kubernetes/ (docs/kubernetes.md, "The manifests").

Each object is valid against the Kubernetes JSON schemas of :data:`KUBERNETES_VERSION`
(``kubernetes-validate``, which ships them: no network), strictly (an unknown field fails);
every kustomization lists every manifest of its directory and nothing else; every
``TUNECACHE_*`` variable they name is a setting of the side that reads it (the server's
``tunecache.service.settings``, the pods' ``tunecache.client.settings``), named only in a
comment where it is not one yet; every ``tunecache`` command line uses options the command has;
the probes ask the service's health route on its port; and the nginx configuration passes
``nginx -t`` where nginx is installed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
import yaml

from tests.support.images import documented_builds, dockerfile_args, dockerfile_targets
from tests.support.paths import ROOT
from tunecache import cli
from tunecache.client.settings import ClientSettings
from tunecache.service.cli import register
from tunecache.service.routes.health import router as health_router
from tunecache.service.settings import NODE_VARIABLES, RENAMED_VARIABLES, Settings
from tunecache.service.tuner.vllm_warmup import ENGINE_ARGS_VARIABLE

MANIFESTS = ROOT / "deploy" / "kubernetes"
#: The Kubernetes release the manifests are checked against (schemas bundled by kubernetes-validate).
KUBERNETES_VERSION = "1.33.0"
#: Named in the manifests' comments only, as optional and not yet a setting of this version.
NOT_YET_SETTINGS = {"TUNECACHE_ARTIFACT_STORE"}
SERVER_VARIABLES = {f"TUNECACHE_{name.upper()}" for name in Settings.model_fields} | set(RENAMED_VARIABLES.values())
CLIENT_VARIABLES = {f"TUNECACHE_{name.upper()}" for name in ClientSettings.model_fields}
#: Read by the tuner from its own environment (not a service setting; declared beside the settings).
TUNER_VARIABLES = set(NODE_VARIABLES)
IMAGE = "tunecache:latest"  # docker-compose.yml's name for the Dockerfile's image (the server replicas)
TUNER_IMAGE = "tunecache-tuner:v0.33.0"  # the Dockerfile on the fleet's vLLM image (the example pods' release)


def _files(directory: Path = MANIFESTS) -> list[Path]:
    return sorted(path for path in directory.rglob("*.yaml") if path.name != "kustomization.yaml")


def _objects() -> list[tuple[Path, dict]]:
    return [(path, document) for path in _files() for document in yaml.safe_load_all(path.read_text()) if document]


def _containers(obj: dict) -> list[tuple[str, dict]]:
    """``(kind, container)`` of each container and init container of a workload."""
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
    if not pod:
        return []
    return [(kind, c) for kind in ("initContainers", "containers") for c in pod.get(kind, [])]


def _command_line(container: dict) -> str:
    return " ".join([*container.get("command", []), *container.get("args", [])])


def test_the_manifests_are_there():
    names = {path.relative_to(MANIFESTS).as_posix() for path in _files()}
    assert names == {"secrets.yaml", "server.yaml", "tuner.yaml", "nginx-cache.yaml", "examples/vllm-pod.yaml"}
    kinds = {(obj["kind"], obj["metadata"]["name"]) for _, obj in _objects()}
    assert {("Deployment", "tunecache"), ("Service", "tunecache"), ("PodDisruptionBudget", "tunecache"),
            ("StatefulSet", "tunecache-tuner"), ("ConfigMap", "tunecache-nginx-cache"), ("Deployment", "tunecache-cache"),
            ("Secret", "tunecache-database"), ("Secret", "tunecache-node"), ("Secret", "tunecache-trust"),
            ("Secret", "tunecache-tokens"), ("Deployment", "vllm-qwen3")} <= kinds


def test_every_object_is_valid_for_the_pinned_kubernetes_version():
    import kubernetes_validate

    failures = []
    for path, obj in _objects():
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{path.name} {obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert not failures, "\n".join(failures)


def test_a_broken_manifest_is_caught():
    """The schemas are really applied: an unknown field and a wrong type fail."""
    import kubernetes_validate

    (_, service), = [(p, o) for p, o in _objects() if (o["kind"], o["metadata"]["name"]) == ("Service", "tunecache")]
    for broken in ({**service, "spec": {**service["spec"], "portz": []}},
                   {**service, "spec": {**service["spec"], "ports": [{"port": "eighty"}]}}):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("directory", [MANIFESTS, MANIFESTS / "examples"], ids=["service", "examples"])
def test_each_kustomization_lists_every_manifest_of_its_directory(directory):
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(path.name for path in directory.glob("*.yaml") if path.name != "kustomization.yaml")


def test_kustomize_builds_them_where_kubectl_is_installed():
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl here (the schema and listing checks above still ran)")
    for directory, count in ((MANIFESTS, 12), (MANIFESTS / "examples", 2)):
        built = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr
        assert len([d for d in yaml.safe_load_all(built.stdout) if d]) == count


def test_every_tunecache_variable_is_a_setting_of_the_side_that_reads_it():
    failures = []
    for path, obj in _objects():
        for kind, container in _containers(obj):
            line = _command_line(container)
            serves = "tunecache serve" in line or "tunecache db upgrade" in line
            known = SERVER_VARIABLES | TUNER_VARIABLES if serves else CLIENT_VARIABLES
            for env in container.get("env", []):
                if env["name"].startswith("TUNECACHE_") and env["name"] not in known:
                    failures.append(f"{path.name} {obj['metadata']['name']}/{container['name']}: {env['name']} is no "
                                    f"{'server' if serves else 'client'} setting")
    # and anywhere in the text, comments too: a setting of either side, or named as not yet one
    for path in _files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in re.findall(r"TUNECACHE_[A-Z0-9_]+", line):
                if name in NOT_YET_SETTINGS:
                    if not line.lstrip().startswith("#"):
                        failures.append(f"{path.name}:{number}: {name} is not a setting yet: in a comment only")
                elif name not in SERVER_VARIABLES | CLIENT_VARIABLES | TUNER_VARIABLES:
                    failures.append(f"{path.name}:{number}: {name} is no setting")
    assert not failures, "\n".join(failures)


def _options(command) -> set[str]:
    return {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}


def test_every_tunecache_command_line_uses_options_the_command_has():
    server = typer.Typer()
    register(server)
    commands = {**typer.main.get_command(cli.app).commands, **typer.main.get_command(server).commands}
    seen = []
    for path, obj in _objects():
        for _, container in _containers(obj):
            words = shlex.split(_command_line(container).replace("$", ""))
            for start in [i for i, word in enumerate(words) if word == "tunecache"]:
                rest = words[start + 1:]
                command = commands[rest[0]]
                rest = rest[1:]
                if hasattr(command, "commands"):  # a group: tunecache db upgrade
                    command, rest = command.commands[rest[0]], rest[1:]
                used = [word.split("=")[0] for word in rest[:next((i for i, w in enumerate(rest) if w in ("||", "&&", ";")),
                                                                   len(rest))] if word.startswith("-")]
                unknown = set(used) - _options(command)
                assert not unknown, f"{path.name}: tunecache {command.name} has no {sorted(unknown)}"
                seen.append((command.name, tuple(used)))
    assert ("pull", ("--server", "--model", "--max-num-batched-tokens", "--tensor-parallel-size", "--layout",
                     "--vllm-config-hash", "--environment", "--dest")) in seen
    assert {name for name, _ in seen} == {"pull", "serve", "upgrade"}


def test_the_service_pods_probe_its_health_route_on_its_port():
    (health,) = [route.path for route in health_router.routes]
    assert f"/v1{health}" == "/v1/health"
    checked = 0
    for path, obj in _objects():
        for kind, container in _containers(obj):
            if container.get("image") not in (IMAGE, TUNER_IMAGE) or kind == "initContainers":
                continue
            assert "tunecache serve" in _command_line(container)
            ports = {port["name"]: port["containerPort"] for port in container["ports"]}
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert ports["http"] == int(env["TUNECACHE_PORT"]) == Settings().port
            assert env["TUNECACHE_HOST"] == "0.0.0.0"
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"] == {"path": "/v1/health", "port": "http"}, (path.name, probe)
            assert "TUNECACHE_DATABASE_URL" in env and container["resources"]["requests"]
            checked += 1
    assert checked == 2  # the server replicas and the tuner


def test_the_service_pods_get_no_service_links_and_the_tuner_its_gpu():
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for _, obj in _objects()}
    for key in (("Deployment", "tunecache"), ("StatefulSet", "tunecache-tuner")):
        # a Service called tunecache would set TUNECACHE_PORT=tcp://..., which serve refuses
        assert objects[key]["spec"]["template"]["spec"]["enableServiceLinks"] is False
    assert objects[("Deployment", "tunecache")]["spec"]["replicas"] == 2
    (tuner,) = objects[("StatefulSet", "tunecache-tuner")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in tuner["env"]}
    assert tuner["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env["TUNECACHE_JOB_WORKER"] == "on" and env["TUNECACHE_SIGNING_KEY"].startswith("/secrets/node/")
    (server,) = objects[("Deployment", "tunecache")]["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in server["env"]}["TUNECACHE_JOB_WORKER"] == "off"
    assert objects[("PodDisruptionBudget", "tunecache")]["spec"]["minAvailable"] == 1


def test_the_nginx_configuration_passes_nginx_t(tmp_path):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("no nginx here")
    (config_map,) = [o for _, o in _objects() if (o["kind"], o["metadata"]["name"]) == ("ConfigMap", "tunecache-nginx-cache")]
    conf = config_map["data"]["default.conf"]
    assert "proxy_cache artifacts" in conf and "server tunecache:8321" in conf
    # nginx -t resolves the upstream's name: the Service's name exists only in the cluster
    local = conf.replace("server tunecache:8321", "server 127.0.0.1:8321").replace(
        "/var/cache/nginx/tunecache", str(tmp_path / "cache")).replace("listen 80;", "listen 127.0.0.1:18080;")
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{ access_log off; client_body_temp_path {tmp_path}/body; proxy_temp_path {tmp_path}/proxy;\n{local}\n}}\n")
    checked = subprocess.run([nginx, "-t", "-q", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_the_tuner_runs_the_fleets_vllm_image_with_the_pods_engine_arguments():
    """The tuning node's image is the Dockerfile on the fleet's vLLM image (not the server
    replicas' image without vLLM), and it is given the pods' engine arguments."""
    [(_, tuner)] = [(path, obj) for path, obj in _objects() if obj["metadata"]["name"] == "tunecache-tuner"
                    and obj["kind"] == "StatefulSet"]
    [(_, container)] = _containers(tuner)
    assert container["image"] == TUNER_IMAGE
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert isinstance(json.loads(env[ENGINE_ARGS_VARIABLE]), dict)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=vllm/vllm-openai:" in dockerfile and "ENTRYPOINT []" in dockerfile
    assert '".${TUNER_EXTRA}"' in dockerfile  # no FlashInfer pin over the vLLM image's own


def _release(image: str) -> str:
    """The vLLM release an image's tag names (``tunecache-tuner:v0.33.0``: ``0.33.0``)."""
    match = re.fullmatch(r"[^:]+:v?(\d+\.\d+\.\d+)", image)
    assert match, f"{image}: its tag names no vLLM release"
    return match[1]


def test_the_tuner_and_the_example_pods_run_one_vllm_release():
    """What a tuning carries loads only in the vLLM, FlashInfer, torch and Triton it was made
    with: the tuner's image and the example vLLM pod's name one release (they were 0.25 and
    0.33: every tactic file would have been refused on FlashInfer's version), and so does
    docs/kubernetes.md; the init container's ``--dest`` is that release's FlashInfer directory."""
    images = {(obj["metadata"]["name"], c["name"]): c["image"] for _, obj in _objects() for _, c in _containers(obj)}
    tuner, pod = images[("tunecache-tuner", "tunecache")], images[("vllm-qwen3", "vllm")]
    assert _release(tuner) == _release(pod), (tuner, pod)
    documented = re.findall(r"[\w./-]*(?:vllm-with-tunecache|tunecache-tuner):v?\d+\.\d+\.\d+",
                            (ROOT / "docs" / "kubernetes.md").read_text())
    assert documented and {_release(image) for image in documented} == {_release(pod)}, documented
    [(_, example)] = [(p, obj) for p, obj in _objects() if obj["metadata"]["name"] == "vllm-qwen3"]
    [init] = [c for kind, c in _containers(example) if kind == "initContainers"]
    dest = re.search(r"--dest (\S+)", _command_line(init))[1]
    assert dest.split("/")[-2] == VLLM_FLASHINFER[_release(pod)], dest


#: The FlashInfer each vLLM release pins (``flashinfer-python==`` in its wheel's METADATA).
VLLM_FLASHINFER = {"0.25.0": "0.6.13", "0.33.0": "0.7.2.post1", "0.34.0": "0.7.3"}


def test_the_flashinfer_pins_are_the_wheels_own():
    """:data:`VLLM_FLASHINFER` as each release's wheel says it, where the wheels are kept."""
    import zipfile

    from tests.support.vllm_wheels import wheel_files, wheels_dir

    wheels = wheels_dir()
    checked = 0
    for release, flashinfer in VLLM_FLASHINFER.items():
        for wheel in wheel_files(wheels, release):
            with zipfile.ZipFile(wheel) as archive:
                metadata = archive.read(f"vllm-{release}.dist-info/METADATA").decode()
            assert f"Requires-Dist: flashinfer-python=={flashinfer}" in metadata.splitlines(), wheel
            checked += 1
    if not checked:
        pytest.skip(f"no vLLM wheel in {wheels} (TUNECACHE_VLLM_WHEELS)")


def test_the_images_the_guide_builds_are_the_dockerfiles_targets_and_the_manifests_name_only_those():
    """Two images, each a target of the Dockerfile, built by the guide's commands: the server
    on a slim Python image (no vLLM on the CPU-only replicas), the tuner on the fleet's vLLM
    image of the example pods' release; each manifest names the one built for it."""
    targets = dockerfile_targets()
    assert set(targets) == {"server", "tuner"}, targets
    assert re.fullmatch(r"python:3\.\d+-slim", targets["server"]), targets["server"]
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", targets["tuner"]), targets["tuner"]
    built = {build.target: build for build in documented_builds()}
    assert set(built) == {"server", "tuner"}, built  # no build without a target (it would be the last one's)
    assert {target: build.tag for target, build in built.items()} == {"server": IMAGE, "tuner": TUNER_IMAGE}
    assert built["server"].args == {}
    # the tuner is built on the vLLM release its name says, the Dockerfile's default one
    assert built["tuner"].args == {"BASE_IMAGE": targets["tuner"]}
    assert _release(targets["tuner"]) == _release(TUNER_IMAGE)
    assert dockerfile_args()["BASE_IMAGE"] == targets["tuner"]
    named = {}
    for path, obj in _objects():
        for _, container in _containers(obj):
            named.setdefault(container["image"], set()).add(path.relative_to(MANIFESTS).as_posix())
    ours = {image: files for image, files in named.items() if "tunecache" in image.split(":")[0].split("/")[-1]
            and "vllm" not in image}
    assert ours == {IMAGE: {"server.yaml", "examples/vllm-pod.yaml"}, TUNER_IMAGE: {"tuner.yaml"}}, named
