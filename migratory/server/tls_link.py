"""TLS for one client connection, on memory buffers.

The connection keeps writing pre-encoded batches with one non-blocking
``sock.send`` (see ``connection``); with TLS each batch is encrypted first.
:class:`TlsLink` wraps an :class:`ssl.SSLObject` between two
:class:`ssl.MemoryBIO`: ciphertext from the socket goes in with
:meth:`receive` (plaintext out), plaintext goes in with :meth:`encrypt`, and
whatever the socket must carry -- handshake records or encrypted data -- comes
out of :meth:`take_output`. No I/O here.
"""

from __future__ import annotations

import ssl


class TlsFailed(Exception):
    """The peer broke the TLS handshake or a record; close the connection."""


class TlsLink:
    __slots__ = ("_in", "_out", "_tls", "closed", "ready")

    def __init__(self, context: ssl.SSLContext) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=True)
        self.ready = False  # handshake done: application data may flow
        self.closed = False  # the peer sent its close_notify: it sends nothing more

    @property
    def has_output(self) -> bool:
        return self._out.pending > 0

    def receive(self, data: bytes) -> bytes:
        """Feed ciphertext (``b""``: the peer closed); the plaintext it carried."""
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()
        chunks: list[bytes] = []
        try:
            if not self.ready:
                self._tls.do_handshake()
                self.ready = True
            while True:
                chunk = self._tls.read(65536)
                if not chunk:  # the session is over (after a close_notify read() returns
                    self.closed = True  # b"" for ever: looping on it hung the whole server)
                    break
                chunks.append(chunk)
        except ssl.SSLZeroReturnError:
            self.closed = True  # as a TCP end: the connection is over once this is read
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            raise TlsFailed(str(getattr(exc, "reason", None) or exc)) from None
        return b"".join(chunks)

    def encrypt(self, data: bytes) -> None:
        """Queue ``data`` for the peer (handshake done); take it with :meth:`take_output`."""
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            raise TlsFailed(str(getattr(exc, "reason", None) or exc)) from None

    def seal(self, data: bytes) -> bytes:
        """``data`` encrypted (handshake done), after any record already waiting: what
        the socket must carry now. One call per batch: one TLS write, one buffer read."""
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            raise TlsFailed(str(getattr(exc, "reason", None) or exc)) from None
        return self._out.read()

    def end(self) -> bool:
        """Queue our ``close_notify``, the TLS end of our stream, to go before our FIN
        (without it a client's TLS sees a truncated stream: Python's ssl raises
        ``EOF occurred in violation of protocol``); whether one was queued. The peer's
        records are still read after it (its close frame in answer)."""
        if not self.ready:
            return False
        try:
            self._tls.unwrap()
        except ssl.SSLWantReadError:
            pass  # (the peer's close_notify not read yet: ours is queued all the same)
        except ssl.SSLError:
            return False
        return self.has_output

    def take_output(self) -> bytes:
        """Ciphertext waiting for the socket."""
        return self._out.read()
