"""Following `wrong_node` (close 4421): a node that does not serve the session refuses the
handshake naming the node that does; the subscriber goes there at once with the same
credential. With two real nodes in cluster mode (NATS): a session on a reconnecting
through a balancer pointed at b, and a rebalance handing a welcomed session over; and with
a scripted refusing node in front of a single server (the unspent token offered again)."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from websockets.asyncio.server import ServerConnection, serve

from livegate import AsyncLivegate, Event, Subscriber

from .conftest import API_KEY, NATS_SERVER, Forwarder, Nats, Server, wait_for


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Server]]:
    """Nodes a and b in cluster mode on one NATS (heartbeats every 100 ms)."""
    if not os.path.exists(NATS_SERVER):
        pytest.skip(f"{NATS_SERVER} is missing (apt-get install nats-server)")
    (tmp_path / "nats").mkdir()
    nats = Nats(str(tmp_path / "nats"))
    nodes: dict[str, Server] = {}
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            args = ["--node", name, "--cluster-nats-url", nats.url, "--cluster-heartbeat-ms", "100"]
            nodes[name] = Server(str(tmp_path / name), args=args).start()
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()
        nats.stop()


def sees_both_ready(node: Server) -> bool:
    answer = httpx.get(f"{node.url}/v1/admin/overview", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
    ready = {n["node"] for n in answer.json().get("nodes", []) if n.get("phase") == "ready"}
    return {"a", "b"} <= ready


async def test_a_session_on_a_reconnecting_through_b_is_sent_back_to_a(cluster: dict[str, Server]) -> None:
    a, b = cluster["a"], cluster["b"]
    for node in (a, b):
        await wait_for(lambda: sees_both_ready(node), f"node {node.url} to see a and b ready")
    balancer = await Forwarder(a.port).start()
    tokens: list[str] = []

    async def get_token() -> str:
        async with AsyncLivegate(b.url, API_KEY) as lg:
            tokens.append((await lg.mint_token("traveller")).token)
        return tokens[-1]

    try:
        async with Subscriber(balancer.url, get_token) as subscriber, AsyncLivegate(a.url, API_KEY) as lg:
            sub = subscriber.subscribe("route:1")
            await sub.ready(timeout=10)
            assert subscriber.node == "a"
            session = subscriber.session
            await lg.publish("route:1", 0)
            first = await sub.get(timeout=10)
            assert isinstance(first, Event) and first.data == 0

            # The balancer now sends new connections to b; the connection is cut.
            balancer.hold()
            balancer.point(b.port)
            balancer.drop_all()
            await wait_for(lambda: subscriber.state != "connected", "the subscriber to notice")
            for n in (1, 2, 3):
                await lg.publish("route:1", n)
            balancer.release()
            await wait_for(lambda: subscriber.welcomes == 2, "the subscriber back", within=30)
            assert (subscriber.node, subscriber.session) == ("a", session)
            assert subscriber.redirects == 1, "b refused with 4421 naming a, followed once"
            assert subscriber.resumed == 1 and len(tokens) == 1, "the resume credential did it"
            assert [(await sub.get(timeout=10)).data for _ in range(3)] == [1, 2, 3]  # type: ignore[union-attr]

            # Reconnects go to a first now: the balancer sees none of them.
            through = balancer.accepted
            await subscriber.reconnect()
            await wait_for(lambda: subscriber.welcomes == 3, "the subscriber back again")
            assert subscriber.node == "a" and balancer.accepted == through and subscriber.redirects == 1
            await lg.publish("route:1", 4)
            assert (await sub.get(timeout=10)).data == 4  # type: ignore[union-attr]
    finally:
        await balancer.close()


async def test_follows_4421_to_the_named_node_with_the_same_token(server: Server) -> None:
    refused: list[str] = []

    async def wrong_node(ws: ServerConnection) -> None:
        assert ws.request is not None
        refused.append(ws.request.path)
        await ws.send(json.dumps({"op": "error", "code": "wrong_node", "message": "served by a", "node": "a", "url": server.url}))
        await ws.close(4421, server.url)

    tokens: list[str] = []

    async def get_token() -> str:
        async with AsyncLivegate(server.url, API_KEY) as lg:
            tokens.append((await lg.mint_token("wanderer")).token)
        return tokens[-1]

    async with serve(wrong_node, "127.0.0.1", 0) as other:
        port = other.sockets[0].getsockname()[1]
        async with Subscriber(f"http://127.0.0.1:{port}", get_token) as subscriber, AsyncLivegate(server.url, API_KEY) as lg:
            sub = subscriber.subscribe("redirect:1")
            await sub.ready(timeout=10)
            await lg.publish("redirect:1", "here")
            item = await sub.get(timeout=10)
            assert isinstance(item, Event) and item.data == "here"
            assert subscriber.redirects == 1 and subscriber.welcomes == 1
            assert len(refused) == 1 and len(tokens) == 1, "the refused token was offered again, not a new one"
            assert f"token={tokens[0]}" in refused[0]


def overview(node: Server) -> dict[str, Any]:
    answer = httpx.get(f"{node.url}/v1/admin/overview", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
    body: dict[str, Any] = answer.json()
    return body


async def test_a_rebalance_hands_a_session_over_with_4421_after_its_welcome(cluster: dict[str, Server]) -> None:
    """An operator's rebalance closes a welcomed connection with 4421 naming the node that
    takes it: the subscriber goes there at once with its resume credential, nothing lost."""
    a, b = cluster["a"], cluster["b"]
    for node in (a, b):
        await wait_for(lambda: sees_both_ready(node), f"node {node.url} to see a and b ready")

    def minting(user: str) -> Callable[[], Awaitable[str]]:
        async def get_token() -> str:
            async with AsyncLivegate(a.url, API_KEY) as lg:
                return (await lg.mint_token(user)).token

        return get_token

    async with Subscriber(a.url, minting("mover-1")) as one, Subscriber(a.url, minting("mover-2")) as two:
        subs = [one.subscribe("moved:1"), two.subscribe("moved:1")]
        for sub in subs:
            await sub.ready(timeout=10)
        assert (one.node, two.node) == ("a", "a")
        async with AsyncLivegate(a.url, API_KEY) as lg:
            await lg.publish("moved:1", 0)

            def b_sees_a_loaded() -> bool:
                loads = {n["node"]: n.get("connections") for n in overview(b).get("nodes", [])}
                return loads.get("a") == 2

            await wait_for(b_sees_a_loaded, "b to hear a's two connections")
            answer = httpx.post(
                f"{b.url}/v1/admin/rebalance",
                json={"to": "b", "per_second": 20},
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=5,
            )
            assert answer.status_code == 202, answer.text
            await wait_for(lambda: {one.node, two.node} == {"a", "b"}, "one session handed over to b", within=20)
            moved = one if one.node == "b" else two
            assert moved.welcomes == 2 and moved.resumed == 1 and moved.redirects == 1
            await lg.publish("moved:1", 1)
            for sub in subs:
                assert [(await sub.get(timeout=10)).data for _ in range(2)] == [0, 1]  # type: ignore[union-attr]
