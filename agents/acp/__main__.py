"""`python -m keel.agents.acp PRESET` or `python -m keel.agents.acp -- COMMAND...`: the ACP bridge agent."""

from __future__ import annotations

import sys

from keel.agents.acp.bridge import UnitBridge
from keel.agents.acp.presets import PRESETS, Preset, find
from keel.agents.sdk import Agent, Context


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        command = argv[1:]
        preset = Preset("command", " ".join(command[:1]) or "ACP agent", "", "", (), "anthropic")
    elif len(argv) == 1 and argv[0] in PRESETS:
        preset = PRESETS[argv[0]]
        found = find(preset)
        if found is None:
            missing = f"{preset.title} ({preset.binary}) is not installed"
            print(f"keel.agents.acp: {missing}; install it with: {preset.install}", file=sys.stderr)
            return 2
        command = preset.command(found)
    else:
        print(f"usage: python -m keel.agents.acp {{{'|'.join(PRESETS)}}} | -- COMMAND...", file=sys.stderr)
        return 2
    if not command:
        print("keel.agents.acp: the ACP command is empty", file=sys.stderr)
        return 2

    async def unit(ctx: Context) -> dict[str, object]:
        return await UnitBridge(ctx, preset, command).run()

    Agent(f"acp:{preset.name}", {"*": unit}, journal="append").run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
