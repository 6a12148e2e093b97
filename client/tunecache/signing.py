"""Signed tuning runs: a tuner node's Ed25519 key, and the check a pod makes before installing.

A tuner node holds a private key (:func:`generate_signing_key`, ``TUNECACHE_SIGNING_KEY``)
and signs every run it records (:func:`sign_run`): a detached signature over the run's
manifest (:func:`canonical_manifest`), which is the tuning key, the FlashInfer
environment and every artifact's kind, name and sha256, plus the signing key's id. Pods
hold the fleet's public keys (``TUNECACHE_TRUSTED_KEYS``: :func:`load_trusted_keys`, several
at once for rotation) and check a run with :func:`verify_run` over *their own* key and
environment before installing anything; each artifact is then checked against the sha256
the manifest names, so no byte the signer did not sign is installed.

Formats:

* private key: ``signing.key``, PKCS#8 PEM, unencrypted, mode 0600;
* public key: ``signing.pub``, one line ``ed25519:<base64 of the 32 raw public key bytes>``;
* key id: the first 16 hex digits of sha256 of the 32 raw public key bytes (:func:`key_id`);
* signature: :class:`RunSignature`, the key id and base64 of the 64-byte Ed25519 signature.

All cryptography is the ``cryptography`` package's; nothing here is hand-written crypto.
Every error is a :class:`SigningError` (a :class:`tunecache.store.TunecacheError`) with a
one-line message; a run that must not be installed is an :class:`UntrustedRun`.
"""

from __future__ import annotations

import base64
import datetime as dt
import binascii
import enum
import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tunecache.contract import EnvironmentMetadata, RunSignature, TuningKey
from tunecache.store import TunecacheError

__all__ = [
    "MANIFEST_FORMAT",
    "PRIVATE_KEY_FILE",
    "PUBLIC_KEY_FILE",
    "PUBLIC_KEY_PREFIX",
    "RunSignature",
    "SignedArtifact",
    "SigningError",
    "SigningKeyFiles",
    "UntrustedRun",
    "canonical_manifest",
    "format_public_key",
    "generate_signing_key",
    "key_id",
    "load_signing_key",
    "load_trusted_keys",
    "parse_public_key",
    "sign_run",
    "verify_run",
]

#: The ``format`` field of a manifest, by :attr:`RunSignature.manifest`; a change to what is
#: signed gets a new one. 2 adds the run's install fields (:func:`install_fields`).
MANIFEST_FORMATS = {1: "tunecache-run-manifest/1", 2: "tunecache-run-manifest/2"}
MANIFEST_FORMAT = MANIFEST_FORMATS[2]
#: How long a signature is valid (days) unless the signer says otherwise: pods refuse it
#: after that (a frozen proxy cannot serve an old run for ever); ``promote --signing-key``
#: signs a run anew.
SIGNATURE_VALID_DAYS = 90.0


