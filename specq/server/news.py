"""Wake-ups for the server's readers of synchronous requests: a worker publishes the
ids of the requests it just checkpointed (queue/sync.announce); one thread listens
and sets the asyncio events of those requests' readers.

A wake-up is only a hint: readers also look every POLL_S without one, so a message
lost with a Redis restart, or published while this thread reconnects, delays a
stream by at most that, and loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import redis

from specq.queue import keys

POLL_S = 0.5
log = logging.getLogger("specq.server")


class News(threading.Thread):
    def __init__(self, client: redis.Redis, batch_id: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="specq-news", daemon=True)
        self.client = client
        self.channel = keys.news(batch_id)
        self.loop = loop
        self.waiters: dict[str, asyncio.Event] = {}  # request id -> its reader's event
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self._listen()
            except (redis.RedisError, OSError) as exc:
                log.warning("lost the news channel (%s); readers poll until it is back", exc.__class__.__name__)
                self.stopped.wait(1.0)

    def _listen(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(self.channel)
            while not self.stopped.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is None or message.get("type") != "message":
                    continue
                for rid in message["data"].decode().split():
                    event = self.waiters.get(rid)
                    if event is not None:
                        self.loop.call_soon_threadsafe(event.set)
        finally:
            pubsub.close()

    def stop(self) -> None:
        self.stopped.set()
