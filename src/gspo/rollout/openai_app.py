"""The FastAPI routes of :class:`gspo.rollout.openai_server.OpenAIEndpoint` (imported only when
the endpoint starts: FastAPI is the optional extra ``serve``). No ``from __future__ import
annotations`` here: FastAPI reads the handlers' annotations at run time."""

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from .openai_errors import HTTPError

KINDS = {404: "not_found_error", 405: "invalid_request_error", 500: "server_error"}


def build_app(endpoint: Any) -> FastAPI:
    """Routes at the top level and under ``/episodes/{episode}``; every error OpenAI-shaped
    (unknown routes and methods included)."""
    app = FastAPI(title="gspo rollout endpoint")

    def refuse(err: HTTPError) -> JSONResponse:
        return JSONResponse(endpoint.error(err), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, exc: HTTPException):
        message = f"{exc.detail}: {request.method} {request.url.path}"
        return refuse(
            HTTPError(exc.status_code, message, KINDS.get(exc.status_code, "invalid_request_error"))
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return refuse(HTTPError(400, f"invalid request: {exc.errors()[:1]}"))

    async def call(handler, episode, request: Request):
        try:
            try:
                body = await request.json()
            except ValueError:
                raise HTTPError(400, "the request body is not JSON") from None
            if not isinstance(body, dict):
                raise HTTPError(400, "the request body must be a JSON object")
            answer = await handler(episode, body)
        except HTTPError as err:
            return refuse(err)
        except Exception as err:  # the engine failed: the client gets the reason
            return refuse(HTTPError(500, f"{type(err).__name__}: {err}", "server_error"))
        if isinstance(answer, dict):
            return answer
        return StreamingResponse(answer, media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await call(endpoint.chat, None, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await call(endpoint.completions, None, request)

    @app.get("/v1/models")
    async def models():
        return endpoint.models()

    @app.post("/episodes/{episode}/v1/chat/completions")
    async def episode_chat(episode: str, request: Request):
        return await call(endpoint.chat, episode, request)

    @app.post("/episodes/{episode}/v1/completions")
    async def episode_completions(episode: str, request: Request):
        return await call(endpoint.completions, episode, request)

    @app.get("/episodes/{episode}/v1/models")
    async def episode_models(episode: str):
        return endpoint.models()

    return app
