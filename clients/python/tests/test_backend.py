"""The backend client against the real server: every call, sync and asyncio, and the
server's errors as typed exceptions."""

from __future__ import annotations

import threading

import pytest

import livegate
from livegate import AsyncLivegate, Livegate, RetryPolicy

from .conftest import API_KEY, Server


def test_publish_history_and_duplicate_id(server: Server) -> None:
    with Livegate(server.url, API_KEY) as lg:
        first = lg.publish("scores:1", {"home": 1}, id="goal-1")
        assert (first.room, first.seq, first.duplicate) == ("scores:1", 1, False)
        again = lg.publish("scores:1", {"home": 1}, id="goal-1")
        assert again.seq == 1 and again.duplicate is True and again.epoch == first.epoch
        second = lg.publish("scores:1", {"home": 2})  # an id is made up
        assert second.seq == 2 and not second.duplicate
        page = lg.history("scores:1", since=0, limit=10)
        assert page.head == 2 and page.epoch == first.epoch
        assert [(e.seq, e.data) for e in page.events] == [(1, {"home": 1}), (2, {"home": 2})]
        assert page.events[0].id == "goal-1" and page.events[1].id
        assert [e.seq for e in lg.history("scores:1", since=1).events] == [2]
        empty = lg.history("never:published")
        assert empty.head == 0 and empty.events == []


def test_state_presence_kick_and_tokens(server: Server) -> None:
    with Livegate(server.url, API_KEY) as lg:
        none = lg.get_state("board:1")
        assert (none.seq, none.data) == (0, None)
        written = lg.set_state("board:1", {"score": "1-0"})
        got = lg.get_state("board:1")
        assert got.data == {"score": "1-0"} and got.seq == written.seq and got.epoch == written.epoch
        with_state = lg.publish("board:1", {"goal": "away"}, state={"score": "1-1"})
        assert lg.get_state("board:1").data == {"score": "1-1"} and lg.get_state("board:1").seq == with_state.seq
        presence = lg.presence("board:1")
        assert presence.count == 0 and presence.members == []
        token = lg.mint_token("alice", device="phone", rooms=["board:*"], publish=["chat:*"], ttl=30)
        assert token.token and token.expires_at_ms > 0
        assert lg.kick("alice") == 0
        assert lg.kick("alice", device="phone") == 0
        inbox = lg.send_message("alice", {"hi": 1})
        assert inbox.room == "user:alice" and inbox.seq == 1


def test_errors_are_typed_with_the_servers_code(server: Server) -> None:
    with Livegate(server.url, API_KEY) as lg:
        with pytest.raises(livegate.BadRequestError) as bad:
            lg.history("scores:1", limit=100_000)
        assert bad.value.status == 400 and bad.value.code and bad.value.message
        with pytest.raises(livegate.BadRequestError) as cell:
            lg.mint_token("bob", cell="nowhere")
        assert cell.value.code == "unknown_cell"
        with pytest.raises(livegate.NotFoundError) as off:
            lg.presence("user:bob")
        assert off.value.code == "presence_off"
        with pytest.raises(livegate.PayloadTooLargeError):
            lg.publish("big:1", "x" * (2 * 1024 * 1024))
    with Livegate(server.url, "not-the-key-0123456789") as wrong:
        with pytest.raises(livegate.AuthenticationError) as denied:
            wrong.publish("scores:1", 1)
        assert denied.value.status == 401 and isinstance(denied.value, livegate.LivegateError)


def test_unreachable_server_raises_transport_error_after_retries(server: Server) -> None:
    url = server.url
    server.stop()
    with Livegate(url, API_KEY, retry=RetryPolicy(attempts=3, base=0.01, cap=0.02)) as lg:
        with pytest.raises(livegate.TransportError):
            lg.publish("scores:1", 1)


async def test_async_client_makes_the_same_calls(server: Server) -> None:
    async with AsyncLivegate(server.url, API_KEY) as lg:
        first = await lg.publish("async:1", {"n": 1}, id="a-1")
        assert (await lg.publish("async:1", {"n": 1}, id="a-1")).duplicate
        page = await lg.history("async:1", since=0)
        assert [e.data for e in page.events] == [{"n": 1}] and page.epoch == first.epoch
        await lg.set_state("async:1", {"s": 1})
        assert (await lg.get_state("async:1")).data == {"s": 1}
        assert (await lg.presence("async:1")).count == 0
        assert (await lg.mint_token("carol")).token
        assert await lg.kick("carol") == 0
        assert (await lg.send_message("carol", "hello")).room == "user:carol"
        with pytest.raises(livegate.BadRequestError):
            await lg.history("async:1", limit=5000)


def test_sync_publish_retries_across_a_restart_with_the_same_id(server: Server) -> None:
    """A publish made while the server is down (killed) is retried until it is back, and
    stored once: its id, sent again, answers duplicate with the same seq."""
    with Livegate(server.url, API_KEY) as lg:
        lg.publish("restart:1", "before", id="r-1")
    server.kill()
    retried = threading.Event()
    outcome: list[livegate.Published] = []
    patient = RetryPolicy(attempts=200, base=0.02, cap=0.2)

    def publish() -> None:
        with Livegate(server.url, API_KEY, retry=patient, on_retry=lambda n, error, delay: retried.set()) as lg:
            outcome.append(lg.publish("restart:1", "during", id="r-2"))

    worker = threading.Thread(target=publish)
    worker.start()
    assert retried.wait(15), "the publish failed and was retried while the server was down"
    server.start()
    worker.join(30)
    assert outcome and outcome[0].seq == 2 and not outcome[0].duplicate
    with Livegate(server.url, API_KEY) as lg:
        again = lg.publish("restart:1", "during", id="r-2")
        assert (again.seq, again.duplicate) == (2, True)
        assert [e.data for e in lg.history("restart:1", since=0).events] == ["before", "during"]
