"""The asyncio subscriber against the real server: live events, resume across a `kill -9`
and restart (every event once and in order), a Gap when the server cannot replay, the
stop on a kick, a refused room."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest

import livegate
from livegate import AsyncLivegate, Event, Gap, RetryPolicy, Subscriber

from .conftest import API_KEY, Server, wait_for


def minter(
    url: str, user: str = "viewer", rooms: Sequence[str] = (), publish: Sequence[str] = ()
) -> tuple[list[str], Callable[[], Awaitable[str]]]:
    """A `get_token` minting tokens with the API key, and the list of tokens it gave."""
    given: list[str] = []

    async def get_token() -> str:
        async with AsyncLivegate(url, API_KEY) as lg:
            token = (await lg.mint_token(user, rooms=rooms, publish=publish)).token
        given.append(token)
        return token

    return given, get_token


async def take(sub: livegate.Subscription, n: int, within: float = 20.0) -> list[livegate.Item]:
    return [await sub.get(timeout=within) for _ in range(n)]


async def test_receives_live_events_in_order(server: Server) -> None:
    given, get_token = minter(server.url)
    async with Subscriber(server.url, get_token) as subscriber, AsyncLivegate(server.url, API_KEY) as lg:
        sub = subscriber.subscribe("live:1")
        reply = await sub.ready(timeout=10)
        assert reply.seq == 0 and subscriber.state == "connected"
        for i in range(1, 6):
            await lg.publish("live:1", {"n": i})
        items = await take(sub, 5)
        assert all(isinstance(item, Event) for item in items)
        assert [(item.seq, item.data) for item in items if isinstance(item, Event)] == [(i, {"n": i}) for i in range(1, 6)]
        assert len(given) == 1


async def test_every_event_once_and_in_order_across_kill_9(server: Server) -> None:
    """Events published before, during (a publisher killed mid-run, retrying with the same
    ids while the server is down) and after a SIGKILL and restart on the same data dir and
    port all arrive, each once and in order; the reconnect uses the resume credential."""
    given, get_token = minter(server.url)
    retries: list[BaseException] = []
    patient = RetryPolicy(attempts=100, base=0.05, cap=0.3)
    lg = AsyncLivegate(server.url, API_KEY, retry=patient, on_retry=lambda n, error, delay: retries.append(error))
    async with Subscriber(server.url, get_token) as subscriber, lg:
        sub = subscriber.subscribe("match:9")
        other = subscriber.subscribe("match:10")
        await sub.ready(timeout=10)
        await other.ready(timeout=10)
        for i in range(1, 11):  # before
            await lg.publish("match:9", i, id=f"e{i}")
        await lg.publish("match:10", "x", id="x1")
        got = await take(sub, 10)
        assert [item.data for item in got if isinstance(item, Event)] == list(range(1, 11))

        # During: the server is killed while a publisher is under way; its publishes
        # fail, are retried with the same ids, and land once the server is back.
        acked: list[int] = []

        async def publish_range(start: int, end: int) -> None:
            for i in range(start, end):
                await lg.publish("match:9", i, id=f"e{i}")
                acked.append(i)

        during = asyncio.create_task(publish_range(11, 111))
        await wait_for(lambda: len(acked) >= 5, "the publisher to be under way")
        server.kill()
        await wait_for(lambda: retries, "a publish to fail and be retried while the server is down")
        assert not during.done() and len(acked) < 100
        await wait_for(lambda: subscriber.state != "connected", "the subscriber to notice the kill")
        server.start()
        await asyncio.wait_for(during, 30)
        for i in range(111, 121):  # after
            await lg.publish("match:9", i, id=f"e{i}")
        await lg.publish("match:10", "y", id="y1")

        rest = await take(sub, 110, within=30)
        events = [item for item in got + rest if isinstance(item, Event)]
        assert not [item for item in rest if isinstance(item, Gap)]
        assert [e.data for e in events] == list(range(1, 121))
        assert [e.seq for e in events] == list(range(1, 121))
        assert [e.id for e in events] == [f"e{i}" for i in range(1, 121)]
        assert [(await other.get(timeout=10)).data for _ in range(2)] == ["x", "y"]  # type: ignore[union-attr]
        assert subscriber.resumed >= 1, "the reconnect after the restart used the resume credential"
        assert len(given) == 1, "no new token was needed"
        # Nothing more queued: no repeats.
        with pytest.raises(asyncio.TimeoutError):
            await sub.get(timeout=0.3)


async def test_resume_from_a_position_and_a_gap_when_the_epoch_is_unknown(server: Server) -> None:
    _, get_token = minter(server.url)
    async with AsyncLivegate(server.url, API_KEY) as lg:
        first = await lg.publish("replay:1", 1)
        for i in range(2, 6):
            await lg.publish("replay:1", i)
        async with Subscriber(server.url, get_token) as subscriber:
            # From seq 2 of the right epoch: 3, 4, 5 are replayed.
            sub = subscriber.subscribe("replay:1", since=2, epoch=first.epoch)
            assert (await sub.ready(timeout=10)).recovered is True
            assert [i.seq for i in await take(sub, 3)] == [3, 4, 5]
            # An epoch the server does not know: recovered:false is a Gap, then live events.
            await lg.publish("replay:2", "a")
            stale = subscriber.subscribe("replay:2", since=7, epoch="not-this-epoch")
            reply = await stale.ready(timeout=10)
            assert reply.recovered is False and reply.seq == 1
            gap = await stale.get(timeout=10)
            assert gap == Gap("replay:2", reply.epoch, 1, "not_recovered")
            await lg.publish("replay:2", "b")
            item = await stale.get(timeout=10)
            assert isinstance(item, Event) and item.data == "b"


async def test_kick_stops_the_subscriber(server: Server) -> None:
    _, get_token = minter(server.url, user="mallory")
    async with Subscriber(server.url, get_token) as subscriber, AsyncLivegate(server.url, API_KEY) as lg:
        sub = subscriber.subscribe("kick:1")
        await sub.ready(timeout=10)
        assert await lg.kick("mallory") == 1
        with pytest.raises(livegate.SubscriberClosed) as closed:
            await sub.get(timeout=10)
        assert closed.value.code == 4502
        assert subscriber.state == "closed"


async def test_a_room_outside_the_tokens_rooms_is_refused(server: Server) -> None:
    _, get_token = minter(server.url, rooms=["ok:*"])
    async with Subscriber(server.url, get_token) as subscriber:
        allowed = subscriber.subscribe("ok:1")
        refused = subscriber.subscribe("secret:1")
        await allowed.ready(timeout=10)
        with pytest.raises(livegate.SubscriptionRefused) as error:
            await refused.get(timeout=10)
        assert error.value.code == "forbidden" and error.value.room == "secret:1"


async def test_two_subscriptions_share_a_room_and_end_on_their_own(server: Server) -> None:
    _, get_token = minter(server.url)
    async with Subscriber(server.url, get_token) as subscriber, AsyncLivegate(server.url, API_KEY) as lg:
        one = subscriber.subscribe("shared:1")
        two = subscriber.subscribe("shared:1")
        await one.ready(timeout=10)
        await two.ready(timeout=10)
        await lg.publish("shared:1", "a")
        assert [(await s.get(timeout=10)).seq for s in (one, two)] == [1, 1]
        one.unsubscribe()
        assert [item async for item in one] == []
        await lg.publish("shared:1", "b")
        item = await two.get(timeout=10)
        assert isinstance(item, Event) and item.data == "b"
    with pytest.raises(livegate.SubscriberClosed):
        await two.get(timeout=10)
    with pytest.raises(livegate.SubscriberClosed):
        subscriber.subscribe("shared:2")


async def test_a_bot_publishes_over_its_connection(server: Server) -> None:
    _, bot_token = minter(server.url, user="bot", publish=["chat:*"])
    _, viewer_token = minter(server.url)
    async with Subscriber(server.url, bot_token) as bot, Subscriber(server.url, viewer_token) as viewer:
        sub = viewer.subscribe("chat:1")
        await sub.ready(timeout=10)
        done = await bot.publish("chat:1", {"text": "hi"}, id="m-1")
        assert (done.room, done.seq, done.duplicate) == ("chat:1", 1, False)
        assert (await bot.publish("chat:1", {"text": "hi"}, id="m-1")).duplicate
        item = await sub.get(timeout=10)
        assert isinstance(item, Event) and (item.sender, item.id, item.data) == ("bot", "m-1", {"text": "hi"})
        with pytest.raises(livegate.RequestRefused) as refused:
            await bot.publish("news:1", "not granted")
        assert refused.value.code == "forbidden"
    with pytest.raises(livegate.SubscriberClosed):
        await bot.publish("chat:1", "after close")
