"""Signed tuning runs (tunecache.signing): real Ed25519 keys, real signatures, no mocks."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tunecache.contract import (
    ArtifactCreate,
    ArtifactKind,
    ArtifactRead,
    EnvironmentMetadata,
    TuningKey,
    TuningRunCreate,
)
from tunecache.signing import (
    MANIFEST_FORMAT,
    RunSignature,
    SigningError,
    UntrustedRun,
    canonical_manifest,
    format_public_key,
    generate_signing_key,
    key_id,
    load_signing_key,
    load_trusted_keys,
    parse_public_key,
    sign_run,
    verify_run,
)
from tunecache.store import TunecacheError

KEY = TuningKey(gpu_name="NVIDIA H200", arch="sm90", model="meta-llama/Llama-3.1-8B", max_num_batched_tokens=8192)
ENVIRONMENT = EnvironmentMetadata(
    flashinfer_version="0.7.4",
    cuda_version="12.9",
    cublas_version="12.9.1.4",
    cudnn_version="91900",
    cudnn_frontend_version="1.14.0",
    cutlass_dsl_version="4.2.1",
    gpu="NVIDIA H200",
)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


ARTIFACTS = [
    ArtifactCreate(kind=ArtifactKind.FLASHINFER_AUTOTUNE, name="autotune.json", media_type="application/json",
                   sha256=_sha("tactics")),
    ArtifactCreate(kind=ArtifactKind.FLASHINFER_JIT_MODULE, name="flashinfer-jit/batch_prefill.tar.gz",
                   media_type="application/gzip", sha256=_sha("module")),
    ArtifactCreate(kind=ArtifactKind.DEEP_GEMM_JIT_CACHE, name="deep_gemm.tar.gz", media_type="application/gzip",
                   sha256=_sha("deep gemm")),
]


def _trust(*keys: Ed25519PrivateKey) -> dict[str, Ed25519PublicKey]:
    return {key_id(k.public_key()): k.public_key() for k in keys}


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert message and "\n" not in message, message
    return message


# ------------------------------------------------------------------------------- keys


def test_generate_writes_a_0600_private_key_and_a_one_line_public_key(tmp_path):
    files = generate_signing_key(tmp_path / "node")

    assert files.private_path == tmp_path / "node" / "signing.key"
    assert stat.S_IMODE(files.private_path.stat().st_mode) == 0o600
    assert files.private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, unencrypted
    public_text = files.public_path.read_text()
    assert re.fullmatch(r"ed25519:[A-Za-z0-9+/]{43}=\n", public_text), public_text

    private_key = load_signing_key(files.private_path)
    raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert public_text.strip() == "ed25519:" + base64.b64encode(raw).decode() == format_public_key(private_key.public_key())
    assert files.key_id == hashlib.sha256(raw).hexdigest()[:16] == key_id(parse_public_key(public_text))


def test_generate_never_overwrites_a_key(tmp_path):
    first = generate_signing_key(tmp_path)
    before = (first.private_path.read_bytes(), first.public_path.read_bytes())
    with pytest.raises(SigningError, match="already exists") as exc:
        generate_signing_key(tmp_path)
    assert "signing.key" in _one_line(exc)
    assert (first.private_path.read_bytes(), first.public_path.read_bytes()) == before

    # A stray signing.pub alone is refused too, and no private key is left behind.
    other = tmp_path / "other"
    other.mkdir()
    (other / "signing.pub").write_text("ed25519:old\n")
    with pytest.raises(SigningError, match="signing.pub already exists"):
        generate_signing_key(other)
    assert not (other / "signing.key").exists()
    assert (other / "signing.pub").read_text() == "ed25519:old\n"


def test_generate_into_a_path_that_is_a_file_is_a_signing_error(tmp_path):
    (tmp_path / "taken").write_text("x")
    with pytest.raises(SigningError, match="cannot make the key directory") as exc:
        generate_signing_key(tmp_path / "taken")
    _one_line(exc)


def test_two_generated_keys_differ(tmp_path):
    assert generate_signing_key(tmp_path / "a").key_id != generate_signing_key(tmp_path / "b").key_id


def test_load_signing_key_gives_one_line_errors(tmp_path):
    with pytest.raises(SigningError, match="does not exist") as exc:
        load_signing_key(tmp_path / "missing.key")
    _one_line(exc)

    with pytest.raises(SigningError, match="cannot read signing key") as exc:
        load_signing_key(tmp_path)  # a directory: unreadable as a file, even as root
    _one_line(exc)

    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key\n")
    with pytest.raises(SigningError, match="not a PEM private key") as exc:
        load_signing_key(garbage)
    _one_line(exc)

    ec_key = tmp_path / "ec.key"
    ec_key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(SigningError, match="not an Ed25519 key") as exc:
        load_signing_key(ec_key)
    _one_line(exc)

    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    with pytest.raises(SigningError, match="encrypted") as exc:
        load_signing_key(encrypted)
    _one_line(exc)


def test_signing_errors_are_tunecache_errors():
    assert issubclass(UntrustedRun, SigningError) and issubclass(SigningError, TunecacheError)


# ---------------------------------------------------------------------- sign, verify


def test_sign_and_verify_round_trip(tmp_path):
    files = generate_signing_key(tmp_path)
    node = load_signing_key(files.private_path)
    signature = sign_run(node, KEY, ENVIRONMENT, ARTIFACTS)

    assert signature.key_id == files.key_id
    assert len(base64.b64decode(signature.signature, validate=True)) == 64
    trusted = load_trusted_keys(str(files.public_path))
    assert verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, trusted) == files.key_id


def test_a_signed_run_survives_the_wire_and_verifies_against_the_artifacts_a_pod_reads():
    node = Ed25519PrivateKey.generate()
    run = TuningRunCreate(key=KEY, environment=ENVIRONMENT, artifacts=ARTIFACTS, summary={"entries": 3},
                          signature=sign_run(node, KEY, ENVIRONMENT, ARTIFACTS))
    received = TuningRunCreate.model_validate_json(run.model_dump_json())
    assert received.signature == run.signature
    # What a pod gets back: kinds as text, other order, extra fields (size, download path).
    read = [ArtifactRead(kind=a.kind.value, name=a.name, media_type=a.media_type, sha256=a.sha256, size_bytes=1,
                         download_path=f"/v1/artifacts/{a.sha256}") for a in reversed(received.artifacts)]
    assert verify_run(received.signature, KEY, ENVIRONMENT, read, _trust(node)) == key_id(node.public_key())


def test_a_run_signed_by_a_key_that_is_not_trusted_is_refused():
    node, attacker = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    signature = sign_run(attacker, KEY, ENVIRONMENT, ARTIFACTS)
    with pytest.raises(UntrustedRun) as exc:
        verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node))
    assert _one_line(exc) == f"signed by key {key_id(attacker.public_key())}, which is not among the 1 trusted key"


def test_a_trusted_key_id_on_another_keys_signature_does_not_match():
    """The attacker labels their signature with the node's key id."""
    node, attacker = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    forged = sign_run(attacker, KEY, ENVIRONMENT, ARTIFACTS).model_copy(update={"key_id": key_id(node.public_key())})
    with pytest.raises(UntrustedRun, match="does not match the run's manifest"):
        verify_run(forged, KEY, ENVIRONMENT, ARTIFACTS, _trust(node))


