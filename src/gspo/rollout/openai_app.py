"""The FastAPI routes of :class:`gspo.rollout.openai_server.OpenAIEndpoint` (imported only when
the endpoint starts: FastAPI is the optional extra ``serve``). No ``from __future__ import
annotations`` here: FastAPI reads the handlers' annotations at run time."""

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .openai_errors import HTTPError


def build_app(endpoint: Any) -> FastAPI:
    """Routes at the top level and under ``/episodes/{episode}``; errors OpenAI-shaped."""
    app = FastAPI(title="gspo rollout endpoint")

    async def call(handler, episode, request: Request):
        try:
            try:
                body = await request.json()
            except ValueError:
                raise HTTPError(400, "the request body is not JSON") from None
            if not isinstance(body, dict):
                raise HTTPError(400, "the request body must be a JSON object")
            return await handler(episode, body)
        except HTTPError as err:
            error = {"message": err.message, "type": err.kind, "code": err.kind}
            return JSONResponse({"error": error}, status_code=err.status)
        except Exception as err:  # the engine failed: the client gets the reason
            error = {"message": f"{type(err).__name__}: {err}", "type": "server_error"}
            return JSONResponse({"error": error}, status_code=500)

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
