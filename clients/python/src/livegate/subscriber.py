"""The asyncio subscriber: one WebSocket connection to livegate that receives rooms' events,
each once and in order, across lost connections, server restarts and redirects.

    async with Subscriber("http://127.0.0.1:7070", get_token=mint) as subscriber:
        async for item in subscriber.subscribe("match:1"):
            match item:
                case Event():
                    print(item.seq, item.data)
                case Gap():
                    print("lost events up to", item.seq)

What it guarantees, as livegate.js does:

- After a lost connection it reconnects with the one-time resume credential of the last
  `welcome` (the backend's `get_token` is only asked when there is none, it expired or
  was refused) and subscribes each room again with `since` = the last seq it delivered
  and the room's `epoch`: the server replays what was missed (`recovered: true`).
- Events are delivered in seq order, each once: repeats (by seq, and by event id over the
  last 500 ids) are dropped; a hole in a room's stream makes it subscribe again from
  the last seq it delivered.
- When the server cannot replay (`recovered: false`: history trimmed, or a new epoch) the
  subscription yields a `Gap` before the events that follow: it is never silent.
- Reconnects wait by backoff with full jitter (0, 2, 5, 10, 30 s tiers); after a server
  restart (close 1012/1001) the delay the server suggests comes first; close 4029 waits
  the seconds it names; 4421 (and HTTP 421 `wrong_node`) is followed at once to the node
  it names, with the same credential. 4500-4999 (replaced, kicked) stop the subscriber:
  iterators raise `SubscriberClosed`.

Bounds: each subscription holds at most `max_queue` undelivered items; when its consumer
falls behind, reading from the socket waits (the server may then close the connection as
a slow consumer, and the subscriber resumes from the last item it queued). A room holds
back at most 1000 events while a subscribe is answered; the last 500 ids per room are
remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, Union
from urllib.parse import quote

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from .errors import RequestRefused, SubscriberClosed, SubscriptionRefused
from .models import Event, Gap, Published, Token

log = logging.getLogger("livegate")

#: What a subscription yields.
Item = Union[Event, Gap]
#: What `get_token` may return (or an awaitable of it): a token, `Token`, or `{"token": ...}`.
TokenLike = Union[str, Token, dict[str, Any]]
TokenSource = Callable[[], Union[TokenLike, Awaitable[TokenLike]]]
State = Literal["disconnected", "connecting", "connected", "closed"]

#: Event ids remembered per room to drop repeats.
RECENT_IDS = 500
#: Events a room holds back while its subscribe is answered; one more and it subscribes again.
MAX_HELD_EVENTS = 1000
#: Refusals of a subscribe that end the subscription instead of retrying it.
FINAL_SUBSCRIBE_ERRORS = frozenset({"bad_request", "bad_room", "forbidden", "too_many_subscriptions", "unknown_op"})
#: `wrong_node` redirects followed in a row without a welcome before backing off.
MAX_FOLLOWS = 3

T = TypeVar("T")
_END = object()


@dataclass(frozen=True)
class Subscribed:
    """A room's `subscribed` reply: its `epoch`, head `seq` then, and whether the events
    missed since the given position were replayed (`recovered`; None: nothing asked)."""

    room: str
    epoch: str
    seq: int
    recovered: bool | None


class _Channel(Generic[T]):
    """A bounded single-consumer queue that can be ended with an exception (raised to the
    consumer once the items before it are taken)."""

    def __init__(self, maxsize: int) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self.end_error: BaseException | None = None

    async def put(self, item: T) -> None:
        while len(self._items) >= self._maxsize and self.end_error is None:
            self._writable.clear()
            await self._writable.wait()
        if self.end_error is None:
            self._items.append(item)
            self._readable.set()

    async def get(self) -> T:
        while not self._items:
            if self.end_error is not None:
                raise self.end_error
            self._readable.clear()
            await self._readable.wait()
        item = self._items.popleft()
        self._writable.set()
        return item

    def end(self, error: BaseException) -> None:
        if self.end_error is None:
            self.end_error = error
        self._readable.set()
        self._writable.set()


class Subscription:
    """One `subscribe()` of a room: an async iterator of `Event` and `Gap` items, each event
    once and in seq order. It raises `SubscriberClosed` when the subscriber stops, and
    `SubscriptionRefused` when the server refuses the room for good; after
    `unsubscribe()` the iteration ends."""

    def __init__(self, subscriber: Subscriber, room: str, max_queue: int) -> None:
        self.room = room
        self._subscriber = subscriber
        self._channel: _Channel[Item] = _Channel(max_queue)
        self._ready: asyncio.Future[Subscribed] = asyncio.get_running_loop().create_future()
        #: The seq of the last event queued for this subscription (None: none yet).
        self.position: int | None = None

    def __aiter__(self) -> AsyncIterator[Item]:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self._channel.get()
        except StopAsyncIteration:
            raise StopAsyncIteration from None

    async def get(self, timeout: float | None = None) -> Item:
        """The next item (waiting at most `timeout` seconds: `asyncio.TimeoutError` then); after
        `unsubscribe()`, `StopAsyncIteration`."""
        return await asyncio.wait_for(self._channel.get(), timeout)

    async def ready(self, timeout: float | None = None) -> Subscribed:
        """The room's first `subscribed` reply: from then on its events are delivered."""
        return await asyncio.wait_for(asyncio.shield(self._ready), timeout)

    def unsubscribe(self) -> None:
        """Ends this subscription (the room's server subscription ends with its last one)."""
        self._subscriber._detach(self)
        self._end(StopAsyncIteration())

    def _subscribed(self, reply: Subscribed) -> None:
        if not self._ready.done():
            self._ready.set_result(reply)

    def _end(self, error: BaseException) -> None:
        self._channel.end(error)
        if not self._ready.done():
            self._ready.set_exception(error if not isinstance(error, StopAsyncIteration) else SubscriberClosed("unsubscribed"))
            self._ready.exception()  # retrieved: nobody has to await it