def _replace(index: int, **update) -> list[ArtifactCreate]:
    changed = list(ARTIFACTS)
    changed[index] = changed[index].model_copy(update=update)
    return changed


TAMPERED = {
    "key field": (KEY.model_copy(update={"max_num_batched_tokens": 16384}), ENVIRONMENT, ARTIFACTS),
    "environment field": (KEY, ENVIRONMENT.model_copy(update={"cudnn_version": "91901"}), ARTIFACTS),
    "artifact sha256": (KEY, ENVIRONMENT, _replace(1, sha256=_sha("evil module"))),
    "artifact name": (KEY, ENVIRONMENT, _replace(1, name="flashinfer-jit/other_module.tar.gz")),
    "artifact kind": (KEY, ENVIRONMENT, _replace(1, kind=ArtifactKind.DEEP_GEMM_JIT_CACHE)),
    "added artifact": (KEY, ENVIRONMENT, [*ARTIFACTS, ArtifactCreate(
        kind=ArtifactKind.FLASHINFER_JIT_MODULE, name="flashinfer-jit/extra.tar.gz", sha256=_sha("extra"))]),
    "duplicated artifact": (KEY, ENVIRONMENT, [*ARTIFACTS, ARTIFACTS[1]]),
    "removed artifact": (KEY, ENVIRONMENT, ARTIFACTS[:2]),
}


