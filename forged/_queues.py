"""A session's steering and follow-up queues: messages waiting for delivery to its run."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from . import _telemetry, _wire as w
from ._settings import Settings
from ._telemetry import Caller
from ._time import now_ms


@attrs.define(kw_only=True, eq=False, repr=False)
class Queued:
    """A steering or follow-up message waiting for delivery."""

    text: str
    message: w.UserMessage


def user_message(text: str, images: list[w.ImageContent] | None) -> w.UserMessage:
    content: list[w.UserContent] = [w.TextContent(text=text)]
    content.extend(images or [])
    return w.UserMessage(content=content, timestamp=now_ms())


def _mode(value: object) -> w.QueueMode:
    return "all" if value == "all" else "one-at-a-time"


class Queues:
    """Steering and follow-up messages waiting for delivery, and how many each delivery
    takes; every change is announced with ``queue_update``."""

    def __init__(self, emit: Callable[[w.Event], None], settings: Settings) -> None:
        self._emit = emit
        self._settings = settings
        self.steering: list[Queued] = []
        self.follow_ups: list[Queued] = []
        self.steering_mode: w.QueueMode = _mode(settings.get("steeringMode"))
        self.follow_up_mode: w.QueueMode = _mode(settings.get("followUpMode"))

    def __len__(self) -> int:
        return len(self.steering) + len(self.follow_ups)

    def add(self, kind: str, text: str, images: list[w.ImageContent] | None,
            caller: Caller | None = None) -> None:
        """Queue `text`; `caller`: the trace context it came with (its run's parent)."""
        queue = self.steering if kind == "steer" else self.follow_ups
        message = user_message(text, images)
        _telemetry.tag(message, caller)
        queue.append(Queued(text=text, message=message))
        self._changed()

    def clear(self) -> w.QueueContents:
        contents = w.QueueContents(steering=[q.text for q in self.steering],
                                   follow_up=[q.text for q in self.follow_ups])
        if self:
            self.steering.clear()
            self.follow_ups.clear()
            self._changed()
        return contents

    def take_steering(self) -> list[w.AgentMessage]:
        return self._take(self.steering, self.steering_mode)

    def take_follow_ups(self) -> list[w.AgentMessage]:
        return self._take(self.follow_ups, self.follow_up_mode)

    def set_steering_mode(self, mode: w.QueueMode) -> None:
        self.steering_mode = mode
        self._settings.remember(steeringMode=mode)

    def set_follow_up_mode(self, mode: w.QueueMode) -> None:
        self.follow_up_mode = mode
        self._settings.remember(followUpMode=mode)

    def _take(self, queue: list[Queued], mode: w.QueueMode) -> list[w.AgentMessage]:
        if not queue:
            return []
        count = len(queue) if mode == "all" else 1
        taken = queue[:count]
        del queue[:count]
        self._changed()
        return [q.message for q in taken]

    def _changed(self) -> None:
        self._emit(w.QueueUpdate(steering=[q.text for q in self.steering],
                                 follow_up=[q.text for q in self.follow_ups]))
