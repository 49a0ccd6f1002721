#!/usr/bin/env node
// A complete keel agent in plain Node.js (no dependencies), to show the agent protocol without the SDK.
//
// For a unit with params {"path": "some/file"} it asks the host for the time (never the local clock),
// reads the file through the host's read_file tool, records evidence, saves its state and returns
// {"mission", "path", "lines", "started_at"}. Run it as a mission's agent: agent = ["node", "docs/examples/line-count-agent.mjs"].
// Everything goes through stdin/stdout as Content-Length framed JSON-RPC 2.0; logs go to stderr.

let buffer = Buffer.alloc(0);
let nextId = 0;
let mission = null;
const pending = new Map(); // id of our request -> resolve/reject of its promise

function send(message) {
  const body = Buffer.from(JSON.stringify({ jsonrpc: "2.0", ...message }), "utf8");
  process.stdout.write(`Content-Length: ${body.length}\r\n\r\n`);
  process.stdout.write(body);
}

// One request at a time, awaited: the host numbers requests in arrival order and replays them by number.
function request(method, params) {
  const id = ++nextId;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    send(params === undefined ? { id, method } : { id, method, params });
  });
}

async function runUnit(params) {
  const unit = params.unit;
  const path = (unit.params && unit.params.path) || "README.md";
  const started = (await request("now")).time;
  const read = await request("tool/run", { tool: "read_file", args: { path } });
  if (!read.ok) throw new Error(`cannot read ${path}: ${read.error}`);
  const lines = read.output.total_lines;
  await request("evidence/add", { kind: "note", summary: `${path} has ${lines} lines`, data: { path, lines } });
  await request("state/save", { state: { counted: path } });
  return { result: { mission: mission.mission_id, path, lines, started_at: started }, summary: `${path}: ${lines} lines` };
}

async function onRequest(message) {
  try {
    let result;
    if (message.method === "initialize") {
      mission = message.params;
      result = { name: "line-count", kinds: ["count"], version: "1" };
    } else if (message.method === "unit/run") {
      result = await runUnit(message.params);
    } else if (message.method === "shutdown") {
      send({ id: message.id, result: null });
      process.exit(0);
    } else {
      send({ id: message.id, error: { code: -32601, message: `unknown method ${message.method}` } });
      return;
    }
    send({ id: message.id, result });
  } catch (err) {
    process.stderr.write(`line-count: ${err.stack || err}\n`);
    send({ id: message.id, error: { code: -32603, message: String(err.message || err) } });
  }
}

function onMessage(message) {
  if (message.method !== undefined && message.id !== undefined) {
    onRequest(message);
  } else if (message.method === "shutdown") {
    process.exit(0); // shutdown as a notification: nothing to answer
  } else if (message.id !== undefined && pending.has(message.id)) {
    const { resolve, reject } = pending.get(message.id);
    pending.delete(message.id);
    if (message.error) reject(new Error(`${message.error.message} (code ${message.error.code})`));
    else resolve(message.result);
  }
}

process.stdin.on("data", (chunk) => {
  buffer = Buffer.concat([buffer, chunk]);
  for (;;) {
    const end = buffer.indexOf("\r\n\r\n");
    if (end < 0) return;
    const match = /content-length:\s*(\d+)/i.exec(buffer.subarray(0, end).toString("ascii"));
    if (!match) {
      process.stderr.write("line-count: frame without Content-Length\n");
      process.exit(1);
    }
    const length = Number(match[1]);
    if (buffer.length < end + 4 + length) return;
    const body = buffer.subarray(end + 4, end + 4 + length).toString("utf8");
    buffer = buffer.subarray(end + 4 + length);
    onMessage(JSON.parse(body));
  }
});
process.stdin.on("end", () => process.exit(0)); // the host is gone: stop at once