@pytest.mark.parametrize("what", TAMPERED)
def test_a_changed_manifest_field_is_refused(what):
    node = Ed25519PrivateKey.generate()
    signature = sign_run(node, KEY, ENVIRONMENT, ARTIFACTS)
    key, environment, artifacts = TAMPERED[what]
    assert canonical_manifest(key, environment, artifacts, signature.key_id) != canonical_manifest(
        KEY, ENVIRONMENT, ARTIFACTS, signature.key_id)
    with pytest.raises(UntrustedRun) as exc:
        verify_run(signature, key, environment, artifacts, _trust(node))
    assert _one_line(exc) == "signature does not match the run's manifest (key, environment or artifacts changed)"
    # The untampered run still verifies with the same signature.
    assert verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node)) == signature.key_id


def test_a_signature_of_one_tuning_key_cannot_be_replayed_onto_another():
    """The node signed a run for an 8B model; the same artifacts offered to a pod of a 70B
    model (same GPU, same environment) carry that signature: the pod verifies over its own key."""
    node = Ed25519PrivateKey.generate()
    signature = sign_run(node, KEY, ENVIRONMENT, ARTIFACTS)
    other_key = KEY.model_copy(update={"model": "meta-llama/Llama-3.1-70B", "tensor_parallel_size": 4})
    with pytest.raises(UntrustedRun, match="does not match the run's manifest"):
        verify_run(signature, other_key, ENVIRONMENT, ARTIFACTS, _trust(node))
    h100 = ENVIRONMENT.model_copy(update={"gpu": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(UntrustedRun, match="does not match the run's manifest"):
        verify_run(signature, KEY, h100, ARTIFACTS, _trust(node))


def test_key_rotation(tmp_path):
    old_files, new_files = generate_signing_key(tmp_path / "old"), generate_signing_key(tmp_path / "new")
    old, new = load_signing_key(old_files.private_path), load_signing_key(new_files.private_path)
    old_signed, new_signed = (sign_run(k, KEY, ENVIRONMENT, ARTIFACTS) for k in (old, new))

    both = load_trusted_keys(f"{old_files.public_path.read_text().strip()},{new_files.public_path.read_text().strip()}")
    assert set(both) == {old_files.key_id, new_files.key_id}
    assert verify_run(old_signed, KEY, ENVIRONMENT, ARTIFACTS, both) == old_files.key_id
    assert verify_run(new_signed, KEY, ENVIRONMENT, ARTIFACTS, both) == new_files.key_id

    only_new = load_trusted_keys(str(new_files.public_path))
    assert verify_run(new_signed, KEY, ENVIRONMENT, ARTIFACTS, only_new) == new_files.key_id
    with pytest.raises(UntrustedRun, match=f"signed by key {old_files.key_id}, which is not among the 1 trusted key"):
        verify_run(old_signed, KEY, ENVIRONMENT, ARTIFACTS, only_new)


def test_an_unsigned_run_is_refused():
    with pytest.raises(UntrustedRun) as exc:
        verify_run(None, KEY, ENVIRONMENT, ARTIFACTS, _trust(Ed25519PrivateKey.generate()))
    assert _one_line(exc) == "run is unsigned"


@pytest.mark.parametrize("trusted", [{}, None])
def test_without_trusted_keys_every_run_is_refused(trusted):
    node = Ed25519PrivateKey.generate()
    for signature in (sign_run(node, KEY, ENVIRONMENT, ARTIFACTS), None):
        with pytest.raises(UntrustedRun) as exc:
            verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, trusted)
        assert _one_line(exc) == "no trusted keys are configured (TUNECACHE_TRUSTED_KEYS)"


@pytest.mark.parametrize("text", ["AAAA", "A", "AAAA====", "QUJD" * 30])
def test_a_malformed_signature_is_an_untrusted_run(text):
    node = Ed25519PrivateKey.generate()
    signature = RunSignature(key_id=key_id(node.public_key()), signature=text)
    with pytest.raises(UntrustedRun, match="does not match the run's manifest"):
        verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node))


def test_a_signature_that_skipped_validation_is_still_only_an_untrusted_run():
    node = Ed25519PrivateKey.generate()
    for text in ("not base64 at all!", "", "\x00" * 88):
        signature = RunSignature.model_construct(key_id=key_id(node.public_key()), signature=text)
        with pytest.raises(UntrustedRun, match="does not match the run's manifest"):
            verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node))


