"""Webhook signature verification.

livegate signs each webhook with `X-Livegate-Signature: sha256=<hex>`: the lowercase hex
HMAC-SHA256 of the raw request body under the server's `webhook_secret`. Check it on the
bytes received, before parsing them; `verify_webhook` compares in constant time and
returns the parsed body. Dedupe on its `id`: delivery is at least once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from .errors import WebhookVerificationError

SIGNATURE_HEADER = "X-Livegate-Signature"
ID_HEADER = "X-Livegate-Id"


def webhook_signature(secret: str | bytes, body: bytes) -> str:
    """The `X-Livegate-Signature` value livegate sends with `body`."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify_signature(secret: str | bytes, body: bytes, signature: str | None) -> bool:
    """Whether `signature` (the header's value) is `body`'s, compared in constant time."""
    if not signature:
        return False
    want = webhook_signature(secret, body).encode("ascii")
    try:
        got = signature.strip().encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(got, want)


def verify_webhook(secret: str | bytes, body: bytes, headers: Mapping[str, str] | str | None) -> dict[str, Any]:
    """Checks a webhook and returns its parsed body; raises `WebhookVerificationError` when
    the signature is missing or wrong (answer 401 then). `headers` is the request's
    headers (any mapping; the name is matched without regard to case) or the signature
    header's value itself."""
    if isinstance(headers, str) or headers is None:
        signature = headers
    else:
        signature = headers.get(SIGNATURE_HEADER)
        if signature is None:
            lowered = SIGNATURE_HEADER.lower()
            signature = next((v for k, v in headers.items() if k.lower() == lowered), None)
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError("livegate: verify the raw body bytes, not a parsed or re-encoded body")
    if not verify_signature(secret, bytes(body), signature):
        raise WebhookVerificationError("webhook signature missing or wrong")
    parsed = json.loads(body)
    if not isinstance(parsed, dict):
        raise WebhookVerificationError("webhook body is not a JSON object")
    return parsed
