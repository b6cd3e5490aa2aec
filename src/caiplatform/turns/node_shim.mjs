// Runs a Node.js function for the harness: `node node_shim.mjs <code dir>`.
// Loads <code dir>/index.js (CommonJS or ES module) and calls its exported `handle(event, context)`
// for each JSON line on stdin ({id, event, context}); answers one JSON line per call on stdout
// ({id, value} or {id, error}; `out_of_memory: true` beside the error when an allocation failed).
// The first line out is {ready: true} or {ready: false, error}.
// The function's own console output goes to stderr so it cannot corrupt the protocol.
import path from "node:path";
import readline from "node:readline";
import { pathToFileURL } from "node:url";

const write = process.stdout.write.bind(process.stdout);
const send = (obj) => write(JSON.stringify(obj) + "\n");
for (const name of ["log", "info", "debug"]) console[name] = (...args) => console.error(...args);

function describe(err) {
  if (err && typeof err === "object" && "message" in err) return `${err.name || "Error"}: ${err.message}`;
  return String(err);
}

let handle;
try {
  const mod = await import(pathToFileURL(path.join(process.argv[2], "index.js")).href);
  handle = mod.handle ?? mod.default?.handle ?? (typeof mod.default === "function" ? mod.default : undefined);
} catch (err) {
  send({ ready: false, error: `cannot load index.js: ${describe(err)}` });
  process.exit(1);
}
if (typeof handle !== "function") {
  send({ ready: false, error: "index.js must export a function `handle(event, context)`" });
  process.exit(1);
}
send({ ready: true });

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", async (line) => {
  let request;
  try {
    request = JSON.parse(line);
  } catch (err) {
    return;
  }
  try {
    const value = await handle(request.event, request.context);
    send({ id: request.id, value: value === undefined ? null : value });
  } catch (err) {
    const failed = { id: request.id, error: describe(err) };
    // V8's words when the memory of an ArrayBuffer (a Buffer) could not be had.
    if (err instanceof RangeError && /allocation failed/i.test(err.message)) failed.out_of_memory = true;
    send(failed);
  }
});
lines.on("close", () => process.exit(0));
