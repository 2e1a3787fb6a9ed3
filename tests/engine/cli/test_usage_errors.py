"""Every usage error is exit 2 with one line on stderr, in every command, and leaves the workspace as it was:
a missing workspace, an unknown device, exclusive flags, config keys the candidate does not have (before any work,
on the CPU too), bad case ids, a folder for a file, an empty import, a workspace that cannot be written. Help names
values, not types, and lists the commands in loop order."""

from __future__ import annotations

import builtins
import errno
import io
import os
import re

import pytest
from typer.testing import CliRunner

from conftest import SHIPPED, assert_clean, run_main
from kopt.cli.main import COMMANDS, app

ROW = ('{"schema_version":1,"row_id":"r1","run_id":"x","mode":"signal","kind":"case","candidate_id":"aaaaaaaaaaaa",'
       '"case":1,"device":"cpu","status":"ok","compiled":true,"correct":true}')


def _tree(root) -> dict:
    """Every file under root with its bytes: what a refused command must leave as it was."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def ledger_ws(workspace):
    """A workspace with a one-row ledger."""
    (workspace / "candidates.jsonl").write_text(ROW + "\n")
    return workspace


def refused(argv: list[str], needle: str, root) -> str:
    """Run `kopt argv`: exit 2, one `kopt: error:` line holding `needle`, nothing under root changed."""
    before = _tree(root)
    code, out, err = run_main(argv)
    assert_clean(code, out, err, allowed=(2,))
    assert needle in err, err
    assert _tree(root) == before, "a refused command changed the workspace"
    return err


SHIP = str(SHIPPED)
BAD_CONFIG = '{"block_N": -1, "nonsense_key": "x"}'


@pytest.mark.parametrize("argv,needle", [
    (["status", "--device", "NOPE"], "unknown device 'NOPE'"),
    (["candidates", "--device", "NOPE"], "unknown device 'NOPE'"),
    (["report", "--device", "NOPE"], "unknown device 'NOPE'"),
    (["plot", "--device", "NOPE"], "unknown device 'NOPE'"),
    (["bench", "--case", "1", "--device", "NOPE", "--candidate", SHIP], "device"),
    (["bench", "--case", "1", "--machine", "--json", "--candidate", SHIP], "--machine and --json are exclusive"),
    (["verify", "--machine", "--json", "--candidate", SHIP], "--machine and --json are exclusive"),
    (["verify", SHIP, "--candidate", SHIP], "give the candidate once"),
    (["verify", "--candidate", SHIP, "--against", SHIP, "--no-pair"], "--against and --no-pair are exclusive"),
    (["candidates", "--json", "--csv"], "--json and --csv are exclusive"),
    (["bench", "--case", "1", "--device", "cpu", "--candidate", SHIP, "--config", BAD_CONFIG],
     "--config: unknown key nonsense_key"),
    (["bench", "--case", "1", "--device", "cpu", "--candidate", SHIP, "--config", '{"block_N": -1}'],
     "block_N=-1 is out of range"),
    (["verify", "--device", "cpu", "--candidate", SHIP, "--config", BAD_CONFIG], "unknown key nonsense_key"),
    (["profile", "--case", "1", "--device", "cpu", "--candidate", SHIP, "--config", '{"threads": "x"}'],
     'threads="x" is out of range'),
    (["candidates", "--case", "999"], "unknown case id 999"),
    (["candidates", "--case", "1,2"], "takes one case id"),
    (["profile", "--case", "999"], "unknown case id 999"),
    (["profile", "--device", "cpu"], "choose the case to profile"),
    (["bench", "--case", "999", "--candidate", SHIP], "unknown case id 999"),
    (["verify", "--case", "999", "--candidate", SHIP], "unknown case id 999"),
    (["tune", "--case", "999", "--candidate", SHIP], "unknown case id 999"),
    (["peers", "--case", "999", "--candidate", SHIP], "unknown case id 999"),
    (["calibrate", "--case", "999", "--candidate", SHIP], "unknown case id 999"),
    (["cases", "-c", "999"], "unknown case id 999"),
])
def test_bad_input_is_exit_2_one_line_nothing_written(ledger_ws, argv, needle):
    refused(argv, needle, ledger_ws)


@pytest.mark.parametrize("cmd", ["bench", "verify", "tune", "peers", "calibrate", "profile"])
def test_a_folder_for_the_candidate(ledger_ws, cmd):
    argv = [cmd, "--candidate", str(SHIPPED.parent)] + (["--case", "1"] if cmd != "verify" else [])
    refused(argv, "candidate is a folder, not a file", ledger_ws)


@pytest.mark.parametrize("cmd", [["status"], ["candidates"], ["bench", "--case", "1", "--device", "cpu"],
                                 ["report"], ["log", "--hypothesis", "h"]])
def test_a_missing_workspace_is_not_created(tmp_path, monkeypatch, cmd):
    missing = tmp_path / "no" / "such" / "ws"
    monkeypatch.setenv("KOPT_WORKSPACE", str(missing))
    refused(cmd, "does not exist", tmp_path)
    assert not missing.exists() and not missing.parent.exists()


def test_an_empty_import_is_refused(ledger_ws, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused(["import", str(empty)], "no ledger rows in it", ledger_ws)
    refused(["import", str(tmp_path)], "is a folder", ledger_ws)


def test_a_refused_import_line_goes_to_stderr(ledger_ws, tmp_path):
    copy = tmp_path / "copy.jsonl"
    copy.write_text(ROW.replace('"r1"', '"r2"') + "\n{not json\n")
    code, out, err = run_main(["import", str(copy)])
    assert code == 0 and "line 2 refused" not in out and "line 2 refused" in err
    assert "appended 1 row(s)" in out


@pytest.mark.parametrize("err_no,words", [(errno.EROFS, "read-only file system"),
                                          (errno.ENOSPC, "no space left on")])
@pytest.mark.parametrize("cmd", [["report"], ["plot"], ["log", "--hypothesis", "h"], ["import", "COPY"]])
def test_an_unwritable_workspace_is_exit_2_not_internal_error(ledger_ws, tmp_path, monkeypatch, err_no, words, cmd):
    """Writes under the workspace fail as on a read-only mount or a full disk (root ignores chmod, so the failure
    is injected where Python opens files)."""
    copy = tmp_path / "copy.jsonl"
    copy.write_text(ROW.replace('"r1"', '"r3"') + "\n")
    cmd = [str(copy) if a == "COPY" else a for a in cmd]
    root = str(ledger_ws)
    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir

    def _deny(path):
        raise OSError(err_no, os.strerror(err_no), str(path))

    def fake_open(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)) and str(file).startswith(root) and set(mode) & set("wax+"):
            _deny(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if str(path).startswith(root) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            _deny(path)
        return real_os_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if str(path).startswith(root) and not os.path.isdir(path):
            _deny(path)
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    before = _tree(ledger_ws)
    code, out, err = run_main(cmd)
    monkeypatch.undo()
    assert_clean(code, out, err, allowed=(2,))
    assert "internal error" not in err and words in err.lower() and "cannot write" in err, err
    assert _tree(ledger_ws) == before


def test_help_names_values_not_types_and_lists_the_loop_first():
    for name in COMMANDS:
        args = [name, "summarize", "--help"] if name == "trace" else [name, "--help"]
        text = CliRunner().invoke(app, args, terminal_width=200).output
        assert "Usage" in text, name
        assert not re.search(r"<(bool|str|int|float|path)[^>]*>", text), (name, text)
        assert "{" not in text.split("\n", 3)[1], name  # the usage line: NAME / [NAME], never {name}
    top = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    order = [n for n in re.findall(r"^│ (\w+) ", top, flags=re.M) if n in COMMANDS]
    assert order[:6] == ["status", "profile", "bench", "verify", "log", "commit"], order
    assert sorted(order) == sorted(COMMANDS)


def test_case_is_one_option_across_commands():
    """--case/-c takes the same text everywhere (IDS); verify and profile take the candidate as --candidate."""
    for name in ("bench", "verify", "tune", "peers", "profile", "candidates", "calibrate", "cases"):
        text = CliRunner().invoke(app, [name, "--help"], terminal_width=200).output
        assert re.search(r"--case\s+-c\s+IDS", text), name
    for name in ("bench", "verify", "tune", "peers", "profile", "calibrate"):
        assert "--candidate" in CliRunner().invoke(app, [name, "--help"], terminal_width=200).output, name


def test_help_prints_bracketed_words_as_written():
    """A bracketed word in a help text is text: `kopt commit`'s `[iter N] DESC` once printed as "` DESC`"."""
    text = CliRunner().invoke(app, ["commit", "--help"], terminal_width=200).output
    assert "`[iter N] DESC`" in text, text
    top = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    assert "`[iter N] DESC`" in top, top
    assert "\\[" not in text + top
