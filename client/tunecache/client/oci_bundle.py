"""A bundle of signed runs as an OCI image layout: what ``tunecache export`` writes and
``tunecache import`` reads, to carry runs to a service that has no route to the one they
were tuned by (an air-gapped cluster).

The layout (OCI image-spec, "image layout") is a directory of ``oci-layout``, ``index.json``
and ``blobs/sha256/<hex>``. ``index.json`` names one OCI image index (tagged with
``org.opencontainers.image.ref.name``, default ``latest``); the index lists one OCI image
manifest per run. A run's manifest has the run record as its config
(:data:`RUN_CONFIG_MEDIA_TYPE`: :class:`BundledRun`, the :class:`~tunecache.contract.TuningRunCreate`
the service recorded, its signature kept) and each artifact as a layer whose digest is the
artifact's sha256 (the same address the service stores it at), titled with the artifact's name.
The manifests and the index are checked with the JSON schemas of ``oras`` (oras-py,
:mod:`oras.schemas`) and the written layout with its layout check
(:class:`oras.layout.layout.Layout`); the registry side is :mod:`tunecache.client.oci_registry`.

Reading a layout (:func:`read_layout`) trusts nothing in it: every file is opened without
following a link and must be a regular file of the size its descriptor names, whose sha256
is the digest it is stored under; manifests, configs, runs, layers, files and bytes are
bounded (the ``MAX_*`` constants here, and ``TUNECACHE_MAX_UNPACK_BYTES`` for one artifact),
and a bundle past a bound is refused (:class:`BadBundle`) before anything is sent anywhere.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import oras.defaults
import oras.schemas
from oras.layout.layout import Layout
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tunecache.contract import ArtifactCreate, MAX_ID, TuningRunCreate, TuningRunRead
from tunecache.formats.tarball import max_unpack_bytes
from tunecache.store import TunecacheError

#: The config media type of a run's manifest: its :class:`BundledRun` as JSON.
RUN_CONFIG_MEDIA_TYPE = "application/vnd.tunecache.run.v1+json"
MANIFEST_MEDIA_TYPE = oras.defaults.default_manifest_media_type
INDEX_MEDIA_TYPE = oras.defaults.default_index_media_type
#: Annotations: an artifact's name (OCI's title), its kind, a run's id where it was exported.
TITLE_ANNOTATION = oras.defaults.annotation_title
KIND_ANNOTATION = "io.tunecache.artifact.kind"
RUN_ANNOTATION = "io.tunecache.run.id"
REF_NAME_ANNOTATION = oras.defaults.oci_ref_name_annotation
DEFAULT_TAG = oras.defaults.default_tag

#: The most runs one bundle holds.
MAX_BUNDLE_RUNS = 1000
#: The most bytes of ``index.json``, of the bundle's index and of one run's manifest.
MAX_MANIFEST_BYTES = 4 << 20
#: The most bytes of one run's record (its config blob).
MAX_RUN_CONFIG_BYTES = 16 << 20
#: The most files under ``blobs/sha256`` of a layout read.
MAX_LAYOUT_FILES = 100_000
#: The most bytes all of a bundle's artifacts hold together.
MAX_BUNDLE_BYTES = 64 << 30
#: The most bytes of the small files of a layout (``oci-layout``).
_MAX_SMALL_FILE_BYTES = 4096
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


class BadBundle(TunecacheError):
    """A layout that is not a bundle of runs, or that goes past a bound; one line naming why."""


class BundledRun(BaseModel):
    """A run's record in a bundle (the config blob of its manifest)."""

    model_config = ConfigDict(extra="forbid")

    source_run_id: int = Field(ge=1, le=MAX_ID, description="the run's id in the service it was exported from")
    exported_at: dt.datetime
    run: TuningRunCreate


class _Descriptor(BaseModel):
    """An OCI content descriptor, as far as a bundle uses it."""

    model_config = ConfigDict(extra="allow")

    mediaType: str = Field(max_length=255)
    digest: str = Field(pattern=_DIGEST.pattern)
    size: int = Field(ge=0)
    annotations: dict[str, str] = Field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return self.digest.removeprefix("sha256:")


