// The byte-exact examples of docs/protocol.md: {title, direction, payload} per example,
// the WebSocket frame header stripped and client frames unmasked.

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const DOC = fileURLToPath(new URL("../../../../docs/protocol.md", import.meta.url));

function hex(text) {
  return Uint8Array.from(text.trim().split(/\s+/).map((b) => parseInt(b, 16)));
}

/** The payload of one whole WebSocket frame (RFC 6455 §5.2), unmasked. */
export function framePayload(frame) {
  let length = frame[1] & 0x7f;
  let offset = 2;
  if (length === 126) {
    length = (frame[2] << 8) | frame[3];
    offset = 4;
  } else if (length === 127) {
    throw new Error("64-bit frame lengths are not used in the examples");
  }
  const masked = (frame[1] & 0x80) !== 0;
  const key = masked ? frame.subarray(offset, offset + 4) : null;
  if (masked) offset += 4;
  const payload = frame.slice(offset);
  if (payload.length !== length) throw new Error(`frame length ${length} != ${payload.length}`);
  if (key) for (let i = 0; i < payload.length; i += 1) payload[i] ^= key[i % 4];
  return payload;
}

export function protocolExamples() {
  const text = readFileSync(DOC, "utf8");
  const section = text.split("<!-- examples:begin -->")[1];
  const examples = [];
  const pattern = /^### (client → server|server → client): (.+)\n\n```\n([0-9a-f \n]+)```/gm;
  for (const match of section.matchAll(pattern)) {
    const frame = hex(match[3]);
    examples.push({
      direction: match[1].startsWith("client") ? "client" : "server",
      title: match[2].trim(),
      opcode: frame[0] & 0x0f, // 2: binary (one CBOR operation), 8: close
      payload: framePayload(frame),
    });
  }
  return examples;
}
