"""docs/cli.md and the ``migratory`` parser (cluster/cli.py) name the same commands and
options, each option with the parser's default; ``migratory bench``'s options are
documented in docs/benchmarks.md.

Before: nothing compared them. ``pub --qos``/``--token``, ``sub --conflation``,
``cluster up --base-port``/``--state`` and ``cluster status --state`` were in no
document, and docs/config.md sent operators to a ``cluster up --cluster-tls`` that does
not exist (TLS is the default, ``--no-cluster-tls`` the option)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.cli import build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command that takes options, by its name (``cluster up``)."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path and not subcommands:
        yield " ".join(path), parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from commands(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        action.option_strings[-1]: action for action in parser._actions
        if action.option_strings and action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction)
    }


def section(text: str, title: str) -> str:
    parts = text.split(f"\n## {title}\n", 1)
    assert len(parts) == 2, f"no section '## {title}'"
    return parts[1].split("\n## ", 1)[0]


COMMANDS = dict(commands(build_parser()))
CLI_DOC = (DOCS / "cli.md").read_text()


def test_every_command_is_in_the_doc_and_every_documented_command_exists() -> None:
    documented = set(re.findall(r"^## `migratory ([a-z -]+)`$", CLI_DOC, re.M))
    assert documented | {"bench"} == set(COMMANDS)
    assert set(re.findall(r"^\| `migratory ([a-z -]+)` \|", CLI_DOC, re.M)) == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_option_is_documented_with_its_default(name: str) -> None:
    text = section(CLI_DOC if name != "bench" else (DOCS / "benchmarks.md").read_text(),
                   f"`migratory {name}`")
    rows = dict(re.findall(r"^\| `(--[a-z0-9-]+)[^`]*` \| ([^|]*) \|", text, re.M))
    parsed = options(COMMANDS[name])
    assert set(rows) == set(parsed), f"migratory {name}: the doc's options differ"
    for flag, action in parsed.items():
        default = action.default
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            assert rows[flag].startswith("off"), (flag, rows[flag])
        elif default is not None and default != []:
            shown = f"{default:g}" if isinstance(default, float) else str(default)
            assert rows[flag] == f"`{shown}`", (flag, rows[flag], default)
        if action.choices:
            assert "|".join(map(str, action.choices)) in text.replace("\\|", "|"), flag


def test_options_the_docs_give_to_a_command_exist() -> None:
    """``migratory CMD ... --flag`` anywhere in the docs or the README names a flag of
    CMD (docs/config.md is generated from the code's texts, so this reads those too)."""
    texts = [p.read_text() for p in [*DOCS.glob("*.md"), DOCS.parent / "README.md"]]
    wrong = []
    for text in texts:
        for name, rest in re.findall(r"migratory (cluster up|cluster status|serve|pub|sub)"
                                     r"((?: [^`\n|]*)?)`", text):
            for flag in re.findall(r"(--[a-z][a-z0-9-]*)", rest):
                if flag not in options(COMMANDS[name]) and flag != "--help":
                    wrong.append(f"migratory {name} {flag}")
    assert not wrong, wrong


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_names_each_default(name: str) -> None:
    """``migratory CMD --help`` shows each option's default as the doc does
    (``--timeout ... (default: 10)``). Before: no default in any ``--help``, where
    docs/cli.md sends the reader to them for "every option, with its default"."""
    shown = " ".join(COMMANDS[name].format_help().split())
    for flag, action in options(COMMANDS[name]).items():
        default = action.default
        if default in (None, []) or "default" in (action.help or "") or isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            continue  # (none, its help says it in words, or a flag: off)
        told = f"{default:g}" if isinstance(default, float) else str(default)
        assert f"(default: {told})" in shown.replace("- ", "-"), (name, flag)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_no_markup(name: str) -> None:
    """``--help`` is read in a terminal: no reST's double backticks (``migratory bench
    --help`` showed its docstring's ````migratory bench````: markup as-is)."""
    assert "``" not in COMMANDS[name].format_help(), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_says_what_each_option_and_argument_is(name: str) -> None:
    """Before: ``pub --field K=V``, ``pub SUBJECT``, ``sub SUBJECT``, ``bench --subscribers``
    and ``--setup-timeout`` stood in ``--help`` with no word (their defaults and meaning
    only in the docs)."""
    silent = [
        action.option_strings[-1] if action.option_strings else action.metavar or action.dest
        for action in COMMANDS[name]._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert not silent, (name, silent)


def test_serve_help_says_where_the_configuration_comes_from_and_the_exit_statuses() -> None:
    """Before: '--config FILE' and '--set Key=Value' only: not the MIGRATORY_CFG_ variables
    README's first lines send an operator to, nor what the exit status means."""
    shown = " ".join(COMMANDS["serve"].format_help().split())
    readme = (DOCS.parent / "README.md").read_text()
    statuses = re.findall(r"^\| (\d) \| ", readme.split("The exit status of `migratory serve`")[1],
                          re.M)
    assert statuses == ["0", "1", "2"]
    assert "MIGRATORY_CFG_<KEY>" in shown and "docs/config.md" in shown
    for status in statuses:
        assert f" {status} " in shown.split("Exit status:")[1], status