def install_fields(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a run's ``summary`` that decide what a pod installs, signed with the run
    (manifest 2): ``flashinfer_jit``, the FlashInfer workspace and the JIT validity fields
    the pod compares with its own before it installs JIT modules, and, where the run has them,
    ``dependencies``, the package versions its executable kinds were built with
    (:mod:`tunecache.formats.dependencies`; a run recorded before them signs without). (vLLM's
    compile factors are signed inside the compile-cache tarball itself.)"""
    jit = (summary or {}).get("flashinfer_jit")
    fields: dict[str, Any] = {"flashinfer_jit": jit if isinstance(jit, dict) else {}}
    if "dependencies" in (summary or {}):
        fields["dependencies"] = summary["dependencies"]
    return fields
#: Name of the private key file :func:`generate_signing_key` writes.
PRIVATE_KEY_FILE = "signing.key"
#: Name of the public key file :func:`generate_signing_key` writes.
PUBLIC_KEY_FILE = "signing.pub"
#: Prefix of a public key in its text form (``ed25519:<base64>``).
PUBLIC_KEY_PREFIX = "ed25519:"
#: The pod setting that names the trusted public keys (in error messages).
TRUSTED_KEYS_SETTING = "TUNECACHE_TRUSTED_KEYS"

_RAW_PUBLIC_KEY_BYTES = 32
_SIGNATURE_BYTES = 64
#: At most this many characters of a bad entry are shown in an error message.
_PREVIEW_CHARS = 24


class SigningError(TunecacheError):
    """A key file or a trusted-keys setting is unusable; the message is one line naming why."""


class UntrustedRun(SigningError):
    """A run must not be installed: unsigned, signed by a key that is not trusted, its
    signature does not match its manifest, or no trusted keys are configured."""


class SignedArtifact(Protocol):
    """What the manifest takes of an artifact: :class:`tunecache.contract.ArtifactCreate`
    and :class:`tunecache.contract.ArtifactRead` both have these."""

    @property
    def kind(self) -> Any: ...  # ArtifactKind, or its value as text (ArtifactRead)

    @property
    def name(self) -> str: ...

    @property
    def sha256(self) -> str: ...


@dataclass(frozen=True)
class SigningKeyFiles:
    """What :func:`generate_signing_key` wrote: the private key file (0600), the public
    key file (one ``ed25519:...`` line) and the key's id (16 hex digits)."""

    private_path: Path
    public_path: Path
    key_id: str


# ------------------------------------------------------------------------------- keys


def _raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The id of a public key: the first 16 lowercase hex digits of sha256 of its 32 raw bytes.

    Takes an :class:`Ed25519PublicKey` (for a private key, pass ``key.public_key()``).
    """
    return hashlib.sha256(_raw_public_bytes(public_key)).hexdigest()[:16]


def format_public_key(public_key: Ed25519PublicKey) -> str:
    """A public key's text form: ``ed25519:<base64 of its 32 raw bytes>`` (52 characters),
    as ``signing.pub`` holds it and ``TUNECACHE_TRUSTED_KEYS`` takes it."""
    return PUBLIC_KEY_PREFIX + base64.b64encode(_raw_public_bytes(public_key)).decode("ascii")


def _create_exclusive(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file ``path`` with ``mode``; never touches an existing file.

    Raises:
        FileExistsError: ``path`` exists. OSError: it cannot be written (a partial file is removed).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits off; never adds any to a 0600 key
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if fd != -1:
            os.close(fd)
        path.unlink(missing_ok=True)
        raise


def generate_signing_key(directory: Path) -> SigningKeyFiles:
    """Make a new Ed25519 signing key in ``directory`` (created, mode 0700, if missing).

    Writes ``signing.key`` (PKCS#8 PEM, unencrypted, mode 0600) and ``signing.pub``
    (``ed25519:<base64 of the 32 raw public key bytes>`` and a newline). Both are created
    exclusively (``O_CREAT | O_EXCL``): an existing key is never overwritten.

    Returns:
        the two paths and the key's id (:func:`key_id`).

    Raises:
        SigningError: ``signing.key`` or ``signing.pub`` already exists in ``directory``
            (nothing is written), or a file cannot be written (nothing is left behind).
    """
    directory = Path(directory)
    private_path, public_path = directory / PRIVATE_KEY_FILE, directory / PUBLIC_KEY_FILE
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise SigningError(f"{path} already exists; a signing key is never overwritten (move it away first)")
    private_key = Ed25519PrivateKey.generate()
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_line = (format_public_key(private_key.public_key()) + "\n").encode("ascii")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SigningError(f"cannot make the key directory {directory}: {exc.strerror or exc}") from None
    try:
        _create_exclusive(private_path, pem, 0o600)
    except FileExistsError:
        raise SigningError(f"{private_path} already exists; a signing key is never overwritten (move it away first)") from None
    except OSError as exc:
        raise SigningError(f"cannot write the signing key {private_path}: {exc.strerror or exc}") from None
    try:
        _create_exclusive(public_path, public_line, 0o644)
    except OSError as exc:
        private_path.unlink(missing_ok=True)  # the key this call just made, useless without its .pub
        if isinstance(exc, FileExistsError):
            raise SigningError(f"{public_path} already exists; a signing key is never overwritten (move it away first)") from None
        raise SigningError(f"cannot write the public key {public_path}: {exc.strerror or exc}") from None
    return SigningKeyFiles(private_path=private_path, public_path=public_path, key_id=key_id(private_key.public_key()))


def load_signing_key(path: Path | str) -> Ed25519PrivateKey:
    """Read a tuner node's private key (``TUNECACHE_SIGNING_KEY``): an unencrypted PEM
    Ed25519 key, as :func:`generate_signing_key` writes it.

    Raises:
        SigningError: the file does not exist, cannot be read, is not an unencrypted PEM
            private key, or holds a key of another type than Ed25519.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SigningError(f"signing key {path} does not exist") from None
    except OSError as exc:
        raise SigningError(f"cannot read signing key {path}: {exc.strerror or exc}") from None
    try:
        private_key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningError(f"signing key {path} is encrypted; tunecache needs an unencrypted PKCS#8 PEM key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise SigningError(f"{path} is not a PEM private key (make one with `tunecache keys generate`)") from None
    if not isinstance(private_key, Ed25519PrivateKey):
        raise SigningError(f"signing key {path} is a {type(private_key).__name__}, not an Ed25519 key")
    return private_key


def _preview(text: str) -> str:
    """At most :data:`_PREVIEW_CHARS` characters of ``text``, quoted, for an error message."""
    shown = text[:_PREVIEW_CHARS] + ("..." if len(text) > _PREVIEW_CHARS else "")
    return ascii(shown)


def _shorten(path: str, limit: int = 60) -> str:
    """A path for an error message: whole up to ``limit`` characters, else its end."""
    return path if len(path) <= limit else "..." + path[-(limit - 3):]


def parse_public_key(text: str) -> Ed25519PublicKey:
    """A public key from its text form ``ed25519:<base64 of 32 raw bytes>`` (surrounding
    whitespace ignored).

    Raises:
        SigningError: not of that form (the message shows at most a short start of ``text``,
            and never any of a private key).
    """
    text = text.strip()
    if "PRIVATE KEY" in text:
        raise SigningError("is a private key; only public keys (signing.pub) are trusted")
    if not text.startswith(PUBLIC_KEY_PREFIX):
        raise SigningError(f"{_preview(text)} does not start with {PUBLIC_KEY_PREFIX!r}")
    try:
        raw = base64.b64decode(text[len(PUBLIC_KEY_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise SigningError(f"{_preview(text)} is not {PUBLIC_KEY_PREFIX}<base64>") from None
    if len(raw) != _RAW_PUBLIC_KEY_BYTES:
        raise SigningError(f"{_preview(text)} holds {len(raw)} bytes, not the {_RAW_PUBLIC_KEY_BYTES} of an Ed25519 public key")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, UnsupportedAlgorithm):
        raise SigningError(f"{_preview(text)} is not an Ed25519 public key") from None


def load_trusted_keys(value: str) -> dict[str, Ed25519PublicKey]:
    """The public keys a pod trusts, from ``TUNECACHE_TRUSTED_KEYS``.

    ``value`` is either a comma-separated list of ``ed25519:<base64>`` keys (it starts
    with ``ed25519:``), or the path of a file with one such key per line: blank lines and
    ``#`` comments (whole lines, or after a key) are ignored. Several keys may be trusted at
    once, so a fleet can rotate: trust the new key, re-sign, then drop the old one.

    Returns:
        ``{key id: public key}`` (:func:`key_id`), at least one entry.

    Raises:
        SigningError: one line naming the bad entry (its line number in the file, or its
            position in the list) and why; the file is missing or unreadable; or no key
            is given at all.
    """
    value = value.strip()
    if not value:
        raise SigningError(f"{TRUSTED_KEYS_SETTING} is set but empty")
    if "PRIVATE KEY" in value:  # never echo any of it
        raise SigningError(f"{TRUSTED_KEYS_SETTING} holds a private key; trust public keys only (signing.pub)")
    entries: list[tuple[str, str]] = []  # (where, text)
    if value.startswith(PUBLIC_KEY_PREFIX):
        source = TRUSTED_KEYS_SETTING
        for number, entry in enumerate(value.split(","), start=1):
            if entry.strip():
                entries.append((f"{TRUSTED_KEYS_SETTING} entry {number}", entry))
    else:
        path = Path(value).expanduser()
        source = f"{TRUSTED_KEYS_SETTING} file {_shorten(str(path))}"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SigningError(
                f"{TRUSTED_KEYS_SETTING}: {_shorten(value)} is neither a file nor a comma-separated list of "
                f"{PUBLIC_KEY_PREFIX}<base64> keys"
            ) from None
        except UnicodeDecodeError:
            raise SigningError(f"{source} is not UTF-8 text") from None
        except OSError as exc:
            raise SigningError(f"cannot read {source}: {exc.strerror or exc}") from None
        except ValueError:  # a NUL in the path
            raise SigningError(f"{TRUSTED_KEYS_SETTING} is neither a file nor a list of {PUBLIC_KEY_PREFIX}<base64> keys") from None
        if "PRIVATE KEY" in text:
            raise SigningError(f"{source} holds a private key; trust public keys only (signing.pub)")
        for number, line in enumerate(text.splitlines(), start=1):
            entry = line.split("#", 1)[0]
            if entry.strip():
                entries.append((f"{source} line {number}", entry))
    keys: dict[str, Ed25519PublicKey] = {}
    for where, entry in entries:
        try:
            public_key = parse_public_key(entry)
        except SigningError as exc:
            raise SigningError(f"{where}: {exc}") from None
        keys[key_id(public_key)] = public_key
    if not keys:
        raise SigningError(f"{source} holds no public keys")
    return keys


# --------------------------------------------------------------------------- manifest


def _kind_text(kind: Any) -> str:
    return str(kind.value) if isinstance(kind, enum.Enum) else str(kind)


def canonical_manifest(
    key: TuningKey,
    environment: EnvironmentMetadata,
    artifacts: Iterable[SignedArtifact],
    signing_key_id: str,
    fields: Mapping[str, Any] | None = None,
    manifest: int = 2,
    signed_at: int | None = None,
    expires_at: int | None = None,
) -> bytes:
    """The bytes a run's signature is over: canonical JSON (sorted keys, no spaces, ASCII) of

    ``{"format": "tunecache-run-manifest/1", "key": {...}, "environment": {...},
    "artifacts": [{"kind", "name", "sha256"}, ...], "signing_key_id": "<16 hex>"}``

    with the artifacts sorted by (kind, name, sha256), so their order does not matter
    (duplicates are kept: an added copy changes the manifest). ``kind`` is the
    :class:`tunecache.contract.ArtifactKind` value as text; ``artifacts`` may be
    ``ArtifactCreate`` or ``ArtifactRead`` objects, or anything with ``kind``, ``name``
    and ``sha256``.

    What is signed is what a pod installs and what it is for: the tuning key and the
    environment sit inside the manifest, so a signature of one key's run cannot be
    replayed onto another key or environment (a pod verifies over its own). The run's
    status, trigger, node, timings, error and summary are **not** signed: a pod installs
    none of them, except (manifest 2) ``install_fields``: what of the summary decides what a
    pod installs (:func:`install_fields`). A field added to :class:`TuningKey` or
    :class:`EnvironmentMetadata` changes every manifest, so it needs a new format, unless
    its default is left out as ``engine``'s is (:meth:`TuningKey.identity`): a key of
    the default engine ``vllm`` signs the manifest it signed before keys named their
    engine, and any other engine is signed by name.
    """
    listed = sorted(
        ({"kind": _kind_text(a.kind), "name": str(a.name), "sha256": str(a.sha256)} for a in artifacts),
        key=lambda a: (a["kind"], a["name"], a["sha256"]),
    )
    document = {
        "format": MANIFEST_FORMATS[manifest],
        "key": key.identity(),
        "environment": environment.model_dump(mode="json"),
        "artifacts": listed,
        "signing_key_id": signing_key_id,
    }
    if manifest >= 2:  # the summary's install fields (:func:`install_fields` of the run's summary), and when
        document["install_fields"] = dict(fields or install_fields(None))
        document["signed_at"], document["expires_at"] = signed_at, expires_at
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def sign_run(
    private_key: Ed25519PrivateKey,
    key: TuningKey,
    environment: EnvironmentMetadata,
    artifacts: Iterable[SignedArtifact],
    summary: Mapping[str, Any] | None = None,
    valid_days: float = SIGNATURE_VALID_DAYS,
    now: float | None = None,
) -> RunSignature:
    """Sign a run's manifest (:func:`canonical_manifest`, format 2: with the
    :func:`install_fields` of its ``summary``, the signing time and an expiry ``valid_days``
    later) with a tuner node's (or an operator's) key.

    Returns:
        the :class:`RunSignature` to send with the run (``TuningRunCreate.signature``): the
        key's id, base64 of the 64-byte Ed25519 signature, the manifest format and its times.
    """
    signer_id = key_id(private_key.public_key())
    signed_at = int(time.time() if now is None else now)
    expires_at = signed_at + max(1, int(valid_days * 86400))
    signature = private_key.sign(canonical_manifest(key, environment, artifacts, signer_id, install_fields(summary),
                                                    signed_at=signed_at, expires_at=expires_at))
    return RunSignature(key_id=signer_id, signature=base64.b64encode(signature).decode("ascii"), manifest=2,
                        signed_at=signed_at, expires_at=expires_at)


def verify_run(
    signature: RunSignature | None,
    key: TuningKey,
    environment: EnvironmentMetadata,
    artifacts: Iterable[SignedArtifact],
    trusted: Mapping[str, Ed25519PublicKey] | None,
    summary: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> str:
    """Check a run's signature against the trusted keys, over the manifest of ``key``,
    ``environment`` (a pod passes its *own*, never the run's), the run's ``artifacts`` and
    (manifest 2) the :func:`install_fields` of the run's ``summary``.

    Returns:
        the id of the trusted key that signed the run.

    Raises:
        UntrustedRun: one line naming why: no trusted keys are configured, the run is
            unsigned, it is signed by a key that is not trusted, or the signature does not
            match the manifest (the key, environment or an artifact changed, or the
            signature is not base64 of 64 bytes). Never another exception type for a bad
            signature.
    """
    if not trusted:
        raise UntrustedRun(f"no trusted keys are configured ({TRUSTED_KEYS_SETTING})")
    if signature is None:
        raise UntrustedRun("run is unsigned")
    public_key = trusted.get(signature.key_id)
    if public_key is None:
        count = len(trusted)
        raise UntrustedRun(  # key_id is 16 hex digits (RunSignature's pattern)
            f"signed by key {signature.key_id}, which is not among the {count} trusted key{'s' if count != 1 else ''}"
        )
    mismatch = UntrustedRun("signature does not match the run's manifest (key, environment or artifacts changed)")
    if signature.manifest >= 2 and (signature.signed_at is None or signature.expires_at is None):
        raise UntrustedRun("signature of manifest format 2 without its signing time and expiry")
    try:
        raw = base64.b64decode(signature.signature, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise mismatch from None
    if len(raw) != _SIGNATURE_BYTES:
        raise mismatch
    try:
        public_key.verify(raw, canonical_manifest(key, environment, artifacts, signature.key_id, install_fields(summary),
                                                  signature.manifest, signature.signed_at, signature.expires_at))
    except InvalidSignature:
        raise mismatch from None
    if signature.expires_at is not None and (time.time() if now is None else now) > signature.expires_at:
        when = dt.datetime.fromtimestamp(signature.expires_at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        raise UntrustedRun(f"signature expired at {when} (re-sign it: tunecache promote RUN --signing-key KEY)")
    return signature.key_id
