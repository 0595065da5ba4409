"""The sequencer of a server with workers: the one place its positions come from.

With ``Workers = N > 1`` the supervising process (:mod:`cluster.workers`) runs this
role and no client I/O. It plays, over a local authenticated cluster link, the part a
seed plays for non-seeds (:mod:`cluster.upstream`): each worker forwards its clients'
publishes here (``Forward``), the sequencer numbers them in arrival order with the
seeds' own pure :class:`~cluster.coordination.Coordinator` -- one epoch per subject
group, seq + 1 per message -- and every numbered batch goes, encoded once, to every
worker (``Batch``), the one that took the publish included, which acknowledges it
from there (``PUBLISH_OK`` with the position). A worker that (re)starts asks to be
caught up from its own clsn and gets the ring of recent batches or a whole cache sync
(:class:`~cluster.stream.CommittedStream`): this process keeps the caches in its own
hub for that.

There is no consensus to wait for: a batch is committed as soon as it is numbered.
The positions live in this process's memory; if it dies, its workers stop (they watch
their parent) and a restarted server starts new epochs, so clients resume with
``DATA_RESYNC`` -- as a restarted single-process server.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Sequence

import trio

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, Coordinator, PublishRequest
from cluster.peers import PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream
from migratory.config import Config
from migratory.model.position import new_epoch
from migratory.server.accept import serve_listeners
from migratory.server.app import EXPIRE_SUBJECTS_PER_TICK, build_hub

log = logging.getLogger("migratory.workers")

SEQUENCER_NAME = "sequencer"
EXPIRE_SECONDS = 1.0


def worker_name(index: int) -> str:
    return f"worker-{index}"


class Sequencer:
    """Numbers the workers' publishes and streams the numbered batches to every worker."""

    def __init__(self, config: Config, *, workers: int, password: str) -> None:
        self.hub = build_hub(config, epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True)
        self.replica = Replica(self.hub)
        publishing = ClusterPublishing(
            origin=f"{SEQUENCER_NAME}#{secrets.token_hex(4)}", replica=self.replica
        )
        self.stream = CommittedStream(publishing)
        self.coordinator = Coordinator()
        self.epoch_candidate = new_epoch()
        self.workers = frozenset(worker_name(i) for i in range(workers))
        self.max_frame_size = config.max_frame_size
        self.max_message_size = config.max_message_size
        self.password = password

    def take_forward(self, worker: str, requests: Sequence[PublishRequest]) -> None:
        """A worker's publishes: numbered now, in the order they came, and streamed
        (answered at once: nothing in flight for the link to wait for)."""
        batch = self.coordinator.apply_batch(self.epoch_candidate, requests)
        self.stream.on_committed(batch, trio.current_time())

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the workers' links on a free loopback port (given to ``started``)."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        host, port = listeners[0].socket.getsockname()[:2]
        # a worker dials "host:port" and checks that the link answers with that name
        peers = PeerService(
            name=f"{host}:{port}",
            members=self.workers,
            password=self.password,
            stream=self.stream,
            take_forward=self.take_forward,
            max_frame=link.accepted_frame_limit(self.max_frame_size),
            max_message_size=self.max_message_size,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(serve_listeners, name="sequencer",
                                  admit=peers.handshakes.admit),
                peers.serve_peer, listeners,
            )
            nursery.start_soon(self._expire)
            log.info("sequencer on %s:%d (epoch candidate %d)", host, port, self.epoch_candidate)
            task_status.started((host, port))

    async def _expire(self) -> None:
        """Drop cached messages older than CacheExpireTime, as a server's tick does."""
        while True:
            await trio.sleep(EXPIRE_SECONDS)
            self.hub.expire(trio.current_time(), budget=EXPIRE_SUBJECTS_PER_TICK * 10)