def test_run_signature_validates_its_fields():
    with pytest.raises(ValueError):
        RunSignature(key_id="ABCDEF0123456789", signature="AAAA")  # uppercase
    with pytest.raises(ValueError):
        RunSignature(key_id="0123456789abcdef0", signature="AAAA")  # 17 digits
    with pytest.raises(ValueError):
        RunSignature(key_id="0123456789abcdef", signature="A" * 1000)
    with pytest.raises(ValueError):
        RunSignature(key_id="0123456789abcdef", signature="AAAA", extra="x")


# --------------------------------------------------------------------------- manifest


def test_the_manifest_is_canonical_json_of_what_a_pod_installs():
    manifest = canonical_manifest(KEY, ENVIRONMENT, ARTIFACTS, "0123456789abcdef")
    decoded = json.loads(manifest)
    assert decoded["format"] == MANIFEST_FORMAT == "tunecache-run-manifest/2"
    assert decoded["install_fields"] == {"flashinfer_jit": {}}
    assert json.loads(canonical_manifest(KEY, ENVIRONMENT, ARTIFACTS, "0123456789abcdef", manifest=1))["format"] == \
        "tunecache-run-manifest/1"
    assert decoded["key"] == KEY.model_dump(mode="json", exclude={"engine"}) and decoded["environment"] == ENVIRONMENT.model_dump(mode="json")
    assert decoded["signing_key_id"] == "0123456789abcdef"
    assert [a["kind"] for a in decoded["artifacts"]] == sorted(a.kind.value for a in ARTIFACTS)
    assert set(decoded["artifacts"][0]) == {"kind", "name", "sha256"}  # media_type is not signed
    assert manifest == json.dumps(decoded, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def test_artifact_order_does_not_change_the_manifest():
    forward = canonical_manifest(KEY, ENVIRONMENT, ARTIFACTS, "0123456789abcdef")
    assert canonical_manifest(KEY, ENVIRONMENT, list(reversed(ARTIFACTS)), "0123456789abcdef") == forward
    assert canonical_manifest(KEY, ENVIRONMENT, iter([ARTIFACTS[1], ARTIFACTS[2], ARTIFACTS[0]]), "0123456789abcdef") \
        == forward
    node = Ed25519PrivateKey.generate()
    assert verify_run(sign_run(node, KEY, ENVIRONMENT, ARTIFACTS), KEY, ENVIRONMENT, ARTIFACTS[::-1], _trust(node))


def test_the_summary_fields_that_decide_an_install_are_signed():
    """A replay that changes the JIT validity fields of a signed run's summary (so that a pod
    skips, or takes, modules built elsewhere) no longer checks."""
    node = Ed25519PrivateKey.generate()
    summary = {"entries": 42, "flashinfer_jit": {"workspace_subdir": "0.7.4/90a", "cuda_home": "/usr/local/cuda"}}
    signature = sign_run(node, KEY, ENVIRONMENT, ARTIFACTS, summary)
    assert signature.manifest == 2
    assert verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), summary) == signature.key_id
    assert verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), {**summary, "entries": 0})  # not an install field
    tampered = {**summary, "flashinfer_jit": {**summary["flashinfer_jit"], "cuda_home": "/opt/other"}}
    with pytest.raises(UntrustedRun, match="does not match"):
        verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), tampered)
    # a format-1 signature (before this field was signed) still checks over what it covers
    old = node.sign(canonical_manifest(KEY, ENVIRONMENT, ARTIFACTS, key_id(node.public_key()), manifest=1))
    legacy = RunSignature(key_id=key_id(node.public_key()), signature=base64.b64encode(old).decode(), manifest=1)
    assert verify_run(legacy, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), tampered) == legacy.key_id


def test_a_signature_is_dated_and_refused_once_it_expired():
    node = Ed25519PrivateKey.generate()
    signature = sign_run(node, KEY, ENVIRONMENT, ARTIFACTS, valid_days=1, now=1_800_000_000)
    assert (signature.signed_at, signature.expires_at) == (1_800_000_000, 1_800_086_400)
    assert verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), now=1_800_086_400) == signature.key_id
    with pytest.raises(UntrustedRun, match=r"signature expired at 2027-01-1[67] .*promote RUN --signing-key"):
        verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), now=1_800_086_401)
    moved = signature.model_copy(update={"expires_at": 1_900_000_000})  # the dates are inside the signature
    with pytest.raises(UntrustedRun, match="does not match"):
        verify_run(moved, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), now=1_800_100_000)
    undated = RunSignature(key_id=signature.key_id, signature=signature.signature, manifest=2)
    with pytest.raises(UntrustedRun, match="without its signing time and expiry"):
        verify_run(undated, KEY, ENVIRONMENT, ARTIFACTS, _trust(node), now=1_800_000_001)


