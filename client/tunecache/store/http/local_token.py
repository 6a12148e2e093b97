"""The admin token of a ``tunecache serve`` on this machine, sent to that service only.

The service leaves its admin token in its data dir with a record of where it listens
(:mod:`tunecache.formats.local_token`). For a server URL on this machine, a client takes a
token file whose record lists an address that URL reaches (:func:`~tunecache.formats.local_token.reaches`),
asks the server to prove it holds that token (``GET /v1/token-proof``: an HMAC of a random
challenge and the address it listens on, keyed with the sha256 of the token's secret,
:func:`tunecache.contract.tokens.token_proof`), and sends the token only when the proof
matches. Another listener (another port, another address, a process that took the port of a
stopped service, one relaying the real service's answers) or another service gets no token,
and what it learns is the token's id, which is no secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from tunecache.contract.tokens import TokenProof, token_proof
from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.formats.local_token import Listener, reaches, read_record, read_token, token_files

_TOKEN = re.compile(r"^tc_([0-9a-f]{16})_([A-Za-z0-9_-]{20,128})$")
#: The most token files whose service is asked for a proof, per server URL.
MAX_PROOFS = 4


@dataclass(frozen=True)
class LocalToken:
    """The local admin token for a server URL: ``token`` and its file, or, where the data
    dir held token files but none is that server's, why none is sent (``why_not``)."""

    token: str | None = None
    path: Path | None = None
    why_not: str | None = None


@calls(routes.TOKEN_PROOF)
def _proved(client: httpx.Client, server_url: str, token: str, listener: Listener) -> bool:
    """Whether the service at ``server_url`` proves it holds ``token`` listening at ``listener``."""
    match = _TOKEN.match(token)
    if match is None:
        return False
    challenge = secrets.token_hex(32)
    try:
        method, path = routes.TOKEN_PROOF.call()
        answer = client.request(method, f"{server_url.rstrip('/')}{path}",
                                params={"token_id": match[1], "challenge": challenge})
        if answer.status_code != 200 or len(answer.content) > 4096:
            return False
        proof = TokenProof.model_validate_json(answer.content).proof
    except (httpx.HTTPError, ValidationError):
        return False
    expected = token_proof(hashlib.sha256(match[2].encode()).hexdigest(), challenge, listener.host, listener.port)
    return hmac.compare_digest(proof, expected)


def local_admin_token(server_url: str, data_dir: Path, *, timeout: httpx.Timeout, verify) -> LocalToken:
    """The admin token a ``tunecache serve`` on this machine left in ``data_dir``, for
    ``server_url`` (a server on this machine), when the service there proves it holds it.
    ``verify``: httpx's TLS verification (an ``ssl.SSLContext`` or ``True``)."""
    url = urlsplit(server_url)
    try:
        port = url.port
    except ValueError:
        return LocalToken()
    files = token_files(data_dir)
    if not files:
        return LocalToken()
    candidates: list[tuple[Path, Listener]] = []
    elsewhere: list[str] = []
    for path in files:
        record = read_record(path)
        if record is None:
            continue
        listener = next((known for known in reversed(record.listeners)
                         if reaches(known, url.scheme, url.hostname or "", port)), None)
        if listener is not None:
            candidates.append((path, listener))
        else:
            elsewhere.extend(known.url for known in record.listeners[-1:])
    with httpx.Client(timeout=timeout, verify=verify, follow_redirects=False) as client:
        for path, listener in candidates[:MAX_PROOFS]:
            token = read_token(path)
            if token is not None and _proved(client, server_url, token, listener):
                return LocalToken(token=token, path=path)
    if candidates:
        shown = ", ".join(str(path) for path, _ in candidates[:MAX_PROOFS])
        return LocalToken(why_not=f"the service at {server_url} did not prove it holds the admin token in {shown}")
    if elsewhere:
        return LocalToken(why_not=f"the admin token(s) in {data_dir} are sent only to the service that wrote them "
                                  f"(listening at {', '.join(elsewhere[:4])})")
    return LocalToken(why_not=f"the admin token(s) in {data_dir} name no service (a tunecache serve of this "
                              f"version adds the record beside them at its next start)")