@dataclass
class _Room:
    """What the subscriber knows of one room across connections."""

    name: str
    subs: list[Subscription] = field(default_factory=list)
    epoch: str | None = None
    #: Seq of the last event delivered (or the position it started from).
    last: int | None = None
    ids: set[str] = field(default_factory=set)
    id_order: deque[str] = field(default_factory=deque)
    #: Ref of the subscribe awaiting its reply (events are held back meanwhile).
    ref: int | None = None
    held: list[dict[str, Any]] = field(default_factory=list)
    retry: asyncio.TimerHandle | None = None

    def first_delivery(self, event_id: str | None) -> bool:
        if event_id is None:
            return True
        if event_id in self.ids:
            return False
        self.ids.add(event_id)
        self.id_order.append(event_id)
        if len(self.id_order) > RECENT_IDS:
            self.ids.discard(self.id_order.popleft())
        return True


@dataclass
class _Outcome:
    """How a connection (or an attempt) ended."""

    code: int
    reason: str = ""
    welcomed: bool = False
    lasted: float = 0.0
    #: The node a `wrong_node` refusal named (URL), when one did.
    named_url: str | None = None
    #: An HTTP refusal of the handshake: status and error code.
    status: int | None = None
    error_code: str | None = None
    retry_after: float | None = None
    #: The server was reached (a handshake answer or an open socket).
    reached: bool = False


def ws_endpoint(base: str) -> str:
    """`/v1/ws` of a base URL: http→ws, https→wss."""
    url = re.sub(r"[?#].*$", "", base.strip())
    url = re.sub(r"^http(s?)://", lambda m: f"ws{m.group(1)}://", url, flags=re.I)
    if not re.match(r"^wss?://", url, flags=re.I):
        raise ValueError(f"livegate: not an http(s) or ws(s) URL: {base!r}")
    url = url.rstrip("/")
    if not url.endswith("/v1/ws"):
        url += "/v1/ws"
    return url


def base_of(url: str) -> str:
    """The http(s) base of a node URL (ws(s) accepted), without /v1/ws or /v1/sse."""
    text = re.sub(r"[?#].*$", "", url.strip())
    text = re.sub(r"^ws(s?)://", lambda m: f"http{m.group(1)}://", text, flags=re.I)
    if not re.match(r"^https?://", text, flags=re.I):
        raise ValueError(f"livegate: not an http(s) or ws(s) URL: {url!r}")
    return re.sub(r"/v1/(ws|sse)$", "", text.rstrip("/"))


