"""Tokens signed by the backend: what `sign_jwt` signs (checked with PyJWT, for every
algorithm), and a server configured with `jwt_hmac_secret` accepting an HS256 one once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

import livegate
from livegate import AsyncLivegate, Event, Subscriber, sign_jwt

from .conftest import API_KEY, Server

SECRET = "a-jwt-hmac-secret-of-at-least-32-bytes!"


def test_hs256_claims_and_signature() -> None:
    before = int(time.time())
    token = sign_jwt(SECRET, "alice", device="phone", rooms=["match:*"], publish=["chat:1"], ttl=120, cell="eu")
    header = json.loads(pyjwt.utils.base64url_decode(token.split(".")[0]))
    assert header == {"alg": "HS256", "typ": "JWT"}
    claims = pyjwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice" and claims["device"] == "phone" and claims["cell"] == "eu"
    assert claims["rooms"] == ["match:*"] and claims["publish"] == ["chat:1"]
    assert before <= claims["iat"] <= before + 2 and claims["exp"] == claims["iat"] + 120
    assert len(claims["jti"]) == 32
    assert pyjwt.decode(sign_jwt(SECRET, "alice"), SECRET, algorithms=["HS256"])["jti"] != claims["jti"]
    assert "cell" not in pyjwt.decode(sign_jwt(SECRET, "bob"), SECRET, algorithms=["HS256"])
    with pytest.raises(pyjwt.InvalidSignatureError):
        pyjwt.decode(token, SECRET + "x", algorithms=["HS256"])
    with pytest.raises(ValueError):
        sign_jwt("short", "alice")
    with pytest.raises(ValueError):
        sign_jwt(SECRET, "alice", alg="none")


@pytest.mark.parametrize(
    ("alg", "make"),
    [
        ("RS256", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        ("ES256", lambda: ec.generate_private_key(ec.SECP256R1())),
        ("EdDSA", lambda: ed25519.Ed25519PrivateKey.generate()),
    ],
)
def test_asymmetric_algorithms_verify_with_the_public_key(alg: str, make: Callable[[], object]) -> None:
    key = make()
    pem = key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    token = sign_jwt(pem, "dave", rooms=["r:*"], alg=alg, kid="k1")
    assert pyjwt.get_unverified_header(token)["kid"] == "k1"
    claims = pyjwt.decode(token, public, algorithms=[alg])
    assert claims["sub"] == "dave" and claims["rooms"] == ["r:*"] and claims["exp"] > claims["iat"]


async def test_server_accepts_an_hs256_jwt_once(start_server: Callable[..., Server]) -> None:
    """A server given `jwt_hmac_secret`: a signed token connects once, is
    refused on replay (`token_replayed`), and a subscriber using signed tokens receives
    events; the token's `rooms` claim limits what it may read."""
    server = start_server(env={"LIVEGATE_JWT_HMAC_SECRET": SECRET})
    endpoint = server.url.replace("http://", "ws://") + "/v1/ws?token="
    token = sign_jwt(SECRET, "jwt-user", rooms=["jwt:*"])
    try:
        async with connect(endpoint + token) as ws:
            welcome = json.loads(await ws.recv())
    except InvalidStatus as refused:
        pytest.fail(f"a signed HS256 token was refused: HTTP {refused.response.status_code} {refused.response.body!r}")
    assert welcome["op"] == "welcome"
    with pytest.raises(InvalidStatus) as replay:
        async with connect(endpoint + token):
            pass
    assert replay.value.response.status_code == 401
    assert json.loads(replay.value.response.body or b"{}")["error"]["code"] == "token_replayed"

    async with Subscriber(server.url, lambda: sign_jwt(SECRET, "jwt-user", rooms=["jwt:*"])) as subscriber:
        sub = subscriber.subscribe("jwt:1")
        outside = subscriber.subscribe("other:1")
        await sub.ready(timeout=10)
        async with AsyncLivegate(server.url, API_KEY) as lg:
            await lg.publish("jwt:1", {"signed": True})
        item = await sub.get(timeout=10)
        assert isinstance(item, Event) and item.data == {"signed": True}
        with pytest.raises(livegate.SubscriptionRefused) as refused_room:
            await outside.get(timeout=10)
        assert refused_room.value.code == "forbidden"
