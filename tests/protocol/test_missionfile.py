"""Mission files: every bad file gives one message naming the file, the field path and the line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from keel.protocol.errors import MissionFileError
from keel.protocol.missionfile import find_cycle, load_mission_file, parse_mission
from keel.protocol.spec import MissionSpec, UnitSpec

HEAD = '[mission]\nname = "demo"\nagent = ["python", "agent.py"]\n'
UNIT_A = '[[units]]\nid = "a"\n'

# (case id, file text, expected message after "m.toml")
BAD = [
    (
        "unknown-top-level-key",
        'colour = "red"\n' + HEAD + UNIT_A,
        ":1: colour: unknown top-level key (expected mission, units, models, checkpoint, permissions, env, budget)",
    ),
    ("unknown-top-level-table", HEAD + UNIT_A + "[extras]\nx = 1\n", ":6: extras: unknown top-level key"),
    ("unknown-mission-key", HEAD + 'nmae = "x"\n' + UNIT_A, ":4: mission.nmae: unknown key"),
    ("unknown-unit-key", HEAD + UNIT_A + '[[units]]\nid = "b"\nafterr = ["a"]\n', ":8: units[1].afterr: unknown key"),
    (
        "unknown-nested-key",
        HEAD + UNIT_A + '[models]\nprefer = ["m"]\n[models.require]\ntools = true\ngpu = 1\n',
        ":10: models.require.gpu: unknown key",
    ),
    (
        "unknown-checkpoint-key",
        HEAD + UNIT_A + '[checkpoint]\npolicy = "adaptive"\nwindow = 3\n',
        ":8: checkpoint.window: unknown key",
    ),
    (
        "unknown-permissions-key",
        HEAD + UNIT_A + "[permissions]\nnetwork = true\n",
        ":7: permissions.network: unknown key",
    ),
    (
        "unknown-key-after-sub-table",
        HEAD + UNIT_A + '[units.params]\nx = 1\n[[units]]\nid = "b"\nbogus = 1\n',
        ":10: units[1].bogus: unknown key",
    ),
    (
        "wrong-type-unit",
        HEAD + UNIT_A + '[[units]]\nid = "b"\ntimeout_s = "soon"\n',
        ":8: units[1].timeout_s: expected float | null, got str",
    ),
    ("wrong-type-name", HEAD.replace('"demo"', "5") + UNIT_A, ":2: mission.name: expected str, got int"),
    (
        "wrong-type-max-parallel",
        HEAD + 'max_parallel = "2"\n' + UNIT_A,
        ":4: mission.max_parallel: expected int, got str",
    ),
    ("wrong-type-after", HEAD + UNIT_A + 'after = "b"\n', ":6: units[0].after: expected array, got str"),
    (
        "wrong-enum-policy",
        HEAD + UNIT_A + '[checkpoint]\npolicy = "sometimes"\n',
        ":7: checkpoint.policy: Invalid enum value 'sometimes'",
    ),
    (
        "wrong-type-require",
        HEAD + UNIT_A + '[models.require]\nmin_context = "big"\n',
        ":7: models.require.min_context: expected int, got str",
    ),
    ("wrong-type-env", HEAD + UNIT_A + "[env]\nX = 1\n", ":7: env.X: expected a string, got int"),
    ("missing-name", '[mission]\nagent = ["x"]\n' + UNIT_A, ":1: mission.name: required key is missing"),
    ("missing-agent", '[mission]\nname = "x"\n' + UNIT_A, ":1: mission.agent: required key is missing"),
    ("missing-unit-id", HEAD + '[[units]]\ntitle = "a"\n', ":4: units[0].id: required key is missing"),
    ("missing-mission-table", UNIT_A, ":1: mission: missing [mission] table"),
    (
        "missing-dependency",
        HEAD + UNIT_A + 'after = ["zz"]\n',
        ":6: units[0].after: unknown dependency 'zz' of unit 'a'",
    ),
    ("self-dependency", HEAD + UNIT_A + 'after = ["a"]\n', ":6: units[0].after: unit 'a' depends on itself"),
    (
        "cycle-of-two",
        HEAD + UNIT_A + 'after = ["b"]\n[[units]]\nid = "b"\nafter = ["a"]\n',
        ":6: units[0].after: dependency cycle: a -> b -> a",
    ),
    (
        "cycle-of-three",
        HEAD + '[[units]]\nid = "x"\n[[units]]\nid = "a"\nafter = ["c"]\n[[units]]\nid = "b"\n'
        'after = ["a"]\n[[units]]\nid = "c"\nafter = ["b", "x"]\n',
        ":8: units[1].after: dependency cycle: a -> c -> b -> a",
    ),
    ("duplicate-id", HEAD + UNIT_A + UNIT_A, ":7: units[1].id: duplicate unit id 'a' (first used by units[0])"),
    ("bad-id-space", HEAD + '[[units]]\nid = "a b"\n', ":5: units[0].id: 'a b' is not a valid unit id"),
    ("bad-id-empty", HEAD + '[[units]]\nid = ""\n', ":5: units[0].id: '' is not a valid unit id"),
    ("bad-id-too-long", HEAD + f'[[units]]\nid = "{"x" * 65}"\n', ":5: units[0].id: "),
    ("toml-syntax", HEAD + 'goal = "unterminated\n', ":4: TOML syntax error: "),
    ("toml-duplicate-key", HEAD + 'name = "again"\n', ":4: TOML syntax error: "),
    (
        "empty-agent-list",
        HEAD.replace('["python", "agent.py"]', "[]") + UNIT_A,
        ":3: mission.agent: the agent command is empty",
    ),
    (
        "empty-agent-string",
        HEAD.replace('["python", "agent.py"]', '"   "') + UNIT_A,
        ":3: mission.agent: the agent command is empty",
    ),
    ("no-units", HEAD, ":1: units: no [[units]] given and plan = false; nothing to do"),
    ("max-parallel-zero", HEAD + "max_parallel = 0\n" + UNIT_A, ":4: mission.max_parallel: must be at least 1, got 0"),
    (
        "units-twice",
        HEAD + "units = []\n" + UNIT_A,
        ":4: mission.units: 'units' given both in [mission] and at top level",
    ),
    # numbers out of bounds: each field has a range, integers fit in 64 bits, no NaN or infinity
    (
        "max-parallel-huge",
        HEAD + "max_parallel = 99999999999999999999\n" + UNIT_A,
        ":4: mission.max_parallel: must be at most 256, got 99999999999999999999",
    ),
    (
        "max-parallel-too-many",
        HEAD + "max_parallel = 100000\n" + UNIT_A,
        ":4: mission.max_parallel: must be at most 256, got 100000",
    ),
    ("timeout-negative", HEAD + UNIT_A + "timeout_s = -5\n", ":6: units[0].timeout_s: must be greater than 0, got -5"),
    (
        "timeout-zero",
        HEAD + UNIT_A + UNIT_A.replace('"a"', '"b"') + "timeout_s = 0\n",
        ":8: units[1].timeout_s: must be greater than 0, got 0",
    ),
    ("timeout-huge", HEAD + UNIT_A + "timeout_s = 1e30\n", ":6: units[0].timeout_s: must be at most 604800, got 1e+30"),
    (
        "timeout-huge-int",
        HEAD + UNIT_A + "timeout_s = 99999999999999999999\n",
        ":6: units[0].timeout_s: must be at most 604800, got 1e+20",
    ),
    ("timeout-nan", HEAD + UNIT_A + "timeout_s = nan\n", ":6: units[0].timeout_s: expected a finite number, got nan"),
    ("timeout-inf", HEAD + UNIT_A + "timeout_s = inf\n", ":6: units[0].timeout_s: must be at most 604800, got inf"),
    (
        "permissions-env-not-names",
        HEAD + UNIT_A + '[permissions]\nenv = "JAVA_HOME"\n',
        ":7: permissions.env: expected array, got str",
    ),
    (
        "command-timeout-negative",
        HEAD + UNIT_A + "[permissions]\ncommand_timeout_s = -1\n",
        ":7: permissions.command_timeout_s: must be greater than 0, got -1",
    ),
    (
        "group-window-negative",
        HEAD + UNIT_A + "[checkpoint]\ngroup_window_ms = -1\n",
        ":7: checkpoint.group_window_ms: must be at least 0, got -1",
    ),
    (
        "interval-zero",
        HEAD + UNIT_A + '[checkpoint]\npolicy = "interval"\ninterval_ms = 0\n',
        ":8: checkpoint.interval_ms: must be greater than 0, got 0",
    ),
    (
        "min-context-negative",
        HEAD + UNIT_A + "[models.require]\nmin_context = -1\n",
        ":7: models.require.min_context: must be at least 0, got -1",
    ),
    (
        "max-cost-negative",
        HEAD + UNIT_A + "[models.require]\nmax_cost_per_mtok = -0.5\n",
        ":7: models.require.max_cost_per_mtok: must be at least 0, got -0.5",
    ),
    (
        "param-int-too-big",
        HEAD + UNIT_A + "[units.params]\nn = 99999999999999999999\n",
        ":7: units[0].params.n: integer 99999999999999999999 does not fit in 64 bits",
    ),
    (
        "param-nan",
        HEAD + UNIT_A + "params = { x = [1.0, -nan] }\n",
        ":6: units[0].params.x[1]: expected a finite number, got nan",
    ),
    # nesting: refused before tomllib (which recurses) sees it
    (
        "deep-array",
        HEAD + UNIT_A + "[units.params]\na = " + "[" * 100_000,
        ":7: units[0].params.a: nested more than 32",
    ),
    (
        "deep-array-closed",
        HEAD + UNIT_A + UNIT_A.replace('"a"', '"b"') + "params = { x = " + "[" * 40 + "]" * 40 + " }\n",
        ":8: units[1].params: nested more than 32 levels deep",
    ),
    (
        "deep-inline-table",
        HEAD + "agent2 = " + "{ a = " * 100 + "1" + " }" * 100 + "\n" + UNIT_A,
        ":4: mission.agent2: nested more than 32 levels deep",
    ),
    (
        "deep-dotted-key",
        HEAD + UNIT_A + "[units.params]\n" + ".".join(["a"] * 100_000) + " = 1\n",
        ":7: units[0].params.a.a.a",
    ),
    (
        "deep-table-header",
        HEAD + UNIT_A + "[" + ".".join(["t"] * 50) + "]\n",
        ":6: t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t.t",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in BAD], ids=[c for c, _, _ in BAD])
def test_bad_mission_file_names_file_field_and_line(text: str, expected: str) -> None:
    with pytest.raises(MissionFileError) as info:
        parse_mission(text, "m.toml")
    assert info.value.message.startswith("m.toml" + expected), info.value.message
    assert "\n" not in info.value.message.split(" TOML syntax error")[0]


def test_brackets_in_strings_and_comments_are_not_nesting() -> None:
    deep = "[" * 200 + "{" * 200
    text = (
        HEAD
        + f'goal = "{deep}"  # {deep}\n'
        + f"workspace = '{deep}'\n"
        + UNIT_A
        + f'title = """\n{deep}\n"""\n'
        + f"kind = '''{deep}'''\n"
        + "timeout_s = 604800\nafter = []\n"
    )
    spec = parse_mission(text, "m.toml")
    assert spec.goal == deep and spec.units[0].title == deep + "\n" and spec.units[0].timeout_s == 604800.0


def test_nesting_up_to_the_limit_is_accepted() -> None:
    inner = "[" * 28 + "1" + "]" * 28  # units(1) [0](2) params(3) x(4): the 1 sits 28 arrays deeper, at 32
    spec = parse_mission(HEAD + UNIT_A + "[units.params]\nx = " + inner + "\n", "m.toml")
    assert spec.units[0].params["x"] is not None
    with pytest.raises(MissionFileError, match=r"m\.toml:7: units\[0\]\.params\.x(\[0\]){29}: nested more than 32"):
        parse_mission(HEAD + UNIT_A + "[units.params]\nx = [" + inner + "]\n", "m.toml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEAD + "max_parallel = 99999999999999999999\n" + UNIT_A, ":4: mission.max_parallel: must be at most 256"),
        (HEAD + UNIT_A + "[units.params]\na = " + "[" * 100_000, ":7: units[0].params.a: nested more than 32 levels"),
        (HEAD + UNIT_A + "timeout_s = -5\n", ":6: units[0].timeout_s: must be greater than 0, got -5"),
    ],
    ids=["huge-max-parallel", "deep-nesting", "negative-timeout"],
)
def test_keel_run_refuses_a_bad_file_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    """Through the real CLI: exit code 2 (usage), one line on stderr, no traceback, nothing started."""
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "run", str(bad), "--store", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"keel: {bad}{expected}" or proc.stderr.startswith(f"keel: {bad}{expected}")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(MissionFileError, match=r"nope\.toml: cannot read mission file"):
        load_mission_file(tmp_path / "nope.toml")
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(HEAD.encode() + b'goal = "caf\xe9"\n')
    with pytest.raises(MissionFileError, match=r"latin1\.toml: not UTF-8 text \(byte \d+\)"):
        load_mission_file(bad)


GOOD = (
    HEAD
    + """goal = "upgrade every package"
