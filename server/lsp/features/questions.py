"""Agent questions for editors without a keel plugin: a mission entering `waiting_input` becomes a
`window/showMessageRequest` with one action per choice; the chosen title is the answer
(`answer(..., resume=True)`). Each question (mission, unit, seq) is asked once per server. A free-text
question (no choices) is shown with `window/showMessage`, naming the command and the CLI line.

Every client is asked: the request is base protocol, and the `window.showMessage` capability only says
what else a client does with its action items (eglot 1.9, Emacs 28's, announces no window capability at
all yet prompts with the choices). A client that cannot answer it (Helix, helix#4699: an error reply)
gets the question as a `window/showMessage` with its choices and the exact `keel answer` lines; the
mission stays `waiting_input` until it is answered from anywhere."""

from __future__ import annotations

import logging
import shlex

from lsprotocol import types
from pygls.exceptions import JsonRpcException

from keel.protocol.errors import KeelError
from keel.protocol.states import MissionState
from keel.server.lsp.features.control import answer_mission
from keel.server.lsp.server import KeelServer
from keel.server.lsp.snapshot import MissionView

log = logging.getLogger(__name__)


def register(server: KeelServer) -> None:
    asked: set[tuple[str, str, int]] = set()

    def on_change(old: MissionView | None, new: MissionView) -> None:
        r = new.record
        q = r.question
        if r.state != MissionState.WAITING_INPUT or q is None:
            return
        key = (r.id, q.unit, q.seq)
        if key in asked:
            return
        asked.add(key)
        prompt = f"keel · {r.spec.name} asks: {q.text}"
        if not q.choices:
            server.show(f"{prompt} — answer with the keel.answer command (mission {r.id}) or `keel answer {r.id} TEXT`")
        else:
            server.spawn(_ask(server, new, prompt), f"asking mission {r.id}'s question")

    server.hub.subscribe(on_change)


async def _ask(server: KeelServer, view: MissionView, prompt: str) -> None:
    r = view.record
    assert r.question is not None
    params = types.ShowMessageRequestParams(
        type=types.MessageType.Info,
        message=prompt,
        actions=[types.MessageActionItem(title=c) for c in r.question.choices],
    )
    try:
        chosen = await server.window_show_message_request_async(params)
    except JsonRpcException as exc:  # the client cannot ask (Helix answers "method not found")
        log.info("the client did not ask mission %s's question (%s); showing it instead", r.id, exc.message)
        _tell(server, view, prompt)
        return
    if chosen is None:
        log.info("question of mission %s dismissed; it stays open", r.id)
        return
    current = server.hub.views.get(r.id)
    if current is None or current.record.question != r.question:
        server.log_line(f"[{r.id}] answer {chosen.title!r} not sent: the question was answered elsewhere")
        return
    try:
        await answer_mission(server, r.id, chosen.title)
    except KeelError as exc:
        server.show(f"keel: answer to mission {r.id} was not taken: {exc.message}", types.MessageType.Warning)
        return
    server.log_line(f"[{r.id}] answered {chosen.title!r}; resuming", types.MessageType.Info)


def _tell(server: KeelServer, view: MissionView, prompt: str) -> None:
    """The question as a message: its choices and the command lines that answer it."""
    r = view.record
    assert r.question is not None
    lines = " · ".join(f"`keel answer {r.id} {shlex.quote(c)}`" for c in r.question.choices)
    server.show(
        f"{prompt} — choices: {', '.join(r.question.choices)}. Answer with {lines} (or the keel.answer command)"
    )
