"""kdbl-control's parser tree: every command group, command and option explains itself in --help, and every
command is wired to the handler `main` runs (its group module's `set_defaults(func=...)`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from kdbl_control.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str | None]]:
    """(`group command`, its help) for every command and command group under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                yield " ".join((*path, name)), helps.get(name)
                yield from _commands(child, (*path, name))


PARSER = build_parser()
PARSERS = dict(_parsers(PARSER))


def test_every_command_and_command_group_has_help_text():
    commands = dict(_commands(PARSER))
    assert {"db", "tenant", "source", "entity", "crawl", "token", "grant", "mcp", "bench", "eval",
            "formats", "up"} <= commands.keys()
    assert [name for name, text in commands.items() if not (text and text.strip())] == []


def test_every_option_and_positional_has_help_text():
    missing = [f"{' '.join(path) or 'kdbl-control'} {'/'.join(action.option_strings) or action.dest}"
               for path, parser in PARSERS.items() for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not (action.help and action.help.strip())]
    assert missing == []


@pytest.mark.parametrize("path", [path for path in PARSERS if path], ids=" ".join)
def test_every_help_page_renders(path):
    assert PARSERS[path].format_help().startswith("usage: kdbl-control")


@pytest.mark.parametrize("path", [path for path, parser in PARSERS.items()
                                  if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)],
                         ids=" ".join)
def test_every_command_runs_a_handler_of_its_group_module(path):
    func = PARSERS[path].get_default("func")
    assert callable(func), f"kdbl-control {' '.join(path)} has no handler (set_defaults(func=...))"
    module = {"entity": "kdbl_control.entity_commands", "bench": "kdbl_control.bench_commands"}.get(
        path[0], f"kdbl_control.cli_{path[0]}")
    assert func.__module__ == module


def test_a_group_alone_is_refused_as_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["tenant"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("kdbl-control: tenant: ") and err.count("\n") == 1
