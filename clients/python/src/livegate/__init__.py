"""livegate: a Python client for the livegate real-time gateway.

- `Livegate` / `AsyncLivegate`: the backend client (publish with idempotent retry,
  history, room state, presence, kick, token minting).
- `sign_jwt`: connection tokens your backend signs itself.
- `verify_webhook`: checks a webhook's `X-Livegate-Signature`.
- `Subscriber`: an asyncio subscriber that receives every event once and in order across
  reconnects and server restarts.
"""

from .backend import AsyncLivegate, Livegate, RetryPolicy
from .errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    LivegateError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitedError,
    RequestRefused,
    ServerError,
    SubscriberClosed,
    SubscriptionRefused,
    TransportError,
    WebhookVerificationError,
)
from .models import Event, Gap, History, Member, Presence, Published, RoomState, Token
from .subscriber import Item, Subscribed, Subscriber, Subscription
from .tokens import claims, sign_jwt
from .webhooks import verify_signature, verify_webhook, webhook_signature

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncLivegate",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "Event",
    "ForbiddenError",
    "Gap",
    "History",
    "Item",
    "Livegate",
    "LivegateError",
    "Member",
    "NotFoundError",
    "PayloadTooLargeError",
    "Presence",
    "Published",
    "RateLimitedError",
    "RequestRefused",
    "RetryPolicy",
    "RoomState",
    "ServerError",
    "Subscribed",
    "Subscriber",
    "SubscriberClosed",
    "Subscription",
    "SubscriptionRefused",
    "Token",
    "TransportError",
    "WebhookVerificationError",
    "claims",
    "sign_jwt",
    "verify_signature",
    "verify_webhook",
    "webhook_signature",
]