def suggested_delay(reason: str) -> float | None:
    """The delay a 1012/1001 close reason suggests (`reconnect in 1234 ms`), in seconds."""
    match = re.search(r"(\d+)\s*ms\b", reason or "")
    if match:
        return int(match.group(1)) / 1000
    match = re.search(r"\d+", reason or "")
    return int(match.group(0)) if match else None


class Subscriber:
    """An asyncio subscriber to livegate rooms (see the module's doc for its guarantees).

    `url`: the server's (or any node's) base URL. `get_token`: a function (sync or async)
    returning a fresh one-time token (from your backend: `POST /v1/tokens` or `sign_jwt`);
    called for the first connection and whenever no resume credential can be used.
    `backoff`: the reconnect delay tiers in seconds (each wait is a random part of its
    tier); `on_state(state, reason)`: called on every change of `state`.
    """

    def __init__(
        self,
        url: str,
        get_token: TokenSource,
        *,
        session: str | None = None,
        backoff: Sequence[float] = (0, 2, 5, 10, 30),
        restart_jitter: float = 3.0,
        max_hint: float = 60.0,
        connect_timeout: float = 10.0,
        stable_after: float = 10.0,
        resume_margin: float = 30.0,
        resubscribe_after: float = 1.0,
        max_queue: int = 10_000,
        max_frame_bytes: int = 16 * 1024 * 1024,
        on_state: Callable[[State, str], None] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not callable(get_token):
            raise TypeError("livegate: get_token must be a function returning a token")
        if not backoff:
            raise ValueError("livegate: backoff needs at least one tier")
        self.url = base_of(url)
        self._get_token = get_token
        self.session = session
        self._backoff = tuple(float(t) for t in backoff)
        self._restart_jitter = restart_jitter
        self._max_hint = max_hint
        self._connect_timeout = connect_timeout
        self._stable_after = stable_after
        self._resume_margin = resume_margin
        self._resubscribe_after = resubscribe_after
        self._max_queue = max_queue
        self._max_frame_bytes = max_frame_bytes
        self._on_state = on_state
        self._rand = rand
        self.state: State = "disconnected"
        #: The node of the current (or last) connection, from its welcome.
        self.node: str | None = None
        #: Connections welcomed so far, and of those how many used a resume credential.
        self.welcomes = 0
        self.resumed = 0
        #: `wrong_node` redirects followed so far.
        self.redirects = 0
        self._rooms: dict[str, _Room] = {}
        self._resume: tuple[str, float] | None = None
        self._home: str | None = None
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._next_ref = 1
        self._closed_error: SubscriberClosed | None = None
        self._connected = asyncio.Event()
        self._sends: set[asyncio.Task[None]] = set()
        self._reconnect_now = False
        #: Requests sent on the current connection, awaiting their reply, by ref.
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    # ---- the application's side ----

    async def __aenter__(self) -> Subscriber:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        """Starts connecting (in the background); `async with` calls it."""
        if self._closed_error is not None:
            raise self._closed_error
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="livegate-subscriber")

    async def close(self) -> None:
        """Stops for good: the connection is closed, iterators raise `SubscriberClosed`."""
        self._stop(SubscriberClosed("subscriber closed"))
        task, self._task = self._task, None
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def reconnect(self) -> None:
        """Closes the current connection and connects again at once, resuming (after a
        network change, say); nothing is lost."""
        ws = self._ws
        if ws is None:
            return
        self._reconnect_now = True
        with contextlib.suppress(Exception):
            await ws.close(1000, "reconnecting")

    def subscribe(self, room: str, *, since: int | None = None, epoch: str | None = None) -> Subscription:
        """A subscription to `room`'s events from now on, or after `since` (of `epoch`)
        when given and the room is not subscribed already. Iterate it with `async for`."""
        if self._closed_error is not None:
            raise self._closed_error
        if not room:
            raise ValueError("livegate: room must not be empty")
        sub = Subscription(self, room, self._max_queue)
        state = self._rooms.get(room)
        if state is None:
            state = _Room(room, last=since, epoch=epoch if since is not None else None)
            self._rooms[room] = state
            state.subs.append(sub)
            if self.state == "connected":
                self._spawn(self._send_subscribe(state))
        else:
            state.subs.append(sub)
            sub.position = state.last
            if state.ref is None and state.epoch is not None and state.last is not None:
                sub._subscribed(Subscribed(room, state.epoch, state.last, None))
        return sub

    events = subscribe

    async def publish(self, room: str, data: Any, *, id: str | None = None, timeout: float = 10.0) -> Published:
        """Publishes `data` to `room` over the connection (the token needs a `publish`
        grant naming the room) and returns once it is durable. The event carries an `id`
        (a random one unless given): when the connection is lost before the reply, it is
        sent again on the next one and the server answers the repeat as a duplicate, so it
        is stored once. Raises `RequestRefused` when the server refuses it, `asyncio.TimeoutError`
        after `timeout` seconds, `SubscriberClosed` once closed."""
        frame: dict[str, Any] = {"op": "publish", "room": room, "id": id or uuid.uuid4().hex, "data": data}
        deadline = time.monotonic() + timeout
        while True:
            if self._closed_error is not None:
                raise self._closed_error
            await asyncio.wait_for(self._connected.wait(), max(0.0, deadline - time.monotonic()))
            ws = self._ws
            if ws is None:
                continue
            ref = self._ref()
            reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._pending[ref] = reply
            try:
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(json.dumps({**frame, "ref": ref}))
                answer = await asyncio.wait_for(asyncio.shield(reply), max(0.0, deadline - time.monotonic()))
            except _Lost:
                continue  # the connection ended first: again on the next one, same id
            finally:
                self._pending.pop(ref, None)
            if answer.get("op") == "error":
                raise RequestRefused(str(answer.get("code")), str(answer.get("message", "")), answer.get("room"))
            return Published(
                room=str(answer.get("room", room)),
                seq=int(answer["seq"]),
                epoch=str(answer.get("epoch", "")),
                duplicate=bool(answer.get("duplicate", False)),
            )

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Waits until a connection is welcomed (again); raises `SubscriberClosed` once closed."""
        await asyncio.wait_for(self._connected.wait(), timeout)
        if self._closed_error is not None:
            raise self._closed_error

    def _detach(self, sub: Subscription) -> None:
        state = self._rooms.get(sub.room)
        if state is None or sub not in state.subs:
            return
        state.subs.remove(sub)
        if not state.subs:
            del self._rooms[sub.room]
            if state.retry is not None:
                state.retry.cancel()
            if self.state == "connected":
                self._spawn(self._send({"op": "unsubscribe", "room": sub.room, "ref": self._ref()}))

    # ---- the connection loop ----

    def _move(self, state: State, reason: str) -> None:
        if self.state == state or self.state == "closed":
            return
        self.state = state
        if state == "connected":
            self._connected.set()
        else:
            self._connected.clear()
        log.debug("livegate: %s (%s)", state, reason)
        if self._on_state is not None:
            try:
                self._on_state(state, reason)
            except Exception:  # a listener's bug must not stop the subscriber
                log.exception("livegate: on_state raised")

    def _stop(self, error: SubscriberClosed) -> None:
        if self._closed_error is not None:
            return
        self._closed_error = error
        self._move("closed", str(error))
        for state in list(self._rooms.values()):
            if state.retry is not None:
                state.retry.cancel()
            for sub in list(state.subs):
                sub._end(error)
        self._rooms.clear()
        self._fail_pending(error)
        self._connected.set()  # wakes whoever waits for a connection: they see the close

    def _fail_pending(self, error: BaseException) -> None:
        for reply in self._pending.values():
            if not reply.done():
                reply.set_exception(error)
                reply.exception()  # retrieved: the waiter may have given up
        self._pending.clear()

    def _usable_resume(self) -> str | None:
        if self._resume is None:
            return None
        value, expires_at = self._resume
        if time.time() >= expires_at - self._resume_margin:
            self._resume = None
            return None
        return value

    async def _token(self) -> str:
        value: Any = self._get_token()
        if isinstance(value, Awaitable):
            value = await value
        if isinstance(value, Token):
            value = value.token
        elif isinstance(value, dict):
            value = value.get("token")
        if not isinstance(value, str) or not value:
            raise ValueError("get_token returned no token")
        return value

    async def _run(self) -> None:
        failures = 0
        follows = 0
        target: str | None = None  # a node a refusal or hand-over named
        target_token: str | None = None  # the unspent token of a refused handshake
        while self._closed_error is None:
            base = target or self._home or self.url
            resume = self._usable_resume()
            token = None
            self._move("connecting", f"connecting to {base}")
            if resume is None:
                try:
                    token = target_token or await self._token()
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    log.warning("livegate: get_token failed: %s", error)
                    await self._sleep(self._tier(failures), "get_token failed")
                    failures += 1
                    continue
            via_target = target is not None
            target = target_token = None
            outcome = await self._connection(base, resume, token)
            if self._closed_error is not None:
                return
            if outcome.welcomed:
                follows = 0
                if outcome.lasted >= self._stable_after:
                    failures = 0
                # Welcomed by a node a refusal named: the session lives there, go there first.
                self._home = base if base != self.url else None
            if self._reconnect_now:
                self._reconnect_now = False
                self._move("disconnected", "reconnecting as asked")
                continue
            code, reason = outcome.code, outcome.reason
            if 4500 <= code <= 4999:
                self._resume = None
                self._stop(SubscriberClosed(f"the server said not to reconnect ({code} {reason})", code=code, reason=reason))
                return
            # A node that stops or restarts: the given address knows where the session goes.
            if outcome.welcomed and code in (1012, 1001):
                self._home = None
            if code == 4421:
                url = reason.strip() if re.match(r"^(https?|wss?)://", reason.strip(), re.I) else outcome.named_url
                if url and (outcome.welcomed or follows < MAX_FOLLOWS):
                    try:
                        target = base_of(url)
                    except ValueError:
                        target = None
                    # Never from https to plain http: the credential would travel in the clear.
                    if target is not None and base.lower().startswith("https:") and not target.lower().startswith("https:"):
                        target = None
                    if target is not None:
                        if not outcome.welcomed:
                            follows += 1
                            target_token = token  # refused unspent
                        self.redirects += 1
                        self._home = None
                        self._move("disconnected", f"wrong node: {target} serves the session")
                        continue
                follows = 0
            if outcome.error_code == "resume_invalid":
                self._resume = None
            if not outcome.reached and (via_target or self._home is not None) and base != self.url:
                self._home = None  # the named node did not answer: back to the given address
            delay = self._delay(code, reason, failures, outcome)
            if not (outcome.welcomed and code in (1012, 1001)):
                failures += 1
            self._move("disconnected", f"lost ({code} {reason}); reconnecting in {delay:.2f} s")
            await self._sleep(delay, reason)

    def _tier(self, failures: int) -> float:
        return self._rand() * self._backoff[min(failures, len(self._backoff) - 1)]

    def _delay(self, code: int, reason: str, failures: int, outcome: _Outcome) -> float:
        if outcome.welcomed and code in (1012, 1001):
            hint = suggested_delay(reason)
            if hint is not None:
                return min(hint, self._max_hint)
            return self._rand() * self._restart_jitter
        delay = self._tier(failures)
        wait = outcome.retry_after
        if code == 4029 and wait is None:
            match = re.search(r"\d+", reason or "")
            wait = float(match.group(0)) if match else None
        if wait is not None:
            delay = max(delay, min(wait, self._max_hint))
        return delay

    async def _sleep(self, seconds: float, why: str) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def _connection(self, base: str, resume: str | None, token: str | None) -> _Outcome:
        """One attempt and, once welcomed, the connection's life; how it ended."""
        if resume is not None:
            query = f"resume={quote(resume, safe='')}"
        else:
            query = f"token={quote(token or '', safe='')}"
            if self.session:
                query += f"&session={quote(self.session, safe='')}"
        url = f"{ws_endpoint(base)}?{query}"
        try:
            ws = await connect(
                url,
                open_timeout=self._connect_timeout,
                max_size=self._max_frame_bytes,
                user_agent_header="livegate-python/0.1.0",
            )
        except InvalidStatus as error:
            return self._refusal(error)
        except (OSError, asyncio.TimeoutError, InvalidHandshake, InvalidURI) as error:
            return _Outcome(1006, f"{type(error).__name__}: {error}")
        self._ws = ws
        outcome = _Outcome(1006, reached=True)
        welcomed_at = 0.0
        try:
            first = await asyncio.wait_for(ws.recv(), self._connect_timeout)
            frame = _parse(first)
            while frame is not None and frame.get("op") == "error" and frame.get("code") == "wrong_node":
                outcome.named_url = frame.get("url") if isinstance(frame.get("url"), str) else None
                frame = _parse(await asyncio.wait_for(ws.recv(), self._connect_timeout))
            if frame is None or frame.get("op") != "welcome":
                await ws.close(1002, "expected welcome")
                return _Outcome(1002, "no welcome", reached=True)
            outcome.welcomed = True
            welcomed_at = time.monotonic()
            await self._on_welcome(frame, resumed=resume is not None)
            async for message in ws:
                frame = _parse(message)
                if frame is not None:
                    await self._on_frame(frame)
        except ConnectionClosed as closed:
            if closed.rcvd is not None:
                outcome.code, outcome.reason = closed.rcvd.code, closed.rcvd.reason
        except asyncio.TimeoutError:
            outcome.code, outcome.reason = 1006, "no welcome in time"
            await ws.close(4000, "no welcome in time")
        finally:
            self._ws = None
            self._connected.clear()  # requests wait for the next welcome
            self._fail_pending(_Lost())
            if outcome.welcomed:
                outcome.lasted = time.monotonic() - welcomed_at
            for state in self._rooms.values():
                state.ref = None
                state.held = []
                if state.retry is not None:
                    state.retry.cancel()
                    state.retry = None
        # Iterating ends without an exception on a normal close (1000, 1001): read its code here.
        rcvd = ws.protocol.close_rcvd
        if outcome.code == 1006 and rcvd is not None:
            outcome.code, outcome.reason = rcvd.code, rcvd.reason
        return outcome

    def _refusal(self, error: InvalidStatus) -> _Outcome:
        response = error.response
        status = response.status_code
        body: Any = None
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            body = json.loads(response.body or b"")
        detail = body.get("error") if isinstance(body, dict) else None
        code = str(detail.get("code")) if isinstance(detail, dict) else f"http_{status}"
        named = detail.get("url") if isinstance(detail, dict) and isinstance(detail.get("url"), str) else None
        retry_after: float | None = None
        with contextlib.suppress(TypeError, ValueError):
            retry_after = float(response.headers.get("Retry-After"))  # type: ignore[arg-type]
        log.info("livegate: handshake refused: HTTP %s %s", status, code)
        close_code = 4421 if status == 421 else 4029 if status == 429 else 1006
        return _Outcome(
            close_code, "", named_url=named, status=status, error_code=code, retry_after=retry_after, reached=True
        )

    # ---- frames ----

    def _ref(self) -> int:
        ref = self._next_ref
        self._next_ref += 1
        return ref

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, frame: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None:
            return
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps(frame))

    async def _send_subscribe(self, state: _Room) -> None:
        if self._rooms.get(state.name) is not state:
            return
        ref = self._ref()
        frame: dict[str, Any] = {"op": "subscribe", "room": state.name, "ref": ref}
        if state.last is not None:
            frame["since"] = state.last
            if state.epoch is not None:
                frame["epoch"] = state.epoch
        state.ref = ref
        state.held = []
        await self._send(frame)

    async def _on_welcome(self, frame: dict[str, Any], resumed: bool) -> None:
        resume = frame.get("resume")
        if isinstance(resume, str) and resume:
            expires_ms = frame.get("resume_expires_at_ms")
            expires_at = expires_ms / 1000 if isinstance(expires_ms, (int, float)) and expires_ms > 0 else time.time() + 60
            self._resume = (resume, expires_at)
        else:
            self._resume = None
        if isinstance(frame.get("session"), str):
            self.session = frame["session"]
        self.node = frame.get("node") if isinstance(frame.get("node"), str) else None
        self.welcomes += 1
        if resumed:
            self.resumed += 1
        self._move("connected", f"welcomed by {self.node}")
        for state in list(self._rooms.values()):
            await self._send_subscribe(state)

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        op = frame.get("op")
        if op == "events":
            for raw in frame.get("events") or []:
                if not isinstance(raw, dict) or not isinstance(raw.get("seq"), int):
                    continue
                state = self._rooms.get(str(raw.get("room")))
                if state is not None:
                    await self._accept(state, raw)
        elif op == "subscribed":
            await self._on_subscribed(frame)
        elif op == "published":
            self._reply(frame)
        elif op == "error":
            if not self._reply(frame):
                self._on_error(frame)

    def _reply(self, frame: dict[str, Any]) -> bool:
        """Hands a reply to the request with its ref; False when none waits for it."""
        ref = frame.get("ref")
        reply = self._pending.pop(ref, None) if isinstance(ref, int) else None
        if reply is None:
            return False
        if not reply.done():
            reply.set_result(frame)
        return True

    async def _on_subscribed(self, frame: dict[str, Any]) -> None:
        state = self._rooms.get(str(frame.get("room")))
        ref = frame.get("ref")
        if state is None or ref is None or state.ref != ref:
            return  # the automatic inbox subscription, or a reply to a superseded subscribe
        state.ref = None
        head = int(frame.get("seq", 0))
        epoch = str(frame.get("epoch"))
        recovered = frame.get("recovered")
        gap: Gap | None = None
        if recovered is False:
            gap = Gap(state.name, epoch, head, "not_recovered")
            state.last = head
        elif recovered is not True and (state.last is None or (state.epoch is not None and state.epoch != epoch)):
            state.last = head
        state.epoch = epoch
        reply = Subscribed(state.name, epoch, head, recovered if isinstance(recovered, bool) else None)
        for sub in list(state.subs):
            if sub.position is None or gap is not None:
                sub.position = state.last
            sub._subscribed(reply)
            if gap is not None:
                await sub._channel.put(gap)
        held, state.held = sorted(state.held, key=lambda e: int(e["seq"])), []
        for raw in held:
            if self._rooms.get(state.name) is not state or state.ref is not None:
                break
            await self._accept(state, raw)

    async def _accept(self, state: _Room, raw: dict[str, Any]) -> None:
        seq = int(raw["seq"])
        if state.ref is not None:
            if len(state.held) >= MAX_HELD_EVENTS:
                await self._send_subscribe(state)  # the server replays them again
                return
            state.held.append(raw)
            return
        if state.last is not None and seq <= state.last:
            return  # delivered already
        if state.last is not None and seq > state.last + 1:
            # A hole: subscribe again from the last delivered seq; the server replays the
            # missed events (or says recovered:false, and a Gap is yielded).
            await self._send_subscribe(state)
            return
        state.last = seq
        event = Event.from_json(raw)
        if not state.first_delivery(event.id):
            return
        for sub in list(state.subs):
            if sub.position is not None and seq <= sub.position:
                continue
            sub.position = seq
            await sub._channel.put(event)

    def _on_error(self, frame: dict[str, Any]) -> None:
        ref = frame.get("ref")
        code = str(frame.get("code", ""))
        message = str(frame.get("message", ""))
        state = next((s for s in self._rooms.values() if ref is not None and s.ref == ref), None)
        if state is None:
            log.info("livegate: server error frame: %s %s", code, message)
            return
        state.ref = None
        state.held = []
        if code in FINAL_SUBSCRIBE_ERRORS:
            del self._rooms[state.name]
            for sub in list(state.subs):
                sub._end(SubscriptionRefused(state.name, code, message))
            return
        ws = self._ws

        def again() -> None:
            state.retry = None
            if self._ws is ws and ws is not None and self._rooms.get(state.name) is state:
                self._spawn(self._send_subscribe(state))

        state.retry = asyncio.get_running_loop().call_later(self._resubscribe_after, again)


class _Lost(Exception):
    """The connection a request was sent on ended before its reply."""


def _parse(message: str | bytes) -> dict[str, Any] | None:
    try:
        frame = json.loads(message)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None
