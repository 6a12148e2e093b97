"""A bundle of runs (:mod:`tunecache.client.oci_bundle`) in an OCI registry, through ORAS's
Python library (oras-py): :func:`push_layout` copies a bundle's layout to a registry with
``oras.layout.layout.Layout.push_to_registry``, :func:`pull_layout` copies one from a
registry into a layout with ``Layout.pull_from_registry``, which :func:`tunecache.client.oci_bundle.read_layout`
then checks as any layout.

The registry is reached through :class:`BoundedRegistry`, oras-py's ``Registry`` (its
authentication: the credentials ``docker login`` or ``oras login`` stored) with what a pod
command needs besides: every request has a timeout, nothing is retried behind the caller's
back, an answer read whole (a manifest) is read to at most
:data:`~tunecache.client.oci_bundle.MAX_MANIFEST_BYTES`, and blobs are downloaded to at most
``TUNECACHE_MAX_UNPACK_BYTES`` each, :data:`~tunecache.client.oci_bundle.MAX_BUNDLE_BYTES`
and :data:`~tunecache.client.oci_bundle.MAX_LAYOUT_FILES` together.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import oras.auth
import oras.defaults
import oras.logger
import oras.provider
import requests
from oras.layout.layout import Layout, NewLayoutFromRegistry

from tunecache.client.oci_bundle import (
    DEFAULT_TAG,
    INDEX_MEDIA_TYPE,
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_RUNS,
    MAX_LAYOUT_FILES,
    MAX_MANIFEST_BYTES,
    BadBundle,
)
from tunecache.formats.tarball import max_unpack_bytes
from tunecache.store import ServerUnreachable, TunecacheError

# oras-py logs a registry's error messages itself; the command says them in its one line
logging.getLogger(oras.logger.__name__).addHandler(logging.NullHandler())
logging.getLogger(oras.logger.__name__).propagate = False

#: Seconds to connect to a registry and between two reads of its answer.
REGISTRY_TIMEOUT_S = 30.0
_undecorated_request = oras.provider.Registry.do_request.__wrapped__


class RegistryError(TunecacheError):
    """The registry answered with an error; the message is one line naming the registry and
    what it said."""


class RegistryRefused(RegistryError):
    """The registry refused the credentials (or their absence): 401/403."""


class BoundedRegistry(oras.provider.Registry):
    """oras-py's registry client, bounded as the module says; ``plain_http``: the registry
    speaks HTTP, not HTTPS (a registry inside the cluster, or the tests')."""

    def __init__(self, plain_http: bool = False, timeout: float = REGISTRY_TIMEOUT_S):
        super().__init__(insecure=plain_http)
        request = self.session.request

        def with_timeout(method: str, url: str, **kwargs: Any) -> requests.Response:
            kwargs.setdefault("timeout", timeout)
            return request(method, url, **kwargs)

        self.session.request = with_timeout  # type: ignore[method-assign]  # oras' auth shares this session
        self.blob_bytes = 0
        self.blob_files = 0
        #: The messages of the registry's last error answer (OCI's ``errors[].message``).
        self.errors: list[str] = []

    def _parse_response_errors(self, response: requests.Response) -> None:
        """Keep the registry's error messages for the one line the command says (oras-py logs them)."""
        try:
            errors = response.json().get("errors", [])
            self.errors = [" ".join(str(e["message"]).split())[:200] for e in errors if isinstance(e, dict)
                           and "message" in e][:3]
        except (ValueError, AttributeError, TypeError):
            self.errors = []

    def do_request(self, url: str, method: str = "GET", data: Any = None, headers: dict | None = None,
                   json: dict | None = None, stream: bool = False) -> requests.Response:
        """oras-py's request (authentication included) once, without its retries; an answer
        the caller reads whole is read here, to at most ``MAX_MANIFEST_BYTES``."""
        response = _undecorated_request(self, url, method, data, headers, json, stream=True)
        if stream:
            return response
        body = bytearray()
        with response:
            for chunk in response.iter_content(chunk_size=65536):
                body += chunk
                if len(body) > MAX_MANIFEST_BYTES:
                    raise BadBundle(f"the registry's answer to {method} {url[:120]} is over {MAX_MANIFEST_BYTES:,} bytes")
        response._content = bytes(body)
        response._content_consumed = True
        return response

    def download_blob(self, container: Any, digest: str, outfile: str) -> str:
        """A blob into ``outfile``, streamed, within the bounds (checked against its digest
        later, by the layout's reader)."""
        self.blob_files += 1
        if self.blob_files > MAX_LAYOUT_FILES:
            raise BadBundle(f"the bundle in the registry has over {MAX_LAYOUT_FILES:,} blobs")
        limit = max_unpack_bytes()
        os.makedirs(os.path.dirname(outfile), exist_ok=True)
        written = 0
        with self.get_blob(container, digest, stream=True) as response, open(outfile, "wb") as f:
            _checked(response, f"blob {digest[:23]}")
            for chunk in response.iter_content(chunk_size=1 << 20):
                written += len(chunk)
                self.blob_bytes += len(chunk)
                if written > limit:
                    raise BadBundle(f"blob {digest[:23]}... is over TUNECACHE_MAX_UNPACK_BYTES ({limit:,})")
                if self.blob_bytes > MAX_BUNDLE_BYTES:
                    raise BadBundle(f"the bundle in the registry is over {MAX_BUNDLE_BYTES:,} bytes")
                f.write(chunk)
        return outfile


def _checked(response: requests.Response, what: str) -> None:
    if response.status_code in (401, 403):
        raise RegistryRefused(f"the registry refused {what} ({response.status_code}): credentials missing or not "
                              "allowed (docker login or oras login stores them)")
    if response.status_code >= 400:
        raise RegistryError(f"the registry answered {response.status_code} for {what}")


def _errors(reference: str, provider: BoundedRegistry, call):
    """Run ``call``; a registry's trouble becomes a :class:`tunecache.store.TunecacheError` of one line."""
    try:
        return call()
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise ServerUnreachable(f"registry of {reference} unreachable: {type(exc).__name__}") from None
    except oras.auth.AuthenticationException as exc:
        raise RegistryRefused(f"registry of {reference}: {exc}") from None
    except TunecacheError:
        raise
    except (ValueError, requests.RequestException) as exc:  # oras-py's answer to an error status
        said = "; ".join(provider.errors) or " ".join(str(exc).split())[:300]
        if isinstance(exc, ValueError) and "authentication" in str(exc):
            raise RegistryRefused(f"registry of {reference}: credentials missing or not allowed "
                                  "(docker login or oras login stores them)") from None
        raise RegistryError(f"registry of {reference}: {said}") from None


def split_reference(reference: str) -> tuple[str, str]:
    """``registry/repository:tag`` -> (``registry/repository``, ``tag``); a reference
    without a tag takes :data:`~tunecache.client.oci_bundle.DEFAULT_TAG`.

    Raises:
        BadBundle: not a reference of a registry (no ``/``), or one by digest.
    """
    if "@" in reference or "/" not in reference or any(c.isspace() for c in reference):
        raise BadBundle(f"{reference[:120]!r} is not a registry reference: REGISTRY/REPOSITORY[:TAG], "
                        "e.g. registry.example:5000/tunecache/runs:2026-12")
    name, _, tag = reference.rpartition(":")
    if "/" in tag or not name:  # the colon was the registry's port
        return reference, DEFAULT_TAG
    return name, tag


def push_layout(root: Path, reference: str, plain_http: bool = False, tag: str = DEFAULT_TAG) -> None:
    """Copy the bundle tagged ``tag`` in the layout ``root`` to ``reference``
    (``REGISTRY/REPOSITORY[:TAG]``) with oras-py.

    Raises:
        ServerUnreachable, RegistryError (RegistryRefused), BadBundle (a bad reference).
    """
    name, target_tag = split_reference(reference)
    provider = BoundedRegistry(plain_http=plain_http)
    response = _errors(reference, provider,
                       lambda: Layout(str(root)).push_to_registry(provider, f"{name}:{target_tag}", tag=tag))
    _checked(response, f"the bundle's index ({reference})")


def pull_layout(reference: str, root: Path, plain_http: bool = False) -> None:
    """Copy the bundle at ``reference`` into a new layout ``root`` (tagged
    :data:`~tunecache.client.oci_bundle.DEFAULT_TAG` there) with oras-py, within the bounds.

    Raises:
        ServerUnreachable, RegistryError (RegistryRefused), BadBundle: what is there is not a
        bundle (no OCI image index, or one of over ``MAX_BUNDLE_RUNS`` runs) or goes past a bound.
    """
    name, tag = split_reference(reference)
    provider = BoundedRegistry(plain_http=plain_http)

    def pull() -> None:
        index = provider.get_manifest(f"{name}:{tag}", allowed_media_type=[INDEX_MEDIA_TYPE])
        if index.get("mediaType") != INDEX_MEDIA_TYPE:
            raise BadBundle(f"{reference} is a {str(index.get('mediaType'))[:80]}, not a bundle (an OCI image index)")
        if len(index.get("manifests") or []) > MAX_BUNDLE_RUNS:
            raise BadBundle(f"{reference} lists over {MAX_BUNDLE_RUNS} runs; a bundle holds at most that")
        NewLayoutFromRegistry(str(root), provider, f"{name}:{tag}", tag=DEFAULT_TAG)

    _errors(reference, provider, pull)
