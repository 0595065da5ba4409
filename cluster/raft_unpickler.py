"""What the Raft port may unpickle: the types of our commands and of pysyncobj's
messages, nothing else.

pysyncobj's wire format, its log entries and the dumps a leader sends are pickles, and
an unrestricted unpickle runs whatever code the pickle names: whoever can seal a message
with the cluster password (cluster/raft_cipher.py) could run code in every seed.
:func:`install` replaces ``pysyncobj.pickle.loads``/``load`` (every unpickle pysyncobj
does: messages, commands, dumps) with :class:`RaftUnpickler`, which resolves only

- plain data (pickle's own opcodes: None, bools, numbers, str, bytes, tuples, lists,
  dicts -- no lookup needed),
- classes defined in ``cluster.*``, ``migratory.model.*`` and ``pysyncobj.*`` (our
  replicated state, messages, pysyncobj's nodes and log), looked up by plain name,
- a few safe builtins (``set``, ``frozenset``, ``bytearray``, ``bytes`` -- protocol 2
  pickles an empty ``bytes`` as ``bytes()`` --, ``collections.deque`` and
  ``OrderedDict``) and ``_codecs.encode``, which protocol 2 uses for other ``bytes``.

Anything else -- ``os.system``, ``builtins.eval``, a dotted name reaching through a
module -- raises :class:`pickle.UnpicklingError`; pysyncobj then drops the connection.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import pickle
from typing import IO, Any, Final

ALLOWED_MODULE_PREFIXES = ("cluster.", "migratory.model.", "pysyncobj.")
ALLOWED_GLOBALS = frozenset(
    {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("builtins", "bytes"),  # protocol 2 pickles b"" as bytes() (refused, every Raft
        # tick failed on a message with empty content: test_cluster_empty_payload.py)
        ("collections", "deque"),
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),  # protocol 2 pickles bytes as _codecs.encode(text, "latin1")
        ("copyreg", "_reconstructor"),  # protocol < 2 objects (builds only allowed classes)
    }
)


class RaftUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals listed in the module docstring."""

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2 writes ``__builtin__.set``), mapped as pickle maps them
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if "." not in name:
            if (module, name) in ALLOWED_GLOBALS:
                return super().find_class(module, name)
            if module.startswith(ALLOWED_MODULE_PREFIXES):
                found = super().find_class(module, name)
                if isinstance(found, type) and found.__module__ == module:
                    return found
        raise pickle.UnpicklingError(f"Raft: refusing to unpickle {module}.{name}")


def loads(data: bytes | str) -> Any:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return RaftUnpickler(io.BytesIO(data)).load()


def load(file: IO[bytes]) -> Any:
    return RaftUnpickler(file).load()


class _EmptyBytes(bytes):
    """An empty ``bytes`` that protocol 2 pickles as any other, ``_codecs.encode('',
    'latin1')``, not as ``bytes()``; unpickled, a plain empty ``bytes``."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return codecs.encode, ("", "latin1")


EMPTY_CONTENT: Final[bytes] = _EmptyBytes()
"""An empty content as a Raft command carries it (``cluster.raft.to_wire``): pysyncobj
pickles commands with protocol 2, which writes an empty ``bytes`` as ``bytes()``, and a
seed from before ``builtins.bytes`` was allowed here (524f73f) refuses that global. In a
rolling upgrade, one empty payload taken by an upgraded seed stopped the Raft of every
524f73f seed (two of three: nothing committed after it; docs/cluster.md, "Upgrading and
downgrading")."""


def install() -> None:
    """Make every unpickle of pysyncobj go through :class:`RaftUnpickler` (idempotent)."""
    import pysyncobj.pickle

    pysyncobj.pickle.loads = loads
    pysyncobj.pickle.load = load
