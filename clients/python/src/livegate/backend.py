"""The backend client: livegate's HTTP API with the API key, sync (`Livegate`) and asyncio
(`AsyncLivegate`), the same methods and answers in both.

`publish` and `send_message` always send an event `id` (a random one unless given), so a
retry after a lost answer cannot store the event twice: the server answers a repeated id
with the first event's seq and `duplicate=True`. They, and the reads, are retried on
connection errors and 5xx answers with full-jitter exponential backoff; other refusals
raise at once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from .errors import ApiError, LivegateError, ServerError, TransportError, api_error
from .models import Event, History, Member, Presence, Published, RoomState, Token

T = TypeVar("T")

_UNSET: Any = object()


@dataclass(frozen=True)
class RetryPolicy:
    """How calls that are safe to repeat are retried: up to `attempts` in all, waiting a
    random part of `base` * 2**n seconds (at most `cap`) between them."""

    attempts: int = 6
    base: float = 0.1
    cap: float = 5.0

    def delay(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        return rand() * min(self.cap, self.base * (2.0**retry))


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    params: dict[str, str] | None = None
    retry: bool = True


def _room_path(room: str) -> str:
    return quote(room, safe="")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _decoded(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _check(response: httpx.Response) -> Any:
    body = _decoded(response)
    if response.status_code >= 400:
        raise api_error(response.status_code, body, _retry_after(response))
    return body


def _retryable(error: BaseException) -> bool:
    return isinstance(error, (httpx.TransportError, ServerError))


def _published(body: Any) -> Published:
    return Published(room=str(body["room"]), seq=int(body["seq"]), epoch=str(body["epoch"]), duplicate=bool(body.get("duplicate", False)))


def _history(body: Any) -> History:
    events = [Event.from_json(raw) for raw in body.get("events") or []]
    return History(room=str(body["room"]), epoch=str(body["epoch"]), head=int(body["head"]), events=events)


def _state(body: Any) -> RoomState:
    return RoomState(room=str(body["room"]), epoch=str(body["epoch"]), seq=int(body["seq"]), data=body.get("data"))


def _presence(body: Any) -> Presence:
    raw = body.get("members")
    members = None if raw is None else [Member(user=str(m["user"]), device=str(m["device"])) for m in raw]
    return Presence(room=str(body["room"]), count=int(body["count"]), members=members)


def _token(body: Any) -> Token:
    return Token(token=str(body["token"]), expires_at_ms=int(body["expires_at_ms"]))


def _closed(body: Any) -> int:
    return int(body["closed"])


class _Calls:
    """The API's calls as data, shared by the sync and asyncio clients."""

    @staticmethod
    def publish(room: str, data: Any, id: str | None, state: Any) -> _Call[Published]:
        body: dict[str, Any] = {"id": id or uuid.uuid4().hex, "data": data}
        if state is not _UNSET:
            body["state"] = state
        return _Call("POST", f"/v1/rooms/{_room_path(room)}/events", _published, json=body)

    @staticmethod
    def send_message(user: str, data: Any, id: str | None, devices: Sequence[str] | None) -> _Call[Published]:
        body: dict[str, Any] = {"id": id or uuid.uuid4().hex, "data": data}
        if devices is not None:
            body["devices"] = list(devices)
        return _Call("POST", f"/v1/users/{_room_path(user)}/messages", _published, json=body)

    @staticmethod
    def history(room: str, since: int | None, limit: int | None) -> _Call[History]:
        params: dict[str, str] = {}
        if since is not None:
            params["since"] = str(since)
        if limit is not None:
            params["limit"] = str(limit)
        return _Call("GET", f"/v1/rooms/{_room_path(room)}/events", _history, params=params)

    @staticmethod
    def get_state(room: str) -> _Call[RoomState]:
        return _Call("GET", f"/v1/rooms/{_room_path(room)}/state", _state)

    @staticmethod
    def set_state(room: str, data: Any) -> _Call[RoomState]:
        def parse(body: Any) -> RoomState:
            return RoomState(room=str(body["room"]), epoch=str(body["epoch"]), seq=int(body["seq"]), data=data)

        return _Call("PUT", f"/v1/rooms/{_room_path(room)}/state", parse, json={"data": data})

    @staticmethod
    def presence(room: str) -> _Call[Presence]:
        return _Call("GET", f"/v1/rooms/{_room_path(room)}/presence", _presence)

    @staticmethod
    def kick(user: str, device: str | None) -> _Call[int]:
        params = {"device": device} if device is not None else None
        return _Call("DELETE", f"/v1/users/{_room_path(user)}/connections", _closed, params=params)

    @staticmethod
    def mint_token(
        user: str, device: str, rooms: Iterable[str], publish: Iterable[str], ttl: int, cell: str | None
    ) -> _Call[Token]:
        body: dict[str, Any] = {"user": user, "device": device, "ttl_secs": ttl, "rooms": list(rooms), "publish": list(publish)}
        if cell is not None:
            body["cell"] = cell
        # Retried like the rest: a token minted by an attempt whose answer was lost goes unused.
        return _Call("POST", "/v1/tokens", _token, json=body)


def _base(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.startswith("ws://"):
        url = "http://" + url[5:]
    elif url.startswith("wss://"):
        url = "https://" + url[6:]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"livegate: not an http(s) URL: {url!r}")
    return url


def _headers(api_key: str) -> dict[str, str]:
    if not api_key:
        raise ValueError("livegate: api_key is required")
    return {"Authorization": f"Bearer {api_key}", "User-Agent": "livegate-python/0.1.0"}


