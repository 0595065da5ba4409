// Bundle the client and the dashboard, once, into the files the server serves
// (migratory/server/static/, not committed: `make serve` and `make test` build them).
//   /client/migratory.js        <- src/index.js (cbor-x inside), ES module
//   /dashboard                  <- dashboard/index.html
//   /dashboard/dashboard.js     <- dashboard/main.js (the client and uPlot inside)
//   /dashboard/dashboard.css    <- dashboard/dashboard.css (uPlot's stylesheet inside)

import { copyFile, mkdir } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import * as esbuild from "esbuild";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const out = join(here, "..", "..", "migratory", "server", "static");

const common = {
  bundle: true,
  format: "esm",
  target: ["es2022"],
  platform: "browser",
  minify: true,
  legalComments: "eof",
  keepNames: true, // error classes keep their names (error.name, instanceof messages)
  logLevel: "warning",
};

await mkdir(join(out, "client"), { recursive: true });
await mkdir(join(out, "dashboard"), { recursive: true });
await esbuild.build({
  ...common,
  entryPoints: [join(here, "src", "index.js")],
  outfile: join(out, "client", "migratory.js"),
});
await esbuild.build({
  ...common,
  entryPoints: [join(here, "dashboard", "main.js")],
  outfile: join(out, "dashboard", "dashboard.js"),
});
await esbuild.build({
  ...common,
  entryPoints: [join(here, "dashboard", "dashboard.css")],
  outfile: join(out, "dashboard", "dashboard.css"),
});
await copyFile(join(here, "dashboard", "index.html"), join(out, "dashboard", "index.html"));
console.log(`built ${out}/client/migratory.js and ${out}/dashboard/`);
