"""Bearer tokens with roles, checked for every call before its handler runs (server/security.py has the rules).

One interceptor on the gRPC server sees every call, unary or streaming, of
every service: a refused call is answered UNAUTHENTICATED (no token, or one
the server does not know) or PERMISSION_DENIED (a token whose role is too
low) before its request is read, so it changes nothing. It is installed only
when the server has a token at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from streamtx.server.security import HOW_TO_SEND, Tokens, covers, role_needed

BEARER = "bearer "


def _article(role: str) -> str:
    return "an" if role[0] in "aeiou" else "a"


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        needed = role_needed(details.method)
        handler = await continuation(details)
        if needed is None or handler is None:
            return handler
        refusal = self.refusal(details, needed)
        if refusal is None:
            return handler
        return _refusing(handler, *refusal)

    def refusal(self, details: grpc.HandlerCallDetails, needed: str) -> tuple[grpc.StatusCode, str] | None:
        """Why the call may not go on (its status and message), None if its token's role covers the verb."""
        verb = details.method.rpartition("/")[2]
        given = ""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value if isinstance(value, str) else value.decode("ascii", "replace")
                break
        what = f"{verb} is {_article(needed)} {needed} verb and this server requires a token"
        if not given:
            return grpc.StatusCode.UNAUTHENTICATED, f"{what} (no token given); {HOW_TO_SEND}"
        role = self.tokens.role_of(given[len(BEARER) :]) if given[: len(BEARER)].lower() == BEARER else None
        if role is None:
            return grpc.StatusCode.UNAUTHENTICATED, f"{what} (wrong token); {HOW_TO_SEND}"
        if not covers(role, needed):
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"{verb} is {_article(needed)} {needed} verb and the token given has role {role}; "
                f"{HOW_TO_SEND.replace('<token>', f'<token of role {needed} or higher>')}",
            )
        return None


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call with `code` without reading its request."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    kwargs = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)


__all__ = ["TokenInterceptor"]
