"""Errors of the OpenAI-compatible endpoint, answered OpenAI-shaped:
``{"error": {"message", "type", "param", "code"}}`` (shared by the endpoint and its FastAPI
routes)."""

from __future__ import annotations


class HTTPError(Exception):
    """A request the endpoint refuses: ``status``, a one-line ``message``, its ``kind`` (the
    error's ``type``), the request field at fault (``param``) and OpenAI's machine-readable
    ``code`` (e.g. "context_length_exceeded"), both None when there is none."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code = param, code


class EpisodeLimit(Exception):
    """An episode asked past its limits (answered with HTTP 400, type "episode_limit")."""


def error_body(message: str, kind: str, param: str | None, code: str | None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
