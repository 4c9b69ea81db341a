"""The errors this package raises: one hierarchy under `LivegateError`.

An answer of the server that is not a success becomes an `ApiError` (a subclass chosen by
its HTTP status) carrying the server's JSON error `code`, `message`, `status` and, when the
request named one, `room`. Match on `code` (stable), never on `message` (for people).
"""

from __future__ import annotations

from typing import Any


class LivegateError(Exception):
    """Base of every error this package raises."""


class ApiError(LivegateError):
    """The server refused a request: `{"error":{"code","message","room"?}}` with `status`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        room: str | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.room = room
        #: The whole decoded error body (extra fields such as `url`/`node` of `wrong_node`).
        self.body = body
        #: Seconds of a `Retry-After` header, when the answer had one.
        self.retry_after = retry_after


class BadRequestError(ApiError):
    """400: the request is malformed (bad room name, limit too high, unknown cell...)."""


class AuthenticationError(ApiError):
    """401: the API key, token or resume credential was refused."""


class ForbiddenError(ApiError):
    """403: the credential may not do this."""


class NotFoundError(ApiError):
    """404: no such route or object (also `presence_off`)."""


class ConflictError(ApiError):
    """409: the server's state does not allow this now."""


class PayloadTooLargeError(ApiError):
    """413: event data or state over the server's limit."""


class RateLimitedError(ApiError):
    """429: too many requests, or a migration budget spent; see `retry_after`."""


class ServerError(ApiError):
    """5xx: the server could not do it now (retried for idempotent calls)."""


class TransportError(LivegateError):
    """The server could not be reached (or the connection broke) after every retry."""


class WebhookVerificationError(LivegateError):
    """A webhook's `X-Livegate-Signature` is missing or does not match its body."""


class SubscriberClosed(LivegateError):
    """The subscriber stopped for good: `close()` was called, or the server said not to
    come back (close codes 4500-4999: `code` and `reason` say which)."""

    def __init__(self, message: str, *, code: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class SubscriptionRefused(LivegateError):
    """The server refused a room for good (`forbidden`, `bad_room`, ...): `code`, `room`."""

    def __init__(self, room: str, code: str, message: str) -> None:
        super().__init__(f"{room}: {code}: {message}")
        self.room = room
        self.code = code
        self.message = message


class RequestRefused(LivegateError):
    """The server refused a request made over the subscriber's connection (an `error`
    frame: `forbidden`, `bad_room`, `payload_too_large`, `rate_limited`, ...)."""

    def __init__(self, code: str, message: str, room: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.room = room


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitedError,
}


def api_error(status: int, body: Any, retry_after: float | None = None) -> ApiError:
    """The `ApiError` subclass for an answer with `status` and decoded JSON `body`
    (anything: a body that is not livegate's error shape keeps `code` "http_<status>")."""
    code = f"http_{status}"
    message = ""
    room: str | None = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", code))
        message = str(error.get("message", ""))
        room = error.get("room") if isinstance(error.get("room"), str) else None
    elif isinstance(body, str):
        message = body[:500]
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    return cls(status, code, message, room=room, body=body, retry_after=retry_after)