def run_record(run: TuningRunRead) -> TuningRunCreate:
    """The record a service keeps of ``run`` as another service takes it (``POST /v1/tunings``):
    its key, environment, times, summary, artifacts, engine variant and signature, unchanged,
    so the signature still checks; a node hidden from a reader below ``admin`` is left out.

    Raises:
        BadBundle: an artifact of a kind this client does not know (a newer service's).
    """
    try:
        artifacts = [ArtifactCreate(kind=a.kind, name=a.name, media_type=a.media_type, sha256=a.sha256)
                     for a in run.artifacts]
        return TuningRunCreate(key=run.key, environment=run.environment, status=run.status, trigger=run.trigger,
                               node=None if run.node == "(hidden)" else run.node, started_at=run.started_at,
                               finished_at=run.finished_at, error=run.error, summary=run.summary,
                               artifacts=artifacts, signature=run.signature, variant=run.variant)
    except ValidationError as exc:
        raise BadBundle(f"run {run.id} cannot be exported: {exc.errors()[0]['msg']}") from None


def _json_bytes(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class LayoutWriter:
    """Writes a bundle into a new OCI image layout at ``root`` (which must not exist, or be
    an empty directory): :meth:`add_run` per run, then :meth:`finish`."""

    def __init__(self, root: Path):
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise BadBundle(f"{root} exists and is not an empty directory: a bundle is written into a new one")
        self.root = root
        self.blobs = root / oras.defaults.oci_blobs_dir / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.manifests: list[dict[str, Any]] = []
        self.artifact_bytes = 0

    def _blob(self, sha256: str) -> Path:
        return self.blobs / sha256

    def _put(self, data: bytes, media_type: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        sha256 = hashlib.sha256(data).hexdigest()
        if not self._blob(sha256).exists():
            self._blob(sha256).write_bytes(data)
        descriptor: dict[str, Any] = {"mediaType": media_type, "digest": f"sha256:{sha256}", "size": len(data)}
        if annotations:
            descriptor["annotations"] = annotations
        return descriptor

    def add_run(self, run: TuningRunRead, fetch: Callable[[str], bytes], now: dt.datetime) -> int:
        """Add ``run`` with each of its artifacts, whose bytes ``fetch(sha256)`` returns
        (verified by the fetcher); returns the bytes of artifacts written."""
        if len(self.manifests) >= MAX_BUNDLE_RUNS:
            raise BadBundle(f"a bundle holds at most {MAX_BUNDLE_RUNS} runs")
        record = BundledRun(source_run_id=run.id, exported_at=now, run=run_record(run))
        layers, written = [], 0
        for artifact in record.run.artifacts:
            if not self._blob(artifact.sha256).exists():
                data = fetch(artifact.sha256)
                self._blob(artifact.sha256).write_bytes(data)
                written += len(data)
            size = self._blob(artifact.sha256).stat().st_size
            layers.append({"mediaType": artifact.media_type, "digest": f"sha256:{artifact.sha256}", "size": size,
                           "annotations": {TITLE_ANNOTATION: artifact.name, KIND_ANNOTATION: artifact.kind.value}})
        config = self._put(record.model_dump_json().encode(), RUN_CONFIG_MEDIA_TYPE)
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "config": config, "layers": layers,
                    "annotations": {RUN_ANNOTATION: str(run.id)}}
        jsonschema.validate(manifest, schema=oras.schemas.manifest)
        self.manifests.append(self._put(_json_bytes(manifest), MANIFEST_MEDIA_TYPE,
                                        {RUN_ANNOTATION: str(run.id), "io.tunecache.model": run.key.model}))
        self.artifact_bytes += written
        return written

    def finish(self, tag: str = DEFAULT_TAG) -> str:
        """Write the bundle's index, ``index.json`` naming it ``tag``, and ``oci-layout``;
        returns the index's digest. The layout is checked with oras' layout check."""
        index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": self.manifests}
        jsonschema.validate(index, schema=oras.schemas.index)
        descriptor = self._put(_json_bytes(index), INDEX_MEDIA_TYPE, {REF_NAME_ANNOTATION: tag})
        (self.root / oras.defaults.oci_image_index_file).write_bytes(
            _json_bytes({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [descriptor]}))
        (self.root / oras.defaults.oci_layout_file).write_bytes(
            _json_bytes({"imageLayoutVersion": oras.defaults.oci_layout_version_pin}))
        Layout(str(self.root)).validate()
        return descriptor["digest"]


# ------------------------------------------------------------------------- reading


@dataclass
class BundleEntry:
    """One run of a bundle read: its record, and the layout file of each of its artifacts."""

    record: BundledRun
    files: dict[str, Path] = field(default_factory=dict)
    """sha256 -> the blob file holding those bytes (checked)."""

    @property
    def artifact_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.files.values())


