"""Webhook verification against a webhook the real server sends to a local receiver."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import livegate
from livegate import AsyncLivegate, Subscriber, verify_webhook

from .conftest import API_KEY, Server, wait_for

SECRET = "webhook-secret-for-the-python-tests"


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every POST's headers and raw body, answers 204."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/livegate-hooks"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


async def test_verifies_a_webhook_the_server_sent(receiver: Receiver, start_server: Callable[..., Server]) -> None:
    server = start_server(env={"LIVEGATE_WEBHOOK_URL": receiver.url, "LIVEGATE_WEBHOOK_SECRET": SECRET})

    async def get_token() -> str:
        async with AsyncLivegate(server.url, API_KEY) as lg:
            return (await lg.mint_token("hooked")).token

    async with Subscriber(server.url, get_token) as subscriber:
        await subscriber.subscribe("hooks:1").ready(timeout=10)
        await wait_for(lambda: receiver.received, "the room_occupied webhook")
    headers, body = receiver.received[0]
    hook = verify_webhook(SECRET, body, headers)
    assert hook["type"] == "room_occupied" and hook["room"] == "hooks:1"
    assert headers["X-Livegate-Id"] == hook["id"]
    # Header names in any case, or the header's value alone.
    assert verify_webhook(SECRET, body, {k.lower(): v for k, v in headers.items()}) == hook
    assert verify_webhook(SECRET.encode(), body, headers["X-Livegate-Signature"]) == hook
    # A changed body, another secret, no signature: refused.
    with pytest.raises(livegate.WebhookVerificationError):
        verify_webhook(SECRET, body.replace(b"hooks:1", b"hooks:2"), headers)
    with pytest.raises(livegate.WebhookVerificationError):
        verify_webhook("another-secret", body, headers)
    with pytest.raises(livegate.WebhookVerificationError):
        verify_webhook(SECRET, body, {})
    assert not livegate.verify_signature(SECRET, body, "sha256=" + "0" * 64)
