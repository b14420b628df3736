"""Errors of the OpenAI-compatible endpoint, answered OpenAI-shaped:
``{"error": {"message", "type", "code"}}`` (shared by the endpoint and its FastAPI routes)."""


class HTTPError(Exception):
    """A request the endpoint refuses: ``status``, a one-line ``message`` and its ``kind``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class EpisodeLimit(Exception):
    """An episode asked past its limits (answered with HTTP 400, type "episode_limit")."""
