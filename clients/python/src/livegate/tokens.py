"""Connection tokens your backend signs itself (JWTs), without a round trip to livegate.

`sign_jwt` makes the token a browser or a `Subscriber` connects with (`?token=`). The
server checks it with the key it is configured with (`jwt_hmac_secret` for HS256,
`jwt_public_key_file` or `jwt_jwks_file` for RS256, ES256 and EdDSA) and spends its `jti`
once, as it spends a minted token. HS256 needs only the standard library; the other
algorithms need the `jwt` extra (`pip install "livegate[jwt]"`: PyJWT and cryptography).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from typing import Any

from .errors import LivegateError

ALGORITHMS = ("HS256", "RS256", "ES256", "EdDSA")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def claims(
    user: str,
    *,
    device: str = "web",
    rooms: Iterable[str] = (),
    publish: Iterable[str] = (),
    ttl: int = 60,
    cell: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The claims `sign_jwt` signs: `sub`, `device`, `rooms`, `publish`, `cell` (when
    given), `iat`, `exp` (`iat` + `ttl` seconds) and a random `jti`."""
    if not user:
        raise ValueError("livegate: user must not be empty")
    if ttl <= 0:
        raise ValueError("livegate: ttl must be positive seconds")
    issued = int(now if now is not None else time.time())
    body: dict[str, Any] = {
        "sub": user,
        "device": device,
        "rooms": list(rooms),
        "publish": list(publish),
        "iat": issued,
        "exp": issued + int(ttl),
        "jti": secrets.token_hex(16),
    }
    if cell is not None:
        body["cell"] = cell
    return body


def sign_jwt(
    secret_or_pem: str | bytes,
    user: str,
    device: str = "web",
    rooms: Iterable[str] = (),
    publish: Iterable[str] = (),
    ttl: int = 60,
    cell: str | None = None,
    alg: str = "HS256",
    *,
    kid: str | None = None,
) -> str:
    """A JWT for `user` signed with `secret_or_pem`: the HMAC secret for HS256 (the
    server's `jwt_hmac_secret`), else the PEM private key matching the server's public
    key (RS256: RSA, ES256: EC P-256, EdDSA: Ed25519). `kid` goes into the header (for a
    server that reads a JWKS file). `rooms` limits what the connection may read (empty:
    any room), `publish` what it may publish to (empty: nothing)."""
    if alg not in ALGORITHMS:
        raise ValueError(f"livegate: alg must be one of {', '.join(ALGORITHMS)}, not {alg!r}")
    key = secret_or_pem.encode() if isinstance(secret_or_pem, str) else secret_or_pem
    body = claims(user, device=device, rooms=rooms, publish=publish, ttl=ttl, cell=cell)
    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    if alg == "HS256":
        if len(key) < 32:
            raise ValueError("livegate: an HS256 secret must be at least 32 bytes (the server refuses shorter ones)")
        signing_input = _b64(_json(header)) + "." + _b64(_json(body))
        signature = hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
        return signing_input + "." + _b64(signature)
    try:
        import jwt as pyjwt
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise LivegateError(f'livegate: {alg} needs PyJWT and cryptography: pip install "livegate[jwt]"') from error
    headers = {"kid": kid} if kid is not None else None
    return pyjwt.encode(body, key, algorithm=alg, headers=headers)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
