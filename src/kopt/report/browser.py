"""Headless Chromium for the HTML report: a screenshot, and the DOM after its scripts ran.

Debian's `chromium` package (`apt-get install chromium`); `chromium-browser` and `google-chrome`
are taken too. Each call starts its own browser with a throwaway profile folder, so nothing of the
user's profile is read or written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional

from kopt.errors import BrowserError

NAMES = ("chromium", "chromium-browser", "google-chrome")
WIDTH = 1400
#: Virtual time the page gets before the DOM is dumped: enough for the load event of inlined images.
BUDGET_MS = 5000
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?(–-?\d+(\.\d+)?)?")


def find() -> Optional[str]:
    """The first headless-capable Chromium on PATH, or None."""
    return next((p for n in NAMES if (p := shutil.which(n))), None)


def _run(args: list[str], timeout: int = 120) -> str:
    exe = find()
    if exe is None:
        raise BrowserError("no headless Chromium found (install Debian's `chromium` package)")
    with tempfile.TemporaryDirectory(prefix="kopt-chromium-") as prof:
        cmd = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
               "--disable-dev-shm-usage", f"--user-data-dir={prof}", *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BrowserError(f"chromium did not finish within {timeout} s") from None
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise BrowserError(f"chromium failed (exit {p.returncode}): {tail[:200]}")
    return p.stdout


def dump_dom(page: Path) -> str:
    """The page's DOM after its load event and scripts (serialized by Chromium)."""
    return _run([f"--virtual-time-budget={BUDGET_MS}", f"--window-size={WIDTH},1000", "--dump-dom",
                 Path(page).resolve().as_uri()])


def screenshot(page: Path, out: Path, width: int = WIDTH, height: Optional[int] = None) -> Path:
    """A PNG of the whole page (height from the rendered page unless given)."""
    out = Path(out)
    if height is None:
        height = check(dump_dom(page)).height or 3000
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--virtual-time-budget={BUDGET_MS}", f"--window-size={width},{height}", f"--screenshot={out.resolve()}",
          Path(page).resolve().as_uri()])
    if not out.is_file():
        raise BrowserError(f"chromium wrote no screenshot at {out}")
    return out


@dataclass
class DomCheck:
    """What the rendered report holds, read from its DOM."""

    meta: dict = field(default_factory=dict)
    cases: list[int] = field(default_factory=list)
    """data-case of every case row, in order."""
    basis: dict = field(default_factory=dict)
    """case -> data-basis (verdict | bench | none)."""
    measured: int = 0
    bad_numbers: list[str] = field(default_factory=list)
    """Texts of measured cells that are not numbers."""
    na: dict = field(default_factory=dict)
    """case -> [(field, reason)] of its NA cells."""
    images: dict = field(default_factory=dict)
    """data-img -> data-state (loaded | failed | '' when the script did not run)."""
    images_summary: str = ""
    height: int = 0


class _Parser(HTMLParser):
    def __init__(self, out: DomCheck):
        super().__init__()
        self.out, self.case, self.cell = out, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "meta" and (a.get("name") or "").startswith("kopt-"):
            self.out.meta[a["name"]] = a.get("content", "")
        elif tag == "body":
            self.out.images_summary = a.get("data-images", "")
            self.out.height = int(a.get("data-height") or 0)
        elif tag == "tr":
            self.case = int(a["data-case"]) if "case" in (a.get("class") or "").split() else None
            if self.case is not None:
                self.out.cases.append(self.case)
                self.out.basis[self.case] = a.get("data-basis", "")
        elif tag == "td" and self.case is not None:
            cls = (a.get("class") or "").split()
            if "m" in cls:
                self.cell = []
            elif "NA" in cls:
                self.out.na.setdefault(self.case, []).append((a.get("data-f", ""), a.get("data-why", "")))
        elif tag == "img":
            self.out.images[a.get("data-img") or a.get("alt", "")] = a.get("data-state", "")

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None:
            text = "".join(self.cell).strip()
            self.out.measured += 1
            if not _NUMBER.fullmatch(text):
                self.out.bad_numbers.append(text)
            self.cell = None
        elif tag == "table":
            self.case = None


def check(dom: str) -> DomCheck:
    """Parse a dumped report DOM into a DomCheck."""
    out = DomCheck()
    _Parser(out).feed(dom)
    return out
