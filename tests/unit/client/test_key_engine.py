"""The key names its engine: ``TuningKey.engine`` (default ``vllm``), one of the contract's
:data:`ENGINE_NAMES`, which the engines registry names exactly; a key of the default engine
hashes, names its file and signs as keys did before they named an engine."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from tunecache import signing
from tunecache.client.install import default_file_name
from tunecache.contract import DEFAULT_ENGINE, ENGINE_NAMES, KEY_FIELDS, EnvironmentMetadata, RunSignature, TuningKey
from tunecache.engines import ENGINES, engine_for

KEY = dict(gpu_name="NVIDIA H200", arch="sm90", model="meta-llama/Llama-3.1-8B", max_num_batched_tokens=8192)
ENVIRONMENT = EnvironmentMetadata(flashinfer_version="0.7.4", cuda_version="12.9", cublas_version="120900",
                                  cudnn_version="91900", cudnn_frontend_version="1.14.0", cutlass_dsl_version="4.2.1",
                                  gpu="NVIDIA H200")
#: Made by the code before keys named their engine, for KEY, ENVIRONMENT, ARTIFACTS and a key
#: from the seed bytes 0..31, at 1780000000: a run signed then must verify now.
OLD_KEY_HASH = "ed636bcf7b24723777185cbf968f09cc748da36a825e14f93fdc6236fc156d34"
OLD_FILE_NAME = "meta-llama-Llama-3.1-8B_NVIDIA-H200_mnbt8192_tp1_54b8536b.json"
OLD_SIGNATURE = RunSignature(key_id="56475aa75463474c", manifest=2, signed_at=1780000000, expires_at=1787776000,
                             signature="mRe7wrIBQLFHaumDxZf2qQ4eqowiKi12JCSQKiOPB8cJAKYGINA5hp+blySPhzSV/ypLCfQAdJs5TR9vXSOCAg==")


class _Artifact:
    kind, name, sha256 = "flashinfer_autotune", "autotune.json", "ab" * 32


ARTIFACTS = [_Artifact()]
SIGNER = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def test_the_engine_is_a_key_field_defaulting_to_vllm():
    key = TuningKey(**KEY)
    assert key.engine == DEFAULT_ENGINE == "vllm" and KEY_FIELDS[-1] == "engine"
    assert TuningKey(**KEY, engine="vllm") == key


def test_an_engine_tunecache_has_no_adaptor_for_is_refused_by_name():
    with pytest.raises(ValidationError) as exc:
        TuningKey(**KEY, engine="sglang")
    assert exc.value.errors()[0]["loc"] == ("engine",) and "'vllm'" in exc.value.errors()[0]["msg"]


def test_the_engines_registry_names_exactly_the_contracts_engines():
    assert tuple(sorted(ENGINES)) == tuple(sorted(ENGINE_NAMES))
    for name in ENGINE_NAMES:
        assert engine_for(name).name == name


def test_a_vllm_key_hashes_and_names_its_file_as_before():
    key = TuningKey(**KEY)
    assert key.key_hash() == OLD_KEY_HASH
    assert "engine" not in key.identity()
    assert default_file_name(key) == OLD_FILE_NAME


def test_a_run_signed_before_keys_named_their_engine_still_verifies():
    trusted = {signing.key_id(SIGNER.public_key()): SIGNER.public_key()}
    signed_by = signing.verify_run(OLD_SIGNATURE, TuningKey(**KEY), ENVIRONMENT, ARTIFACTS, trusted,
                                   summary={"entries": 3}, now=1_780_000_100)
    assert signed_by == OLD_SIGNATURE.key_id
    fresh = signing.sign_run(SIGNER, TuningKey(**KEY), ENVIRONMENT, ARTIFACTS, summary={"entries": 3}, now=1_780_000_000)
    assert fresh == OLD_SIGNATURE


def test_another_engine_is_signed_and_hashed_by_name():
    """A key of another engine (built past the validator: the contract knows one engine so
    far) has ``engine`` in its identity, so a vLLM run's signature does not verify for it."""
    other = TuningKey.model_construct(**TuningKey(**KEY).model_dump() | {"engine": "another"})
    assert other.identity()["engine"] == "another"
    assert other.key_hash() != OLD_KEY_HASH and default_file_name(other) != OLD_FILE_NAME
    trusted = {signing.key_id(SIGNER.public_key()): SIGNER.public_key()}
    with pytest.raises(signing.UntrustedRun, match="does not match"):
        signing.verify_run(OLD_SIGNATURE, other, ENVIRONMENT, ARTIFACTS, trusted, summary={"entries": 3},
                           now=1_780_000_100)
