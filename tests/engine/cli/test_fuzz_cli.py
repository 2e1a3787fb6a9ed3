"""Bad input never reaches the user as a traceback: fuzzed CLI arguments and case files.

Everything here fails before a child process would start (missing candidate, bad value), so the
whole file runs in-process in well under a minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, assert_clean, run_main  # noqa: F401  (shared with the other CLI tests)
from kopt.cases import load_cases
from kopt.errors import CaseError

ADV = Path(__file__).resolve().parents[2] / "adversarial"
#: 60 examples per test keep the file well under a minute; raise KOPT_FUZZ_EXAMPLES for a deeper local run.
FUZZ = settings(max_examples=int(os.environ.get("KOPT_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---- strategies ----------------------------------------------------------------------------
# Case lists: small ids and ranges only (see test_case_range_is_bounded for huge ranges).
_token = st.one_of(
    st.integers(-3, 20).map(str),
    st.tuples(st.integers(-3, 20), st.integers(-3, 20)).map(lambda t: f"{t[0]}-{t[1]}"),
    st.text(alphabet="abx-, .;:_", max_size=4),
)
case_text = st.lists(_token, max_size=4).map(",".join)
junk = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)


def _value(*good: str):
    return st.one_of(st.sampled_from(good), junk, st.integers(-5, 1000).map(str))


@FUZZ
@given(case=case_text, as_json=st.booleans())
def test_fuzz_cases_command(case, as_json):
    argv = ["cases", "--case", case] + (["--json"] if as_json else [])
    assert_clean(*run_main(argv), allowed=(0, 2))


@FUZZ
@given(
    case=st.one_of(st.none(), case_text),
    dtype=st.one_of(st.none(), _value("fp16", "bf16", "fp32", "FP16", "float16")),
    head_dim=st.one_of(st.none(), _value("64", "128", "96", "0")),
    page_size=st.one_of(st.none(), _value("0", "16", "256", "17", "-16")),
    seqlens=st.one_of(st.none(), _value("full", "ragged", "RAGGED")),
    timeout=st.one_of(st.none(), _value("0", "-1", "nan", "inf", "5", "1e9")),
    config=st.one_of(st.none(), _value("{}", "{\"block_N\": 64}", "[1]", "{bad")),
    extra=st.lists(st.sampled_from(["--all", "--quick", "--machine", "--json", "--graph", "--no-record"]),
                   max_size=2, unique=True),
)
def test_fuzz_bench_options_missing_candidate(case, dtype, head_dim, page_size, seqlens, timeout, config, extra):
    argv = ["bench", "--candidate", "no_such_candidate.py", "--device", "cpu", *extra]
    for flag, v in (("--case", case), ("--dtype", dtype), ("--head-dim", head_dim), ("--page-size", page_size),
                    ("--seqlens", seqlens), ("--timeout", timeout), ("--config", config)):
        if v is not None:
            argv += [flag, v]
    code, out, err = run_main(argv)
    assert_clean(code, out, err, allowed=(2,))  # always a usage error: the candidate does not exist


@FUZZ
@given(device=junk.filter(lambda d: d not in ("auto", "cpu", "cuda") and not d.startswith("-")))
def test_fuzz_bench_bad_device_fails_before_any_child(device):
    argv = ["bench", "--case", "1", "--device", device, "--candidate", str(ADV / "honest.py"), "--no-record"]
    code, out, err = run_main(argv)
    assert_clean(code, out, err, allowed=(2,))
    assert "device" in err


@FUZZ
@given(argv=st.lists(st.one_of(junk, st.sampled_from(["--case", "--all", "--help", "-c", "--json", "--", "-"])),
                     max_size=4))
def test_fuzz_unknown_commands_and_flags(argv):
    cmd = ["cases"] if not argv or argv[0] != "--help" else []
    assert_clean(*run_main(cmd + argv), allowed=(0, 2))


# ---- case files ------------------------------------------------------------------------------
def _real_cases() -> dict:
    return yaml.safe_load((REPO / "bench" / "cases.yaml").read_text())


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10, 70000), st.floats(allow_nan=True), junk)
_yamlish = st.recursive(_scalar, lambda c: st.one_of(st.lists(c, max_size=3),
                                                     st.dictionaries(junk, c, max_size=3)), max_leaves=8)


def _loads_or_case_error(path: Path) -> None:
    try:
        cases = load_cases(path)
    except CaseError as e:
        assert "\n" not in str(e).strip() or "\n" in str(path)
        return
    assert cases and len({c.id for c in cases}) == len(cases)


@FUZZ
@given(text=st.text(max_size=200))
def test_fuzz_case_file_text(tmp_path, text):
    p = tmp_path / "cases.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    _loads_or_case_error(p)


@FUZZ
@given(data=st.data())
def test_fuzz_case_file_mutations(tmp_path, data):
    """Start from the real file and break one thing: a field, a case, the defaults, the top level."""
    raw = _real_cases()
    where = data.draw(st.sampled_from(["case_field", "case", "defaults", "defaults_field", "top", "cases"]))
    value = data.draw(_yamlish)
    if where == "case_field":
        case = data.draw(st.sampled_from(raw["cases"]))
        case[data.draw(st.sampled_from(sorted(case) + ["variant", "extra"]))] = value
    elif where == "case":
        raw["cases"][data.draw(st.integers(0, len(raw["cases"]) - 1))] = value
    elif where == "defaults":
        raw["defaults"] = value
    elif where == "defaults_field":
        raw["defaults"][data.draw(st.sampled_from(sorted(raw["defaults"]) + ["bogus"]))] = value
    elif where == "cases":
        raw["cases"] = value
    else:
        raw = value
    p = tmp_path / "cases.yaml"
    p.write_text(yaml.safe_dump(raw, allow_unicode=True))
    _loads_or_case_error(p)


@FUZZ
@given(text=st.text(max_size=120))
def test_fuzz_malformed_workspace_case_file_via_cli(workspace, text):
    (workspace / "bench" / "cases.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    assert_clean(*run_main(["cases", "--json"]), allowed=(0, 2))


@pytest.mark.parametrize("text", ["cases: [{id: 1, batch: 2001-13-45}]", "[" * 5000], ids=["timestamp", "nesting"])
def test_case_file_yaml_constructor_errors_are_case_errors(tmp_path, text):
    p = tmp_path / "cases.yaml"
    p.write_text(text)
    with pytest.raises(CaseError):
        load_cases(p)


# ---- the usage errors the brief names, one by one -------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["bench", "--case", "99", "--candidate", str(ADV / "honest.py")], "unknown case id 99"),
    (["bench", "--case", "1", "--dtype", "fp8", "--candidate", str(ADV / "honest.py")], "dtype"),
    (["bench", "--case", "1", "--candidate", "missing.py"], "candidate file not found"),
    (["bench", "--case", "1", "--candidate", str(ADV / "honest.py"), "--config", "{x"], "--config"),
    (["cases", "--case", "1,x"], "invalid case list"),
    (["cases", "--file", "no/such/cases.yaml"], "case file not found"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle):
    code, out, err = run_main(argv)
    assert_clean(code, out, err, allowed=(2,))
    assert needle in err


def test_malformed_case_file_is_a_usage_error(workspace):
    (workspace / "bench" / "cases.yaml").write_text("cases: [{id: 1, batch: -4}]\n")
    code, out, err = run_main(["bench", "--case", "1", "--candidate", str(ADV / "honest.py")])
    assert_clean(code, out, err, allowed=(2,))
    assert "cases.yaml" in err


def test_unwritable_ledger_is_a_usage_error(workspace):
    (workspace / "candidates.jsonl").mkdir()  # as root chmod does not stop writes; a directory does
    # a static violation is recorded without starting a child, so this stays fast
    code, out, err = run_main(["bench", "--case", "1", "--device", "cpu", "--machine",
                               "--candidate", str(ADV / "torch_softmax.py")])
    assert_clean(code, out, err, allowed=(2,))
    assert "ledger" in err


def test_case_range_is_bounded():
    """A huge range must be a usage error, not an allocation: checked in a child with a 2 GiB cap."""
    script = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
              "sys.argv = ['kopt', 'cases', '--case', '1-999999999999']\n"
              "from kopt.cli.main import main\nmain()\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