def test_the_manifest_names_the_signing_key():
    assert canonical_manifest(KEY, ENVIRONMENT, ARTIFACTS, "0123456789abcdef") != canonical_manifest(
        KEY, ENVIRONMENT, ARTIFACTS, "fedcba9876543210")


# ------------------------------------------------------------------------ trusted keys


def _public(private_key: Ed25519PrivateKey) -> str:
    return format_public_key(private_key.public_key())


def test_trusted_keys_from_a_file_skip_comments_and_blank_lines(tmp_path):
    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys_file = tmp_path / "trusted.pub"
    keys_file.write_text(f"# the fleet's tuner nodes\n\n{_public(a)}\n   \n  # rotated in 2026-11\n{_public(b)}  # node-2\n")
    trusted = load_trusted_keys(str(keys_file))
    assert set(trusted) == {key_id(a.public_key()), key_id(b.public_key())}
    signature = sign_run(b, KEY, ENVIRONMENT, ARTIFACTS)
    assert verify_run(signature, KEY, ENVIRONMENT, ARTIFACTS, trusted) == key_id(b.public_key())


def test_trusted_keys_from_a_comma_separated_list():
    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    trusted = load_trusted_keys(f" {_public(a)} , {_public(b)},")
    assert set(trusted) == {key_id(a.public_key()), key_id(b.public_key())}
    assert load_trusted_keys(_public(a)).keys() == {key_id(a.public_key())}


def test_a_bad_trusted_keys_file_line_is_named(tmp_path):
    good = _public(Ed25519PrivateKey.generate())
    keys_file = tmp_path / "trusted.pub"
    for bad, why in [
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
         "does not start with 'ed25519:'"),
        ("ed25519:not-base64!", "is not ed25519:<base64>"),
        ("ed25519:" + base64.b64encode(b"\x01" * 16).decode(), "holds 16 bytes, not the 32"),
    ]:
        keys_file.write_text(f"# fleet\n{good}\n\n{bad}\n")
        with pytest.raises(SigningError) as exc:
            load_trusted_keys(str(keys_file))
        message = _one_line(exc)
        assert "trusted.pub line 4: " in message and why in message, message
        assert len(message) < 200, message
        if len(bad) > 30:  # a long entry: only a short start of it is shown
            assert bad[:30] not in message and bad[:20] in message, message


def test_a_bad_trusted_keys_list_entry_is_named():
    good = _public(Ed25519PrivateKey.generate())
    with pytest.raises(SigningError) as exc:
        load_trusted_keys(f"{good},ed25519:{'A' * 200}")
    message = _one_line(exc)
    assert message.startswith("TUNECACHE_TRUSTED_KEYS entry 2: ") and "A" * 60 not in message, message


def test_trusted_keys_that_are_missing_empty_or_private_are_refused(tmp_path):
    with pytest.raises(SigningError, match="neither a file nor a comma-separated list") as exc:
        load_trusted_keys(str(tmp_path / "no-such-file"))
    _one_line(exc)
    with pytest.raises(SigningError, match="set but empty"):
        load_trusted_keys("  ")
    only_comments = tmp_path / "comments.pub"
    only_comments.write_text("# nothing yet\n\n")
    with pytest.raises(SigningError, match="holds no public keys"):
        load_trusted_keys(str(only_comments))
    with pytest.raises(SigningError, match="cannot read"):
        load_trusted_keys(str(tmp_path))

    # A private key by mistake: refused, and none of it is echoed.
    files = generate_signing_key(tmp_path / "node")
    pem = files.private_path.read_text()
    secret_line = pem.splitlines()[1]
    for value in (str(files.private_path), pem):
        with pytest.raises(SigningError, match="private key") as exc:
            load_trusted_keys(value)
        assert secret_line[22:] not in _one_line(exc)  # past the constant PKCS#8 prefix: the key itself
