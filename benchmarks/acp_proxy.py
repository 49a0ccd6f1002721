"""Benchmark: what keel's model proxy adds to each model request of an outside ACP agent.

    python benchmarks/acp_proxy.py [--requests 200] [--events 40]

Runs a real mission (`keel run`) whose unit is done through the ACP bridge (`agent = { acp = [...] }`) by a
small ACP agent in this file. When prompted, that agent sends --requests Anthropic Messages requests two
ways, interleaved one by one: straight to a fake provider on 127.0.0.1, and through the bridge's proxy,
which forwards each as a journaled `model/forward` step (host, provider router, one LMDB commit) to the
same fake provider. Half the requests stream (SSE, --events deltas), half do not. Each request carries a
~6 KB conversation that grows by one turn, as an agent's requests do. Prints p50/p99 milliseconds per
request for each way and the proxy's overhead (p50 difference, and ratio). Not a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

KEY = "sk-bench-provider-0000"  # made up; sent only to the fake provider on 127.0.0.1


# -- the fake provider ------------------------------------------------------------------------------------
def _answer(body: dict[str, Any], events: int) -> tuple[str, bytes]:
    usage = {"input_tokens": 1500, "output_tokens": events}
    if not body.get("stream"):
        message = {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "m"),
            "content": [{"type": "text", "text": "ok " * events}],
            "stop_reason": "end_turn",
            "usage": usage,
        }
        return "application/json", json.dumps(message).encode()
    start = {"type": "message_start", "message": {"id": "msg_bench", "role": "assistant", "usage": usage}}
    chunks = [("message_start", start)]
    chunks.append(
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}})
    )
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok "}}
    chunks += [("content_block_delta", delta)] * events
    chunks.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    chunks.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage}))
    chunks.append(("message_stop", {"type": "message_stop"}))
    stream = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in chunks)
    return "text/event-stream", stream.encode()


def fake_provider(events: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            content_type, data = _answer(body, events)
            head = f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {len(data)}\r\n\r\n"
            self.wfile.write(head.encode() + data)  # one write, as a provider's server sends it

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- the ACP agent that times requests (runs under the bridge) ---------------------------------------------
def _post(url: str, key: str, body: bytes) -> float:
    """Milliseconds for one request on a new connection, the whole answer read."""
    parts = urlsplit(url)
    begin = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
    conn.request("POST", "/v1/messages", body, {"content-type": "application/json", "x-api-key": key})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    elapsed = (time.perf_counter() - begin) * 1000
    if response.status != 200 or not data:
        raise RuntimeError(f"{url}: HTTP {response.status}: {data[:300]!r}")
    return elapsed


def _requests(count: int) -> list[bytes]:
    turn = "Here is the file you asked for:\n" + "def f(x):\n    return x * 2\n" * 20
    history: list[dict[str, Any]] = [{"role": "user", "content": "Add a mul function. " + turn * 6}]
    bodies = []
    for i in range(count):
        history.append({"role": "assistant" if i % 2 == 0 else "user", "content": f"turn {i}: " + turn})
        bodies.append(
            json.dumps({"model": "claude-x", "max_tokens": 1024, "stream": i % 2 == 0, "messages": history}).encode()
        )
    return bodies


def time_requests(direct: str, out: Path, count: int) -> None:
    proxy, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
    rows: list[dict[str, Any]] = []
    for i, body in enumerate(_requests(count)):
        ways = [("direct", direct, KEY), ("proxy", proxy, token)]
        for way, url, key in ways if i % 4 < 2 else ways[::-1]:  # alternate which goes first
            rows.append({"way": way, "stream": i % 2 == 0, "ms": _post(url, key, body)})
    out.write_text(json.dumps(rows))


def acp_agent(direct: str, out: Path, count: int) -> None:
    """A minimal ACP agent on stdio: initialize, session/new, and a prompt that runs the timing loop."""

    def reply(msg_id: Any, result: Any) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        method = msg.get("method")
        if method == "initialize":
            reply(msg["id"], {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}})
        elif method == "session/new":
            reply(msg["id"], {"sessionId": "bench-session"})
        elif method == "session/prompt":
            time_requests(direct, out, count)
            reply(msg["id"], {"stopReason": "end_turn"})
        elif "id" in msg and method:
            sys.stdout.write(
                json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": method}})
            )
            sys.stdout.write("\n")
            sys.stdout.flush()


# -- the run ---------------------------------------------------------------------------------------------
def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--acp-agent", nargs=3, metavar=("DIRECT_URL", "OUT", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.acp_agent:
        acp_agent(args.acp_agent[0], Path(args.acp_agent[1]), int(args.acp_agent[2]))
        return
    provider = fake_provider(args.events)
    url = f"http://127.0.0.1:{provider.server_address[1]}"
    keel = str(Path(sys.executable).with_name("keel"))
    with tempfile.TemporaryDirectory(prefix="keel-acp-bench-") as tmp:
        root = Path(tmp)
        out = root / "timings.json"
        (root / ".keel").mkdir()
        (root / ".keel" / "config.toml").write_text(
            '[[providers]]\nname = "fake"\nkind = "anthropic"\nmodel = "bench-model"\n'
            f'api_key_env = "KEEL_BENCH_KEY"\nendpoints = [{{ url = "{url}" }}]\n'
        )
        agent = json.dumps(
            [sys.executable, str(Path(__file__).resolve()), "--acp-agent", url, str(out), str(args.requests)]
        )
        (root / "bench.mission.toml").write_text(
            f'[mission]\nname = "proxy-bench"\ngoal = "time requests"\nagent = {{ acp = {agent} }}\n\n'
            '[[units]]\nid = "u1"\ntitle = "time"\ntimeout_s = 600\n'
        )
        env = dict(os.environ, KEEL_BENCH_KEY=KEY, PYTHON_KEYRING_BACKEND="keyring.backends.null.Keyring")
        done = subprocess.run([keel, "run", "bench.mission.toml"], cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            sys.exit(f"the mission failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        rows = json.loads(out.read_text())
    provider.shutdown()
    sizes = [len(b) for b in _requests(args.requests)]
    print(
        f"{args.requests} requests each way, interleaved; bodies {sizes[0] // 1024}-{sizes[-1] // 1024} KiB; "
        f"{args.events} SSE events per streamed answer"
    )
    print(f"{'':24}{'p50 ms':>9}{'p99 ms':>9}")
    for stream in (False, True):
        kind = "streamed" if stream else "not streamed"
        medians = {}
        for way in ("direct", "proxy"):
            ms = [r["ms"] for r in rows if r["way"] == way and r["stream"] == stream]
            medians[way] = statistics.median(ms)
            print(f"{kind + ', ' + way:24}{medians[way]:9.2f}{_pct(ms, 0.99):9.2f}")
        extra = medians["proxy"] - medians["direct"]
        print(f"{kind + ', overhead':24}{extra:9.2f}   ({medians['proxy'] / medians['direct']:.1f}x direct)")
    proxied = [r["ms"] for r in rows if r["way"] == "proxy"]
    n = len(proxied)
    quarters = [statistics.median(proxied[q * n // 4 : (q + 1) * n // 4]) for q in range(4)]
    print("proxy p50 by quarter of the session (history grows): " + ", ".join(f"{q:.2f}" for q in quarters))


if __name__ == "__main__":
    main()