def _open_regular(path: Path, what: str) -> tuple[int, int]:
    """``(fd, size)`` of ``path`` opened without following a link; a regular file only."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise BadBundle(f"{what}: {path.name} is missing") from None
    except OSError as exc:
        raise BadBundle(f"{what}: {path.name} cannot be opened ({exc.strerror}; a link is refused)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BadBundle(f"{what}: {path.name} is not a regular file")
    return fd, info.st_size


def _read_small(path: Path, limit: int, what: str) -> bytes:
    fd, size = _open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        if size > limit:
            raise BadBundle(f"{what} is {size:,} bytes, over the {limit:,} a bundle allows")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BadBundle(f"{what} is over the {limit:,} bytes a bundle allows")
    return data


class _Reader:
    """The checks of one layout read."""

    def __init__(self, root: Path):
        self.root = root
        self.blobs = root / oras.defaults.oci_blobs_dir / "sha256"
        for directory in (self.root, self.blobs.parent, self.blobs):
            try:
                info = directory.lstat() if directory != self.root else directory.stat()
            except OSError:
                missing = directory.relative_to(root) if directory != root else root
                raise BadBundle(f"{root} is not an OCI image layout: {missing} is missing") from None
            if not stat.S_ISDIR(info.st_mode):
                raise BadBundle(f"{root}: {directory.name} is not a directory (a link is refused)")
        files = 0
        with os.scandir(self.blobs) as entries:
            for _ in entries:
                files += 1
                if files > MAX_LAYOUT_FILES:
                    raise BadBundle(f"{root} holds over {MAX_LAYOUT_FILES:,} blobs: more than a bundle may")
        self.total = 0

    def document(self, descriptor: _Descriptor, limit: int, what: str) -> dict[str, Any]:
        """The JSON object of a manifest, index or config blob, checked against its descriptor."""
        if descriptor.size > limit:
            raise BadBundle(f"{what} is {descriptor.size:,} bytes, over the {limit:,} a bundle allows")
        data = _read_small(self.blobs / descriptor.sha256, limit, what)
        if len(data) != descriptor.size or hashlib.sha256(data).hexdigest() != descriptor.sha256:
            raise BadBundle(f"{what}: blob {descriptor.sha256[:16]}... does not hold the bytes of its digest and size")
        try:
            document = json.loads(data)
        except ValueError:
            raise BadBundle(f"{what} is not JSON") from None
        if not isinstance(document, dict):
            raise BadBundle(f"{what} is not a JSON object")
        return document

    def artifact(self, descriptor: _Descriptor, what: str) -> Path:
        """The blob file of an artifact layer, of its size and sha256, within the bounds."""
        if descriptor.size > max_unpack_bytes():
            raise BadBundle(f"{what} is {descriptor.size:,} bytes, over TUNECACHE_MAX_UNPACK_BYTES "
                            f"({max_unpack_bytes():,})")
        self.total += descriptor.size
        if self.total > MAX_BUNDLE_BYTES:
            raise BadBundle(f"the bundle's artifacts are over {MAX_BUNDLE_BYTES:,} bytes together")
        path = self.blobs / descriptor.sha256
        fd, size = _open_regular(path, what)
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as f:
            if size != descriptor.size:
                raise BadBundle(f"{what} is {size:,} bytes; its descriptor says {descriptor.size:,}")
            read = 0
            while block := f.read(min(1 << 20, descriptor.size + 1 - read)):
                read += len(block)
                digest.update(block)
                if read > descriptor.size:
                    raise BadBundle(f"{what} grew past its {descriptor.size:,} bytes while it was read")
        if digest.hexdigest() != descriptor.sha256:
            raise BadBundle(f"{what}: its bytes hash to {digest.hexdigest()}, not the digest it is stored under")
        return path


def _descriptors(document: dict[str, Any], key: str, what: str) -> list[_Descriptor]:
    items = document.get(key)
    if not isinstance(items, list):
        raise BadBundle(f"{what} has no list of {key}")
    try:
        return [_Descriptor.model_validate(item) for item in items]
    except ValidationError as exc:
        raise BadBundle(f"{what}: a descriptor is not one ({exc.errors()[0]['msg']})") from None


def _schema_checked(document: dict[str, Any], schema: dict[str, Any], what: str) -> None:
    try:
        jsonschema.validate(document, schema=schema)
    except jsonschema.ValidationError as exc:
        raise BadBundle(f"{what} is not an OCI {schema.get('title', 'document')}: {exc.message[:200]}") from None


def _tagged(root: Path, reader: _Reader, tag: str | None) -> _Descriptor:
    """The bundle's index: the one ``index.json`` names ``tag`` (without a tag: its only entry)."""
    layout = _read_small(root / oras.defaults.oci_layout_file, _MAX_SMALL_FILE_BYTES, "oci-layout")
    try:
        version = json.loads(layout).get("imageLayoutVersion")
    except (ValueError, AttributeError):
        version = None
    if version != oras.defaults.oci_layout_version_pin:
        raise BadBundle(f"{root}: oci-layout does not name image layout {oras.defaults.oci_layout_version_pin}")
    try:
        top = json.loads(_read_small(root / oras.defaults.oci_image_index_file, MAX_MANIFEST_BYTES, "index.json"))
    except ValueError:
        raise BadBundle(f"{root}: index.json is not JSON") from None
    if not isinstance(top, dict):
        raise BadBundle(f"{root}: index.json is not a JSON object")
    _schema_checked(top, oras.schemas.index, "index.json")
    entries = _descriptors(top, "manifests", "index.json")
    named = [e for e in entries if tag is None or e.annotations.get(REF_NAME_ANNOTATION) == tag]
    if len(named) != 1:
        tags = sorted(e.annotations.get(REF_NAME_ANNOTATION, "(untagged)") for e in entries)[:10]
        raise BadBundle(f"{root}: index.json names {'no' if not named else 'several'} "
                        f"{'bundle' if tag is None else f'bundle tagged {tag!r}'} (it has: {', '.join(tags) or 'nothing'})")
    if named[0].mediaType != INDEX_MEDIA_TYPE:
        raise BadBundle(f"{root}: {tag or 'its entry'} is a {named[0].mediaType}, not a bundle (an OCI image index)")
    return named[0]


