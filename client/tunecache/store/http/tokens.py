"""Bearer tokens (``/v1/tokens``, admin): create, list and revoke them."""

from __future__ import annotations

from pydantic import ValidationError

from tunecache.store.http.answers import answer_detail
from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.transport import Transport
from tunecache.contract import Scope, TokenCreate, TokenCreated, TokenRead
from tunecache.store import TunecacheError


class TokensClient(Transport):
    """The tokens of a tunecache server (:mod:`tunecache.service.routes.tokens`)."""

    @calls(routes.CREATE_TOKEN)
    def create_token(self, name: str, scope: Scope) -> TokenCreated:
        """``POST /v1/tokens`` (admin): a new token; its secret is in the answer only.

        Raises:
            ServerError: 409 when the name is taken, 401/403 without an admin token.
            ServerUnreachable.
        """
        body = TokenCreate(name=name, scope=scope).model_dump_json()
        response = self._request(*routes.CREATE_TOKEN.call(), content=body, headers={"Content-Type": "application/json"})
        return self._answer(response, TokenCreated)

    @calls(routes.LIST_TOKENS)
    def list_tokens(self) -> list[TokenRead]:
        """``GET /v1/tokens`` (admin): every token, without secrets."""
        response = self._request(*routes.LIST_TOKENS.call())
        if response.status_code != 200:
            raise self.error_of(response.status_code, answer_detail(response))
        try:
            return [TokenRead.model_validate(item) for item in response.json()]
        except (ValueError, ValidationError) as exc:
            raise TunecacheError(f"unexpected answer from {self.base_url}: {str(exc).splitlines()[0]}") from None

    @calls(routes.REVOKE_TOKEN)
    def revoke_token(self, name: str) -> TokenRead:
        """``DELETE /v1/tokens/{name}`` (admin). Raises ServerError (404: no such token)."""
        return self._answer(self._request(*routes.REVOKE_TOKEN.call(name=name)), TokenRead)
