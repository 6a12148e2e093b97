"""HTTP client of the tunecache service (httpx). Raises typed errors a CLI maps to exit codes.

A pod must never hang or crash at boot because of tunecache, so every request has a
connect and a read timeout, and transient failures (connection refused or reset, timeouts,
truncated bodies, 502/503/504) are retried with exponential backoff (tenacity) a bounded
number of times before the typed error is raised.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from tunecache.identity import EnvironmentMetadata, TuningKey

#: Seconds to connect, and to wait for each read, by default.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 30.0
#: Attempts per request (1 = no retry) and the backoff between them (0.5 s, 1 s, 2 s, ... at most 4 s).
DEFAULT_ATTEMPTS = 3
#: Seconds one attempt may take in all, however the server trickles its answer.
DEFAULT_TOTAL_TIMEOUT_S = 120.0
_RETRY_STATUSES = frozenset({502, 503, 504})


class TunecacheError(RuntimeError):
    """Base of the client's errors."""


class ServerUnreachable(TunecacheError):
    """No connection, or the server did not answer in time."""


class ServerError(TunecacheError):
    """The server answered with an error status (other than a lookup's 404)."""

    def __init__(self, status_code: int, detail: Any):
        super().__init__(f"server answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class NoCompatibleTuning(TunecacheError):
    """The server has no tuning usable by this key and environment (a lookup's 404)."""

    def __init__(self, detail: str, closest: list[dict[str, Any]]):
        super().__init__(detail)
        self.detail = detail
        self.closest = closest

    def explain(self) -> str:
        """Multi-line text: the server's reason, then each closest tuning's differing fields."""
        lines = [self.detail]
        for c in self.closest:
            if not isinstance(c, dict):
                continue
            diffs = "; ".join(
                f"{d.get('field')}: stored {d.get('stored')}, yours {d.get('yours')}"
                for d in c.get("differences") or [] if isinstance(d, dict)
            )
            key = c.get("key") if isinstance(c.get("key"), dict) else {}
            lines.append(f"  run {c.get('run_id')} ({key.get('model')}, {key.get('gpu_name')}): {diffs}")
        return "\n".join(lines)


class ArtifactCorrupt(TunecacheError):
    """Downloaded bytes do not hash to the sha256 the server announced."""


class DownloadTruncated(ArtifactCorrupt):
    """The connection closed before the whole body arrived."""


class _Transient(Exception):
    """A failure worth another attempt; carries the error to raise when attempts run out."""

    def __init__(self, error: TunecacheError):
        super().__init__(str(error))
        self.error = error


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` (not JSON, or not an object)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _detail(response: httpx.Response) -> Any:
    body = _json_object(response)
    if body is not None and "detail" in body:
        return body["detail"]
    return response.text[:200] or response.reason_phrase


def _detail_of(body: bytes) -> Any:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace")
    return parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed


class TunecacheClient:
    """Talks to one tunecache server.

    Args:
        base_url: e.g. ``http://tunecache:8321``.
        connect_timeout_s / read_timeout_s: httpx timeouts in seconds (5 s / 30 s).
        attempts: tries per request for transient failures (3).
        total_timeout_s: the most one attempt may take, end to end (120 s): a server that
            sends a byte now and then never trips a read timeout, so bodies are read
            against this deadline too.
        transport: an httpx transport (tests).

    Raises:
        ValueError: ``base_url`` is not an http(s) URL with a host.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        attempts: int = DEFAULT_ATTEMPTS,
        total_timeout_s: float = DEFAULT_TOTAL_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"server URL {base_url!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"server URL {base_url!r} must look like http://host:port")
        self.base_url = base_url.rstrip("/")
        self.attempts = max(1, attempts)
        self.read_timeout_s = read_timeout_s
        self.total_timeout_s = total_timeout_s
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TunecacheClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _classify(self, exc: httpx.HTTPError) -> TunecacheError:
        """Name the failure a pod hit, in words an operator can act on."""
        where = f"tunecache server {self.base_url}"
        if isinstance(exc, httpx.ConnectTimeout):
            return ServerUnreachable(f"{where} unreachable: no connection within the connect timeout")
        if isinstance(exc, httpx.ConnectError):
            return ServerUnreachable(f"{where} unreachable: {exc}")
        if isinstance(exc, httpx.ReadTimeout):
            return ServerUnreachable(f"{where} accepted the connection but sent no answer within {self.read_timeout_s:g} s")
        if isinstance(exc, httpx.RemoteProtocolError):
            return DownloadTruncated(f"{where} closed the connection before the whole answer arrived: {exc}")
        return ServerUnreachable(f"{where} unreachable: {type(exc).__name__}: {exc}")

    def _retrying(self, attempt_once):
        """Run ``attempt_once`` with retries for :class:`_Transient`; raise its error at the end."""
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_exponential(multiplier=0.5, max=4),
                retry=retry_if_exception_type(_Transient),
                reraise=True,
            ):
                with attempt:
                    return attempt_once()
        except _Transient as transient:
            error = transient.error
            if self.attempts > 1:
                error.args = (f"{error} (after {self.attempts} attempts)",)
            raise error from None

    def _read_body(self, response: httpx.Response, deadline: float, sink=None) -> bytes:
        """Read a streamed body before ``deadline`` (monotonic seconds); ``sink`` sees each part."""
        parts = []
        for part in response.iter_bytes():
            if time.monotonic() > deadline:
                raise _Transient(ServerUnreachable(
                    f"tunecache server {self.base_url} answered too slowly: no complete answer within {self.total_timeout_s:g} s"
                ))
            if sink is not None:
                sink(part)
            parts.append(part)
        return b"".join(parts)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def once() -> httpx.Response:
            deadline = time.monotonic() + self.total_timeout_s
            try:
                with self._http.stream(method, path, **kwargs) as response:
                    body = self._read_body(response, deadline)
            except httpx.HTTPError as exc:
                raise _Transient(self._classify(exc)) from None
            headers = [(k, v) for k, v in response.headers.items() if k.lower() not in ("content-encoding", "content-length")]
            response = httpx.Response(response.status_code, headers=headers, content=body, request=response.request)
            if response.status_code in _RETRY_STATUSES:
                raise _Transient(ServerError(response.status_code, _detail(response)))
            return response

        return self._retrying(once)

    def _checked(self, response: httpx.Response) -> httpx.Response:
        if response.is_error:
            raise ServerError(response.status_code, _detail(response))
        return response

    def lookup(self, key: TuningKey, environment: EnvironmentMetadata) -> dict[str, Any]:
        """``POST /v1/tunings/lookup``: the current tuning run (JSON) for this key and environment.

        Raises:
            NoCompatibleTuning: 404, with the closest stored tunings and their differences.
            ServerUnreachable, ServerError.
        """
        response = self._request(
            "POST", "/v1/tunings/lookup", json={"key": key.model_dump(), "environment": environment.model_dump()}
        )
        body = _json_object(response)
        if response.status_code == 404 and body is not None and isinstance(body.get("closest"), list):
            raise NoCompatibleTuning(str(body.get("detail", "no compatible tuning")), body["closest"])
        self._checked(response)
        if body is None or not isinstance(body.get("id"), int) or not isinstance(body.get("artifacts"), list) \
                or not all(isinstance(a, dict) and {"kind", "sha256"} <= a.keys() for a in body["artifacts"]):
            raise ServerError(response.status_code, f"not a tunecache answer: {response.text[:200]!r}")
        body.setdefault("summary", {})
        return body

    def download_artifact(self, sha256: str) -> bytes:
        """``GET /v1/artifacts/{sha256}``, streamed and verified against ``sha256``.

        Raises:
            DownloadTruncated: the body stopped short (after retries).
            ArtifactCorrupt: the bytes hash to something else (nothing is returned).
            ServerUnreachable, ServerError.
        """

        def once() -> bytes:
            digest = hashlib.sha256()
            deadline = time.monotonic() + self.total_timeout_s
            try:
                with self._http.stream("GET", f"/v1/artifacts/{sha256}") as response:
                    if response.status_code in _RETRY_STATUSES or response.is_error:
                        error = ServerError(response.status_code, _detail_of(self._read_body(response, deadline)))
                        raise _Transient(error) if response.status_code in _RETRY_STATUSES else error
                    expected = response.headers.get("content-length")
                    data = self._read_body(response, deadline, sink=digest.update)
            except httpx.HTTPError as exc:
                raise _Transient(self._classify(exc)) from None
            if expected is not None and len(data) != int(expected):
                raise _Transient(DownloadTruncated(f"artifact {sha256}: received {len(data)} of {expected} bytes"))
            if digest.hexdigest() != sha256:
                raise ArtifactCorrupt(f"artifact {sha256} arrived as {len(data)} bytes hashing to {digest.hexdigest()}")
            return data

        return self._retrying(once)

    def upload_file(self, path: Path) -> str:
        """Upload a file's bytes streamed from disk (never whole in memory), unless the
        server already has them (``HEAD``); returns the sha256.

        Raises:
            ServerUnreachable, ServerError.
        """
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        sha256 = digest.hexdigest()
        if self._request("HEAD", f"/v1/artifacts/{sha256}").status_code == 200:
            return sha256

        def once() -> httpx.Response:
            try:
                with path.open("rb") as f:
                    response = self._http.put(f"/v1/artifacts/{sha256}", content=f)
            except httpx.HTTPError as exc:
                raise _Transient(self._classify(exc)) from None
            if response.status_code in _RETRY_STATUSES:
                raise _Transient(ServerError(response.status_code, _detail(response)))
            return response

        self._checked(self._retrying(once))
        return sha256

    def upload_artifact(self, data: bytes) -> str:
        """``PUT /v1/artifacts/{sha256}``; returns the sha256. Idempotent."""
        digest = hashlib.sha256(data).hexdigest()
        self._checked(self._request("PUT", f"/v1/artifacts/{digest}", content=data))
        return digest

    def record_run(self, run: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/tunings`` with a run (see the service's ``TuningRunCreate``); returns the stored run."""
        return self._checked(self._request("POST", "/v1/tunings", json=run)).json()

    def create_job(
        self,
        key: TuningKey,
        hf_config: dict[str, Any] | None = None,
        gemm_backends: list[str] | None = None,
        stages: list[str] | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/tuning-jobs``: queue a tuning of ``key`` (or get the one already queued/running)."""
        body: dict[str, Any] = {"key": key.model_dump()}
        for name, value in (("hf_config", hf_config), ("gemm_backends", gemm_backends), ("stages", stages)):
            if value is not None:
                body[name] = value
        return self._checked(self._request("POST", "/v1/tuning-jobs", json=body)).json()

    def get_job(self, job_id: int) -> dict[str, Any]:
        """``GET /v1/tuning-jobs/{id}``: status, stage, step/total, log tail, timings."""
        return self._checked(self._request("GET", f"/v1/tuning-jobs/{job_id}")).json()


def client_from_environment(url: str) -> TunecacheClient:
    """A client whose timeouts and retries come from ``TUNECACHE_CONNECT_TIMEOUT``,
    ``TUNECACHE_READ_TIMEOUT``, ``TUNECACHE_TOTAL_TIMEOUT`` (seconds) and ``TUNECACHE_ATTEMPTS``.

    Raises:
        ValueError: a bad URL, or a variable that is not a positive number (named).
    """
    import os

    def number(name: str, default: float, kind=float):
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a {'whole ' if kind is int else ''}number") from None
        if value <= 0:
            raise ValueError(f"{name}={raw!r} must be positive")
        return value

    return TunecacheClient(
        url,
        connect_timeout_s=number("TUNECACHE_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S),
        read_timeout_s=number("TUNECACHE_READ_TIMEOUT", DEFAULT_READ_TIMEOUT_S),
        total_timeout_s=number("TUNECACHE_TOTAL_TIMEOUT", DEFAULT_TOTAL_TIMEOUT_S),
        attempts=number("TUNECACHE_ATTEMPTS", DEFAULT_ATTEMPTS, int),
    )
