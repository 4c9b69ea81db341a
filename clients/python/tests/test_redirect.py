"""Following `wrong_node` (close 4421): a node that does not serve the session refuses the
handshake naming the node that does; the subscriber goes there at once with the same,
unspent token. The refusing node here is a small scripted WebSocket server sending exactly
what a livegate node sends (an `error` frame `wrong_node`, then close 4421 with the URL as
reason); the node it names is the real server. (A real two-node cluster would need NATS:
livegate.js's suite covers that.)"""

from __future__ import annotations

import json

from websockets.asyncio.server import ServerConnection, serve

from livegate import AsyncLivegate, Event, Subscriber

from .conftest import API_KEY, Server


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
