"""Memory of a decoded server frame in the SDKs: bytes per message at the peak of the
decode and kept afterwards, for one ``batch`` of ``--messages`` small messages (content
``--size`` bytes, one subject), against the frame's own bytes per message::

    .venv/bin/python benchmarks/sdk_decode_memory.py --messages 100000
    .venv/bin/python benchmarks/sdk_decode_memory.py --messages 100000 --js

Python: tracemalloc around ``ops.decode_server_op`` (the trio SDK's decode), then the
decode's time without tracemalloc (best of ``--repeat``). ``--js``: the same frame
decoded by the browser SDK's ``decodeServerOp`` in node (clients/js, after ``npm ci``),
V8's heap after a full GC before and after (what is kept; V8 shows no peak), and the
time. Time on this 2-core box is noisy; bytes are not.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import time
import tracemalloc
from pathlib import Path

from migratory.model.message import Message, MessageType
from migratory.protocol import ops

JS = Path(__file__).resolve().parents[1] / "clients" / "js"


def frame(count: int, size: int, subject: str) -> bytes:
    messages = tuple(
        Message(subject, (b"%08d" % i * (size // 8 + 1))[:size], epoch=123456789, seq=i + 1,
                type=MessageType.RECOVERED)
        for i in range(count)
    )
    return ops.encode_server_op(ops.Deliver(messages))


def python_figures(payload: bytes, count: int, repeat: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    op = ops.decode_server_op(payload)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(op, ops.Deliver) and len(op.messages) == count
    del op
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        ops.decode_server_op(payload)
        best = min(best, time.perf_counter() - started)
    return {"peak_per_message": peak / count, "kept_per_message": kept / count,
            "decode_ms": best * 1000}


JS_PROBE = """
import { readFileSync } from "node:fs";
import { decodeServerOp } from "./src/codec.js";
const payload = new Uint8Array(readFileSync(process.argv[2]));
const heap = () => { global.gc(); global.gc(); return process.memoryUsage().heapUsed; };
const before = heap();
const op = decodeServerOp(payload);
const kept = heap() - before;
let best = Infinity;
for (let i = 0; i < Number(process.argv[3]); i += 1) {
  const started = performance.now();
  decodeServerOp(payload);
  best = Math.min(best, performance.now() - started);
}
const content = op.messages[0].content;
console.log(JSON.stringify({ kept_per_message: kept / op.messages.length, decode_ms: best,
  content_is_a_view_of_the_frame: content.buffer.byteLength === payload.byteLength }));
"""


def js_figures(payload: bytes, repeat: int) -> dict[str, float]:
    frame_file = Path("/tmp") / f"sdk_decode_memory_{len(payload)}.cbor"
    probe = JS / ".decode_memory_probe.mjs"
    frame_file.write_bytes(payload)
    probe.write_text(JS_PROBE)
    try:
        out = subprocess.run(
            ["node", "--expose-gc", probe.name, str(frame_file), str(repeat)],
            cwd=JS, capture_output=True, text=True, timeout=600,
        )
        if out.returncode:
            raise SystemExit(f"node failed: {out.stderr}")
    finally:
        probe.unlink()
        frame_file.unlink()
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=8, help="content bytes per message")
    parser.add_argument("--subject", default="/a/b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--js", action="store_true", help="also the browser SDK, in node")
    args = parser.parse_args()
    payload = frame(args.messages, args.size, args.subject)
    per = len(payload) / args.messages
    print(f"frame: {len(payload)} bytes, {args.messages} messages, {per:.1f} bytes each")
    py = python_figures(payload, args.messages, args.repeat)
    peak, kept = py["peak_per_message"], py["kept_per_message"]
    print(f"python: peak {peak:.0f} B/message ({peak / per:.1f}x the frame),"
          f" kept {kept:.0f} ({kept / per:.1f}x), decode {py['decode_ms']:.0f} ms")
    if args.js:
        js = js_figures(payload, args.repeat)
        print(f"js: kept {js['kept_per_message']:.0f} B/message"
              f" ({js['kept_per_message'] / per:.1f}x the frame), decode {js['decode_ms']:.0f} ms,"
              f" contents are views of the frame: {js['content_is_a_view_of_the_frame']}")


if __name__ == "__main__":
    main()
