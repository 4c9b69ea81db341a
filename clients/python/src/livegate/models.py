"""The values the server answers with, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """One event of a room: its `seq` (1, 2, 3... per room and epoch), the publisher's
    `id` (or one the server gave), `ts_ms` when it was stored, `data` as published, and
    `sender` (the user of a client publish, else None)."""

    room: str
    seq: int
    id: str | None
    ts_ms: int
    data: Any
    sender: str | None = None

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Event:
        sender = raw.get("from")
        return Event(
            room=str(raw["room"]),
            seq=int(raw["seq"]),
            id=raw.get("id") if isinstance(raw.get("id"), str) else None,
            ts_ms=int(raw.get("ts_ms", 0)),
            data=raw.get("data"),
            sender=sender if isinstance(sender, str) else None,
        )


@dataclass(frozen=True)
class Gap:
    """The subscriber could not recover every event of `room`: the events after the last
    one it delivered up to `seq` are lost (`reason` "not_recovered": the server no longer
    has them, or the room's epoch changed to `epoch`). Events after `seq` follow."""

    room: str
    epoch: str | None
    seq: int
    reason: str


@dataclass(frozen=True)
class Published:
    """`publish`'s answer: the event's `seq` and `epoch`; `duplicate` when the server had
    the same `id` already (then `seq` is the first one's). A publish over a subscriber's
    connection is answered without the epoch: `epoch` is "" then."""

    room: str
    seq: int
    epoch: str
    duplicate: bool


@dataclass(frozen=True)
class History:
    """A page of a room's events after `since`; `head` is the room's last seq."""

    room: str
    epoch: str
    head: int
    events: list[Event]


@dataclass(frozen=True)
class RoomState:
    """A room's state as of event `seq` (0 and `data` None: no state)."""

    room: str
    epoch: str
    seq: int
    data: Any


@dataclass(frozen=True)
class Member:
    user: str
    device: str


@dataclass(frozen=True)
class Presence:
    """Who is in a room: `count` connections; `members` None above the server's
    `presence_members_max`."""

    room: str
    count: int
    members: list[Member] | None


@dataclass(frozen=True)
class Token:
    """A minted one-time connection token and when it expires (ms since the epoch)."""

    token: str
    expires_at_ms: int