class Livegate:
    """Synchronous backend client. `url` is the server's base URL (`http://host:7070`),
    `api_key` one of its API keys. Use as a context manager, or call `close()`.
    `on_retry(attempt, error, delay)` is called before each retry (to log it)."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = RetryPolicy(),
        http: httpx.Client | None = None,
        on_retry: Callable[[int, BaseException, float], None] | None = None,
    ) -> None:
        self.url = _base(url)
        self.retry = retry
        self.on_retry = on_retry
        self._owned = http is None
        self._http = http or httpx.Client(timeout=timeout)
        self._headers = _headers(api_key)

    def __enter__(self) -> Livegate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def _run(self, call: _Call[T]) -> T:
        attempts = self.retry.attempts if call.retry else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(
                    call.method, self.url + call.path, json=call.json, params=call.params, headers=self._headers
                )
                return call.parse(_check(response))
            except (httpx.TransportError, ServerError) as error:
                if attempt + 1 >= attempts:
                    raise _final(error, call) from error
                delay = self.retry.delay(attempt)
                if self.on_retry is not None:
                    self.on_retry(attempt + 1, error, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def publish(self, room: str, data: Any, *, id: str | None = None, state: Any = _UNSET) -> Published:
        """Stores an event in `room` (once durable). `id` makes retries safe (one is made
        up when not given); `state`: the room's state as of this event."""
        return self._run(_Calls.publish(room, data, id, state))

    def send_message(self, user: str, data: Any, *, id: str | None = None, devices: Sequence[str] | None = None) -> Published:
        """Stores an event in the inbox room `user:{user}` (only `devices`, when given, receive it)."""
        return self._run(_Calls.send_message(user, data, id, devices))

    def history(self, room: str, *, since: int | None = None, limit: int | None = None) -> History:
        """The room's events after `since` (at most `limit`, up to the server's 1000)."""
        return self._run(_Calls.history(room, since, limit))

    def get_state(self, room: str) -> RoomState:
        return self._run(_Calls.get_state(room))

    def set_state(self, room: str, data: Any) -> RoomState:
        """Sets the room's state as of its head."""
        return self._run(_Calls.set_state(room, data))

    def presence(self, room: str) -> Presence:
        return self._run(_Calls.presence(room))

    def kick(self, user: str, *, device: str | None = None) -> int:
        """Closes the user's connections (close code 4502) and voids every credential issued
        to the user (on `device`) before now. Returns how many connections were closed."""
        return self._run(_Calls.kick(user, device))

    def mint_token(
        self,
        user: str,
        *,
        device: str = "web",
        rooms: Iterable[str] = (),
        publish: Iterable[str] = (),
        ttl: int = 60,
        cell: str | None = None,
    ) -> Token:
        """A one-time connection token from the server (`POST /v1/tokens`)."""
        return self._run(_Calls.mint_token(user, device, rooms, publish, ttl, cell))


class AsyncLivegate:
    """The asyncio backend client: the methods of `Livegate`, awaited. Use with `async with`
    or call `await aclose()`."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = RetryPolicy(),
        http: httpx.AsyncClient | None = None,
        on_retry: Callable[[int, BaseException, float], None] | None = None,
    ) -> None:
        self.url = _base(url)
        self.retry = retry
        self.on_retry = on_retry
        self._owned = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._headers = _headers(api_key)

    async def __aenter__(self) -> AsyncLivegate:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def _run(self, call: _Call[T]) -> T:
        attempts = self.retry.attempts if call.retry else 1
        for attempt in range(attempts):
            try:
                response = await self._http.request(
                    call.method, self.url + call.path, json=call.json, params=call.params, headers=self._headers
                )
                return call.parse(_check(response))
            except (httpx.TransportError, ServerError) as error:
                if attempt + 1 >= attempts:
                    raise _final(error, call) from error
                delay = self.retry.delay(attempt)
                if self.on_retry is not None:
                    self.on_retry(attempt + 1, error, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def publish(self, room: str, data: Any, *, id: str | None = None, state: Any = _UNSET) -> Published:
        return await self._run(_Calls.publish(room, data, id, state))

    async def send_message(
        self, user: str, data: Any, *, id: str | None = None, devices: Sequence[str] | None = None
    ) -> Published:
        return await self._run(_Calls.send_message(user, data, id, devices))

    async def history(self, room: str, *, since: int | None = None, limit: int | None = None) -> History:
        return await self._run(_Calls.history(room, since, limit))

    async def get_state(self, room: str) -> RoomState:
        return await self._run(_Calls.get_state(room))

    async def set_state(self, room: str, data: Any) -> RoomState:
        return await self._run(_Calls.set_state(room, data))

    async def presence(self, room: str) -> Presence:
        return await self._run(_Calls.presence(room))

    async def kick(self, user: str, *, device: str | None = None) -> int:
        return await self._run(_Calls.kick(user, device))

    async def mint_token(
        self,
        user: str,
        *,
        device: str = "web",
        rooms: Iterable[str] = (),
        publish: Iterable[str] = (),
        ttl: int = 60,
        cell: str | None = None,
    ) -> Token:
        return await self._run(_Calls.mint_token(user, device, rooms, publish, ttl, cell))


def _final(error: BaseException, call: _Call[Any]) -> LivegateError:
    """What a call raises once its retries are spent: the server's error, or a
    `TransportError` naming the call."""
    if isinstance(error, ApiError):
        return error
    return TransportError(f"{call.method} {call.path}: {type(error).__name__}: {error}")