workspace = "repo"
max_parallel = 2

[[units]]
id = "scan"
kind = "shell"
title = "Find the packages"
timeout_s = 30

[[units]]
id = "fix-1.a"
after = ["scan"]
[units.params]
package = "a"
depth = 2

[models]
prefer = ["local/qwen", "openai/gpt"]
failover = "never"
[models.require]
tools = true
min_context = 32000

[checkpoint]
policy = "interval"
interval_ms = 500

[permissions]
tools = ["read_file"]
command_timeout_s = 10
env = ["JAVA_HOME"]

[env]
LANG = "C.UTF-8"
"""
)


def test_good_file_parses_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "good.toml"
    path.write_text(GOOD)
    spec = load_mission_file(path)
    assert spec.agent == ("python", "agent.py")
    assert [u.id for u in spec.units] == ["scan", "fix-1.a"]
    assert spec.units[0].timeout_s == 30.0 and spec.units[0].kind == "shell"
    assert spec.units[1].after == ("scan",) and spec.units[1].params == {"package": "a", "depth": 2}
    assert spec.models.prefer == ("local/qwen", "openai/gpt") and spec.models.failover == "never"
    assert spec.models.require.tools and spec.models.require.min_context == 32000
    assert spec.checkpoint.policy == "interval" and spec.checkpoint.interval_ms == 500.0
    assert spec.permissions.tools == ("read_file",) and spec.env == {"LANG": "C.UTF-8"}
    assert spec.permissions.env == ("JAVA_HOME",)
    assert msgspec.json.decode(msgspec.json.encode(spec), type=MissionSpec) == spec
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=MissionSpec) == spec


def test_minimal_file_gets_defaults_and_a_string_agent_is_split() -> None:
    spec = parse_mission('[mission]\nname = "m"\nagent = "node  agent.js --fast"\nplan = true\n')
    assert spec.agent == ("node", "agent.js", "--fast")
    assert spec.units == () and spec.max_parallel == 4 and spec.checkpoint.policy == "adaptive"


def test_find_cycle_handles_long_chains_without_recursion() -> None:
    chain = [UnitSpec(id=f"u{i}", after=(f"u{i + 1}",)) for i in range(5000)] + [UnitSpec(id="u5000")]
    assert find_cycle(chain) is None
    looped = [*chain[:-1], UnitSpec(id="u5000", after=("u0",))]
    cycle = find_cycle(looped)
    assert cycle is not None and len(cycle) == 5001
