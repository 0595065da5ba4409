import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { CLOSE_CODES, CloseCode, describeCloseCode, shouldReconnect } from "../src/index.js";

const SOURCE = fileURLToPath(new URL("../../../migratory/protocol/close_codes.py", import.meta.url));

// The shared table's own verdicts, from the Python module itself.
function pythonVerdicts() {
  const script = `
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("close_codes", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules["close_codes"] = m; spec.loader.exec_module(m)
print(json.dumps({"table": [[c.code, c.name, c.reconnect] for c in m.ALL],
  "verdicts": [m.should_reconnect(c) for c in range(1000, 5000)],
  "none": m.should_reconnect(None)}))`;
  return JSON.parse(execFileSync("python3", ["-c", script, SOURCE], { encoding: "utf8" }));
}

test("the close-code table is the Python one", () => {
  const python = pythonVerdicts();
  assert.deepEqual([...CLOSE_CODES.values()].map((c) => [c.code, c.name, c.reconnect]), python.table);
  assert.equal(CloseCode.DRAINED, 4502);
  assert.equal(describeCloseCode(4003), "4003 CONNECT_DENIED");
  assert.equal(describeCloseCode(4999), "4999");
});

test("reconnect or give up: the same verdict as the server's rule for every code", () => {
  const python = pythonVerdicts();
  for (let code = 1000; code < 5000; code += 1) {
    assert.equal(shouldReconnect(code), python.verdicts[code - 1000], `code ${code}`);
  }
  assert.equal(shouldReconnect(null), python.none);
});
