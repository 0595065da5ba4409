"""A session taking a run of encoded messages (:class:`~migratory.server.format_sink.Run`)
in one append. A mixin of :class:`~migratory.server.session.Session`; an MQTT session
queues its runs with :func:`queue_run` (``MqttDelivery.deliver_missed``).

A run is what ``deliver`` would get one frame at a time (the messages a cluster member's
cache sync jumped over, ``Hub._catch_up_live``), joined once for every subscriber. Taken
whole, its outcome must be what the frames one by one would have had:

- the limits (``ClientMaxPendingBytes``, ``OutboxMemoryBudget``): the bytes pending only
  grow along a run, as the budget's total does (nothing else happens meanwhile), so a
  frame of it would have passed a limit if and only if the run's last one would: the run
  is refused whole exactly when one of its frames would have been (the client cut off as
  a slow consumer, what it had queued dropped either way -- but for the unwritten rest
  of a run a write stopped in, kept whole before the close frame where the rest of one
  frame was: whole frames more of what it was sent, in order;
  ``test_run_output.py::test_cut_off_with_a_run_partly_written_the_rest_of_the_run_is_kept``);
- the writes: a frame that fills a batch (``MaxBatchingSpace``) has the batch written at
  once (``flush_now``), the socket taking what it can before the next frame comes. Of a
  run that would fill one on its way, the frames up to the one that fills it are given
  in one append (they were given one by one: the same bytes are written at the same
  points, none before it filling a batch), and the rest after its write as a run
  again -- all of it at once
  if the socket is full already (``Link.writing``: a drain task owns it; a flush writes
  nothing then, so one after the run is all those after each frame were).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.model.outbox import Outbox

if TYPE_CHECKING:
    from migratory.server.session_link import Link


class RunOutput:
    """``deliver_run``: for a session's outbox."""

    __slots__ = ()

    outbox: Outbox
    _link: Link

    def deliver(self, frame: bytes) -> None:
        raise NotImplementedError  # Session

    def deliver_run(self, run: bytes, frames: tuple[bytes, ...]) -> None:
        """``frames``, joined as ``run``: what :meth:`deliver` of each in turn does, in
        one append when no batch fills on the way (module docstring)."""
        queue_run(self.outbox, self._link, self.deliver, run, frames)


def queue_run(outbox: Outbox, link: Link, deliver: Callable[[bytes], object], run: bytes,
              frames: tuple[bytes, ...]) -> None:
    """``frames``, joined as ``run``, through ``deliver`` (which queues one frame in
    ``outbox``, and has ``link`` write it when its batch is full): in one call when no
    batch fills on the way; else the frames up to the one that fills it in one call (the
    batch written at once, as when they came one by one: those before it filled none),
    then the rest the same way."""
    given = 0  # bytes of ``run`` given so far
    index = 0  # frames given so far
    while given < len(run):
        if link.writing or outbox.pending_bytes + len(run) - given < outbox.batch_space:
            deliver(run[given:] if given else run)
            return
        room = outbox.batch_space - outbox.pending_bytes  # the frame reaching it fills it
        cut = given
        while index < len(frames):
            cut += len(frames[index])
            index += 1
            if cut - given >= room:
                break
        deliver(run[given:cut])
        given = cut
