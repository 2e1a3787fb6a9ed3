"""The docs quote nothing the data contradicts: a candidate id named as shipped is the shipped one and every id
quoted is in the ledger, a count of the named cases is bench/cases.yaml's, a ceiling the limit divides by is the
one measured in results/hardware-*.json. The README stays short, and CI runs exactly its install and test lines."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO, SHIPPED

#: Where agents and newcomers read figures (case counts and ids are checked here).
PROSE = ["README.md", "SKILL.md", "HINTS.md", *sorted(p.relative_to(REPO).as_posix()
                                                   for p in [*(REPO / "workflows" / "prompts").glob("*.md"),
                                                             *(REPO / "docs").glob("*.md")])]
#: Ceilings are checked in the knowledge notes too (HINTS.md sends the reader there).
CEILING_FILES = PROSE + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "knowledge").rglob("*.md"))
BANDWIDTH = re.compile(r"(\d[\d.,]*)\s*(TB/s|GB/s)")
#: Words right before a figure that make it the limit's ceiling (a copy figure is another number).
LIMIT_WORDS = re.compile(r"bytes\s*/|read ceiling|limit", re.I)
CASE_COUNT = re.compile(r"\b(?:[Tt]he|[Aa]ll) (\d+) (?:named )?cases\b|\b(\d+) named cases\b")
HEX_ID = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{12}\b")


def _prose(rel: str) -> str:
    """The file's text without fenced code blocks (format examples), whitespace folded."""
    text = re.sub(r"```.*?```", " ", (REPO / rel).read_text(), flags=re.S)
    return re.sub(r"\s+", " ", text)


def _ceilings() -> list[float]:
    out = []
    for p in (REPO / "results").glob("hardware-*.json"):
        gbps = json.loads(p.read_text()).get("read_gbps")
        if gbps:
            out.append(float(gbps))
    return out


def test_readme_is_short():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines: move what is not newcomer material to docs/"


def test_ci_runs_the_readme_install_and_test_lines():
    readme = (REPO / "README.md").read_text()
    ci = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.startswith(("#", "set ", "cd "))]
    assert ci and all(ln in readme for ln in ci), ci


@pytest.mark.parametrize("rel", CEILING_FILES)
def test_a_quoted_limit_ceiling_is_the_measured_one(rel):
    ceilings = _ceilings()
    assert ceilings, "no results/hardware-*.json with a read ceiling"
    text = _prose(rel)
    for m in BANDWIDTH.finditer(text):
        before, after = text[max(0, m.start() - 30):m.start()], text[m.end():m.end() + 25]
        if not (LIMIT_WORDS.search(before) or "read ceiling" in after) or "copy" in before + after[:6]:
            continue
        gbps = float(m.group(1).replace(",", "")) * (1000 if m.group(2) == "TB/s" else 1)
        measured = ", ".join(f"{c:.0f}" for c in ceilings)
        assert any(abs(gbps / c - 1) < 0.01 for c in ceilings), \
            f"{rel}: '{before}{m.group(0)}' is not a measured read ceiling ({measured} GB/s)"


@pytest.mark.parametrize("rel", PROSE)
def test_a_quoted_case_count_is_the_case_files(rel):
    from kopt.cases import load_cases

    n = len(load_cases(REPO / "bench" / "cases.yaml"))
    for m in CASE_COUNT.finditer(_prose(rel)):
        got = int(m.group(1) or m.group(2))
        assert got == n, f"{rel}: '{m.group(0)}' but bench/cases.yaml names {n} cases"


@pytest.mark.parametrize("rel", PROSE)
def test_a_quoted_candidate_id_is_in_the_ledger_and_the_shipped_one_is_shipped(rel):
    from kopt.store.ledger import load_dicts
    from kopt.store.vcs import candidate_hash

    rows = load_dicts(REPO / "candidates.jsonl").rows
    known = {r.get("candidate_id") for r in rows} | {r.get("run_id") for r in rows}
    shipped = candidate_hash(SHIPPED)[1]
    for sentence in re.split(r"(?<=[.;:])\s", _prose(rel)):
        for m in HEX_ID.finditer(sentence):
            assert m.group(0) in known, f"{rel}: id {m.group(0)} is in no ledger row: '{sentence[:160]}'"
            if re.search(r"\bshipped\b", sentence):
                assert m.group(0) == shipped, f"{rel}: names {m.group(0)} as shipped; solution/ holds {shipped}"
