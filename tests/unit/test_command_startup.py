"""The Slurm commands' start-up: what a command process loads (``corral.cli.launch``).

Wall time is measured in ``bench/latency.py``; these tests keep out the modules whose cost was measured
there and removed, each in a fresh interpreter, as a command starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corral.cli.launch import COMMANDS

# Loaded by none of the commands: typing_extensions (with inspect, ast, dis), pathlib, socket.py and json were
# most of a command's avoidable start-up (bench/RESULTS.md); nats-py, asyncio and the services' libraries
# are for the services.
KEPT_OUT = (
    "typing_extensions",
    "inspect",
    "pathlib",
    "socket",
    "json",
    "asyncio",
    "nats",
    "opentelemetry",
    "structlog",
    "asyncpg",
)

_LOADED = """
import json, sys
from corral.cli import launch
launch.load(sys.argv[1])
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
"""


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_loads_none_of_the_costly_modules(command: str) -> None:
    # json is imported by this probe only after load() returned, to print the list
    out = subprocess.run(
        [sys.executable, "-c", _LOADED, command], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out)) - {"json", "json.decoder", "json.encoder", "json.scanner", "_json"}
    assert f"corral.cli.{command}" in loaded
    kept_out = [name for name in loaded if name.split(".")[0] in KEPT_OUT]
    assert kept_out == []


def test_the_schemas_are_the_same_without_typing_extensions() -> None:
    # msgspec reads the Structs' type hints with typing's get_type_hints when typing_extensions is blocked;
    # every schema it derives from them must be the one checked in (generated with typing_extensions)
    probe = (
        "import sys; sys.modules['typing_extensions'] = None; sys.argv[1:] = ['--check']\n"
        "from corral.schemas import generate\n"
        "assert sys.modules['typing_extensions'] is None\n"
        "sys.exit(generate.main())"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_process_that_has_typing_extensions_keeps_it() -> None:
    import typing_extensions

    from corral.cli import launch

    launch.load("squeue")
    assert sys.modules["typing_extensions"] is typing_extensions


def test_a_served_command_loads_neither_msgspec_nor_typing() -> None:
    # what a command's own process loads when a server runs it: the client side only (cmdclient)
    probe = (
        "import json, sys\n"
        "from corral.cli import cmdclient, launch\n"
        "loaded = sorted(name for name, module in sys.modules.items() if module is not None)\n"
        "print(json.dumps(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert {"corral.cli.cmdclient", "corral.cli.launch"} <= loaded
    assert "corral.cli.cmdserver" not in loaded  # the server side stays out of a command
    assert [name for name in loaded if name.split(".")[0] in ("msgspec", "typing", "corral.schemas")] == []
    assert not any(name.startswith(("corral.schemas", "corral.libs")) for name in loaded)


def test_each_command_is_installed_from_its_script_file() -> None:
    # not a console script: pip's wrapper for one imports re, a third of a served command's own process
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert sorted(project["tool"]["setuptools"]["script-files"]) == sorted(f"bin/{c}" for c in COMMANDS)
    assert not set(project["project"]["scripts"]) & set(COMMANDS)
    for command in COMMANDS:
        lines = (root / "bin" / command).read_text().splitlines()
        code = [line for line in lines[1:] if line and not line.startswith("#")]
        assert lines[0] == "#!python"  # the installer writes its interpreter here
        assert code == ["import sys", f"from corral.cli.launch import {command}", f"sys.exit({command}())"]


_DECODES = """
import sys
from corral.cli import client, cmdserver
from corral.schemas import api

if sys.argv[1] == "server":
    cmdserver._Server("", "").load()  # what a server loads before it forks its children
built = []  # the Python functions of msgspec's that build a type's decoding information (msgspec._utils)
sys.setprofile(
    lambda frame, event, _: built.append(frame.f_code.co_name)
    if event == "call" and frame.f_code.co_filename.endswith("_utils.py")
    else None
)
import msgspec
client.decode_reply(b'{"type": "submitted", "job_id": 5}', api.SubmitReply)
msgspec.json.decode(b'{"url": "nats://h:1", "user": "u", "password": "p"}', type=client.Credentials)
sys.setprofile(None)
print(len(built))
"""


@pytest.mark.parametrize("server", [True, False], ids=["in a server", "in a process of its own"])
def test_a_server_prepares_the_decoding_of_the_replies_for_its_children(server: bool) -> None:
    # msgspec builds a Struct's decoding information from its annotations on its first decode: the server
    # does it once (cmdserver), so that its children, each a first decode, do not
    probe = [sys.executable, "-c", _DECODES, "server" if server else "own"]
    calls = int(subprocess.run(probe, capture_output=True, text=True, check=True).stdout)
    assert (calls == 0) is server
