"""Request body size limit (HTTP 413), for declared and for streamed (chunked) bodies."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    """ASGI middleware: answer 413 with a JSON body when a request body exceeds ``max_bytes``.

    A ``Content-Length`` above the limit is refused before the body is read; a body
    without one is counted as it streams in.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Send, received: str) -> None:
        body = json.dumps(
            {"detail": f"request body {received} exceeds the upload limit of {self.max_bytes} bytes "
                       "(setting TUNECACHE_MAX_UPLOAD_BYTES)"}
        ).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, f"of {int(declared)} bytes")
            return
        seen = 0
        too_large = False
        answered = False

        async def counting_receive() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # Whatever the app makes of a body cut short (FastAPI answers 400 "error
            # parsing the body"), the client gets the 413.
            nonlocal answered
            if too_large:
                if not answered:
                    answered = True
                    await self._reject(send, "streamed")
                return
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            if not answered:
                answered = True
                await self._reject(send, "streamed")
