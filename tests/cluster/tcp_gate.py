"""A TCP forwarder on 127.0.0.1 that a test can close: new connections are then reset
at once (so a member dialling it moves on at once), and open ones can be reset too.

Used to steer where a non-seed goes next: a seed binds ``ClusterMemberBind`` behind a
gate on its ``ClusterMemberListen`` port (and one on port + 1 for Raft, always open).
Threads with blocking sockets, two per connection; every thread ends with its
connection or with :meth:`TcpGate.shutdown`.

:meth:`TcpGate.hold` stalls the open connections instead (a stalled network path: what
was sent waits, in both directions, nothing is lost) until :meth:`TcpGate.release`, which
delivers what waited towards the target first: a peer that gave up meanwhile and closed
its end has its last bytes delivered after the fact, then the end.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


def _reset(sock: socket.socket, *, close: bool = True) -> None:
    """End with an RST (SO_LINGER 0) once closed; without ``close``, shut it down so
    that the threads blocked on it wake up and close it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if close:
        sock.close()
    else:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class TcpGate:
    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port, self.target_port = listen_port, target_port
        self.open = True
        self.refused = 0
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self._listener.settimeout(0.2)
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._towards_target = threading.Event()
        self._towards_dialler = threading.Event()
        self._towards_target.set()
        self._towards_dialler.set()
        self._thread = threading.Thread(
            target=self._accept, daemon=True, name=f"gate-{listen_port}"
        )
        self._thread.start()

    def close_gate(self, *, reset_open: bool = False) -> int:
        """Refuse new connections; with ``reset_open``, reset the open ones too (their
        count)."""
        self.open = False
        if not reset_open:
            return 0
        with self._lock:
            pairs = list(self._pairs)
        for downstream, upstream in pairs:
            _reset(downstream, close=False)
            _reset(upstream, close=False)
        return len(pairs)

    def open_gate(self) -> None:
        self.open = True

    def hold(self) -> None:
        """Stall every connection through the gate, both ways (new ones too)."""
        self._towards_target.clear()
        self._towards_dialler.clear()

    def hold_back(self) -> None:
        """Stall only what the target sends back (the dialler's bytes go on through)
        until :meth:`release`: a link that still carries one way."""
        self._towards_dialler.clear()

    def release(self, settle: float = 0.5) -> None:
        """Deliver what waited: towards the target first, then (``settle`` s later, so
        that a dialler's last bytes and its close reach the target before anything of
        the target's reaches the closed dialler) back."""
        self._towards_target.set()
        time.sleep(settle)
        self._towards_dialler.set()

    def shutdown(self) -> None:
        self._done.set()
        self._thread.join(2)
        self._listener.close()
        self.close_gate(reset_open=True)

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                downstream, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.open:
                self.refused += 1
                _reset(downstream)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                _reset(downstream)
                continue
            downstream.settimeout(None)
            upstream.settimeout(None)
            pair = (downstream, upstream)
            with self._lock:
                self._pairs.add(pair)
            for src, dst, flowing in (
                (downstream, upstream, self._towards_target),
                (upstream, downstream, self._towards_dialler),
            ):
                threading.Thread(
                    target=self._pump, args=(src, dst, pair, flowing), daemon=True
                ).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        pair: tuple[socket.socket, socket.socket],
        flowing: threading.Event,
    ) -> None:
        try:
            while data := src.recv(1 << 16):
                while not flowing.wait(0.2):
                    if self._done.is_set():
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
