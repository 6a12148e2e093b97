"""Whether this pod takes a run at all: the one decision ``pull``, the vLLM plugin (through
:func:`tunecache.client.install.fetch_tuning`) and ``tunecache doctor`` (through
:func:`tunecache.client.preflight.preflight`) all ask (:func:`trusted_signer`): signed by a
trusted key over this pod's key and environment, and not older than a run this pod installed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tunecache.client.installed import newest_installed
from tunecache.contract import EnvironmentMetadata, TuningKey, TuningRunRead
from tunecache.formats.dependencies import image_of
from tunecache.signing import UntrustedRun, verify_run


def trusted_signer(run: TuningRunRead, key: TuningKey, environment: EnvironmentMetadata,
                   trusted_keys: Mapping[str, Ed25519PublicKey] | None, variant: str | None = None) -> str | None:
    """The one decision whether this pod takes ``run`` at all: ``pull`` and the vLLM plugin
    (through :func:`fetch_tuning`) and ``tunecache doctor`` (through
    :func:`tunecache.client.preflight.preflight`) all ask it. Without ``trusted_keys``:
    ``None`` (the tactics install, nothing executable). With them: the id of the trusted key
    that signed the run over this pod's key and environment (:func:`tunecache.signing.verify_run`),
    after :func:`_not_older` for ``variant``.

    Raises:
        UntrustedRun: ``tuning run N refused: <why>``, the why (unsigned, signed by another key,
            a manifest that does not match, a replayed older run) also as its ``__cause__``.
    """
    if not trusted_keys:
        return None
    try:
        signed_by = verify_run(run.signature, key, environment, run.artifacts, trusted_keys, run.summary)
        if signed_by is not None:
            _not_older(run, key, environment, variant if variant and run.variant == variant else None)
    except UntrustedRun as exc:
        raise UntrustedRun(f"tuning run {run.id} refused: {exc}") from exc
    return signed_by


def _not_older(run: TuningRunRead, key: TuningKey, environment: EnvironmentMetadata, variant: str | None = None) -> None:
    """Refuse a signed run signed before one this pod installed for the key
    (:mod:`tunecache.client.installed`; of the run's image, where it records one): pods never move backwards unless a signer signed
    the move (``tunecache promote RUN --signing-key KEY`` signs the older run anew).

    Raises:
        UntrustedRun: it is older, or undated (a format-1 signature) after a dated one.
    """
    newest = newest_installed(key, environment, variant, image_of(run.summary.get("dependencies")))
    if newest is None:
        return
    signed_at = run.signature.signed_at if run.signature is not None else None
    if signed_at is None or signed_at < newest:
        when = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")  # noqa: E731
        raise UntrustedRun(f"it was signed {'at ' + when(signed_at) if signed_at is not None else 'without a date'}, "
                           f"before the run this pod installed for the key (signed at {when(newest)}): a replayed older "
                           "run; to roll back, sign it anew (tunecache promote RUN --signing-key KEY)")
