"""HTTP client of the tunecache service (httpx). Raises typed errors a CLI maps to exit codes."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from tunecache.identity import EnvironmentMetadata, TuningKey

DEFAULT_TIMEOUT = httpx.Timeout(10.0, read=120.0)


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
            diffs = "; ".join(f"{d['field']}: stored {d['stored']}, yours {d['yours']}" for d in c["differences"])
            lines.append(f"  run {c['run_id']} ({c['key']['model']}, {c['key']['gpu_name']}): {diffs}")
        return "\n".join(lines)


class ArtifactCorrupt(TunecacheError):
    """Downloaded bytes do not hash to the sha256 the server announced."""


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


class TunecacheClient:
    """Talks to one tunecache server.

    Args:
        base_url: e.g. ``http://tunecache:8321``.
        timeout: httpx timeout (default: 10 s to connect, 120 s to read).
        transport: an httpx transport (tests, retries).
    """

    def __init__(self, base_url: str, timeout: httpx.Timeout = DEFAULT_TIMEOUT, transport: httpx.BaseTransport | None = None):
        """Raises ValueError when ``base_url`` is not an http(s) URL with a host."""
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"server URL {base_url!r} must look like http://host:port")
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TunecacheClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise ServerUnreachable(f"tunecache server {self.base_url} unreachable: {type(exc).__name__}: {exc}") from None

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
        if body is None:
            raise ServerError(response.status_code, f"not a tunecache answer: {response.text[:200]!r}")
        return body

    def download_artifact(self, sha256: str) -> bytes:
        """``GET /v1/artifacts/{sha256}``, verified against ``sha256``.

        Raises:
            ArtifactCorrupt: the bytes hash to something else (nothing is returned).
            ServerUnreachable, ServerError.
        """
        data = self._checked(self._request("GET", f"/v1/artifacts/{sha256}")).content
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise ArtifactCorrupt(f"artifact {sha256} arrived as {len(data)} bytes hashing to {actual}")
        return data

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