def read_layout(root: Path, tag: str | None = None) -> list[BundleEntry]:
    """Every run of the bundle in the OCI image layout ``root`` (the index ``index.json``
    names ``tag``; without one, its only entry), each checked as the module says.

    Raises:
        BadBundle: one line naming what is wrong or past which bound; nothing is returned.
    """
    reader = _Reader(root)
    index_descriptor = _tagged(root, reader, tag)
    index = reader.document(index_descriptor, MAX_MANIFEST_BYTES, "the bundle's index")
    _schema_checked(index, oras.schemas.index, "the bundle's index")
    manifests = _descriptors(index, "manifests", "the bundle's index")
    if len(manifests) > MAX_BUNDLE_RUNS:
        raise BadBundle(f"the bundle lists {len(manifests):,} runs; a bundle holds at most {MAX_BUNDLE_RUNS}")
    return [_entry(reader, descriptor, number) for number, descriptor in enumerate(manifests, 1)]


def _entry(reader: _Reader, descriptor: _Descriptor, number: int) -> BundleEntry:
    what = f"run {number} of the bundle"
    if descriptor.mediaType != MANIFEST_MEDIA_TYPE:
        raise BadBundle(f"{what} is a {descriptor.mediaType[:80]}, not an OCI image manifest")
    manifest = reader.document(descriptor, MAX_MANIFEST_BYTES, f"{what}'s manifest")
    _schema_checked(manifest, oras.schemas.manifest, f"{what}'s manifest")
    try:
        config = _Descriptor.model_validate(manifest["config"])
    except ValidationError as exc:
        raise BadBundle(f"{what}'s config is not a descriptor ({exc.errors()[0]['msg']})") from None
    if config.mediaType != RUN_CONFIG_MEDIA_TYPE:
        raise BadBundle(f"{what} is not a tunecache run (its config is a {config.mediaType[:80]})")
    try:
        record = BundledRun.model_validate(reader.document(config, MAX_RUN_CONFIG_BYTES, f"{what}'s record"))
    except ValidationError as exc:
        error = exc.errors()[0]
        raise BadBundle(f"{what}'s record: {'.'.join(map(str, error['loc']))}: {error['msg']}") from None
    what = f"run {record.source_run_id} of the bundle"
    layers = {layer.sha256: layer for layer in _descriptors(manifest, "layers", f"{what}'s manifest")}
    wanted = {artifact.sha256 for artifact in record.run.artifacts}
    if set(layers) != wanted:
        raise BadBundle(f"{what}: its layers are not its artifacts ({len(set(layers) ^ wanted)} differ)")
    files = {sha: reader.artifact(layers[sha], f"{what}'s artifact {sha[:16]}...") for sha in sorted(wanted)}
    return BundleEntry(record=record, files=files)


def total_bytes(entries: Iterable[BundleEntry]) -> int:
    """The bytes of every distinct artifact of ``entries``."""
    return sum(path.stat().st_size for path in {p for e in entries for p in e.files.values()})
