"""`lightning-otel`'s subcommands come from the installed parts' `lightning_otel.commands` entry points."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points

import pytest

from lightning_otel import cli

# What the parts declare in their pyproject.toml; every part is installed in the test environment.
EVERY_PART = {
    "collector": "collector",
    "sql": "collector",
    "gateway": "gateway",
    "serve": "cli",
    "train": "trainer",
    "dashboard": "dashboards",
    "report": "dashboards",
    "grafana-views": "dashboards",
}


def test_help_lists_exactly_the_installed_entry_points():
    installed = {entry_point.name for entry_point in entry_points(group=cli.COMMANDS_GROUP)}
    assert set(EVERY_PART) <= installed, f"missing entry points: {set(EVERY_PART) - installed}"
    result = subprocess.run(
        [sys.executable, "-m", "lightning_otel", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # every installed entry point loaded
    choices = re.search(r"\{([a-z,-]+)\}", result.stdout)
    assert choices is not None, result.stdout
    assert set(choices.group(1).split(",")) == installed


def test_each_subcommand_is_registered_by_its_own_part():
    registered = {ep.name: ep.value.split(":")[0] for ep in entry_points(group=cli.COMMANDS_GROUP)}
    for name, part in EVERY_PART.items():
        module = "lightning_otel.cli" if part == "cli" else f"lightning_otel.{part}."
        assert registered[name].startswith(module), (name, registered[name])


def _fake_part(tmp_path, monkeypatch, source: str, *points: tuple[str, str]) -> None:
    """A part's commands module on sys.path, and the entry points cli sees instead of the installed ones."""
    (tmp_path / "fake_part_commands.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_part_commands", None)
    found = [EntryPoint(name, value, cli.COMMANDS_GROUP) for name, value in points]
    monkeypatch.setattr(cli, "entry_points", lambda group: found if group == cli.COMMANDS_GROUP else [])


HELLO = """
def add_hello(sub, data_dir):
    p = sub.add_parser("hello")
    p.add_argument("--name", default=data_dir)
    p.set_defaults(func=lambda args: print("hello", args.name) or 7)


def add_wrong_name(sub, data_dir):
    sub.add_parser("not-its-name")
"""


def test_a_subcommand_comes_from_an_entry_point_and_only_from_one(tmp_path, monkeypatch, capsys):
    _fake_part(tmp_path, monkeypatch, HELLO, ("hello", "fake_part_commands:add_hello"))
    monkeypatch.setenv("LIGHTNING_OTEL_DATA_DIR", "/stores/a")
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(subparsers.choices) == {"hello"}  # the installed parts declare nothing here, so add nothing
    assert cli.main(["hello"]) == 7
    assert capsys.readouterr().out == "hello /stores/a\n"  # the shared data_dir default reached the part


def test_an_entry_point_that_does_not_load_is_named_and_the_others_still_work(tmp_path, monkeypatch, capsys):
    _fake_part(
        tmp_path,
        monkeypatch,
        HELLO,
        ("absent", "no_such_part_here.commands:add_parser"),
        ("hello", "fake_part_commands:add_hello"),
    )
    assert cli.main(["hello", "--name", "x"]) == 7
    out, err = capsys.readouterr()
    assert out == "hello x\n"
    assert "'absent'" in err and "no_such_part_here.commands:add_parser" in err


def test_an_entry_point_must_add_the_subcommand_it_names(tmp_path, monkeypatch):
    _fake_part(tmp_path, monkeypatch, HELLO, ("wrong", "fake_part_commands:add_wrong_name"))
    with pytest.raises(RuntimeError, match="added no 'wrong' subcommand"):
        cli.build_parser()


def test_two_parts_claiming_one_subcommand_is_an_error(tmp_path, monkeypatch):
    _fake_part(
        tmp_path,
        monkeypatch,
        HELLO,
        ("hello", "fake_part_commands:add_hello"),
        ("hello", "fake_part_commands:add_wrong_name"),
    )
    with pytest.raises(RuntimeError, match="two installed parts register the subcommand 'hello'"):
        cli.build_parser()
