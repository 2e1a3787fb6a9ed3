"""`kopt plot`: campaign figures (matplotlib, Agg, PNG) of the shown candidate (kopt.policy.shown).

- speedup.png: SPEEDUP with its 95% CI on every case of the matrix (one label per case, NA where
  not measured), and beside it measured runtimes next to the seed's C500 reference times
  (reference data from another device, shown, never compared as a measurement).
- roofline.png: % of the roofline limit per case against 100%, and achieved GB/s against the
  measured ceiling.
- trajectory.png: verdict geomeans per iteration (uniform and ragged cases, held-out draws), the best so far,
  non-improving and failed iterations marked, the shipped and the rule's best named.
- peers-<device>.png: the peer panel (kopt.report.panel) of each device's newest `kopt peers` run.

Every image names the candidate and the commit it shows in its footer and carries the same
identity as PNG text chunks (`kopt-candidate`, `kopt-cases`, ...; read back with `png_text`).
Outputs depend only on the workspace's files, so regenerating unchanged data rewrites the same bytes.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Optional

from kopt.report.campaign import NO_LIMIT, Campaign, load_campaign  # noqa: F401  (load_campaign: the old entry point)

C500_NOTE = "C500 seed reference (other device: reference data, not a measurement)"
#: Files this module used to write: removed from the output folder so no stale figure stays beside new ones.
RETIRED = ("bandwidth.png",)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _kinds(c: Campaign) -> str:
    """'1-3 edge, 4-14 perf, 15-18 ragged' for an axis label."""
    from kopt.policy.shown import ranges

    kinds: dict[str, list[int]] = {}
    for r in c.rows:
        kinds.setdefault(r.kind, []).append(r.case)
    return ", ".join(f"{ranges(v)} {k}" for k, v in kinds.items())


def _case_axis(ax, c: Campaign) -> list[int]:
    x = list(range(len(c.rows)))
    ax.set_xticks(x, [str(r.case) for r in c.rows])
    ax.set_xlim(-0.6, len(x) - 0.4)
    ax.set_xlabel(f"case ({_kinds(c)})")
    return x


def _na_marks(ax, xs: list[int], y: float) -> None:
    for i in xs:
        ax.text(i, y, "NA", ha="center", va="bottom", fontsize=7, color="gray", rotation=90)


def plot_speedup(c: Campaign, path: Path) -> Path:
    """SPEEDUP with CI bars on every case, and runtimes beside the C500 reference times."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.8))
    if c.rows and any(r.speedup for r in c.rows):
        x = _case_axis(a1, c)
        have = [(i, r) for i, r in zip(x, c.rows) if r.speedup]
        sp = [r.speedup for _, r in have]
        err = [[max(0.0, r.speedup - r.ci[0]) if r.ci else 0.0 for _, r in have],
               [max(0.0, r.ci[1] - r.speedup) if r.ci else 0.0 for _, r in have]]
        colors = ["tab:green" if r.ci and r.ci[0] > 1 else "tab:red" if r.ci and r.ci[1] < 1 else "tab:gray"
                  for _, r in have]
        bars = a1.bar([i for i, _ in have], sp, yerr=err, capsize=3, color=colors)
        for b, (_, r) in zip(bars, have):
            if r.basis == "bench":
                b.set_hatch("//")
        _na_marks(a1, [i for i, r in zip(x, c.rows) if not r.speedup], 1.02)
        a1.axhline(1.0, color="black", lw=0.8, ls="--")
        ref = next(r.ref for _, r in have)
        a1.set_ylabel(f"SPEEDUP vs {ref} (95% CI)")
        a1.set_title(f"{c.shown.source} candidate {c.best_id}: verdict rows solid, bench rows hatched", fontsize=10)
    else:
        _empty(a1, "no SPEEDUP rows of the shown candidate yet")
    if c.rows and any(r.runtime_ms or r.c500_ref_ms for r in c.rows):
        x = _case_axis(a2, c)
        w = 0.27
        a2.bar([i - w for i in x], [r.runtime_ms or 0 for r in c.rows], w, label="candidate (measured)")
        a2.bar(x, [r.ref_runtime_ms or 0 for r in c.rows], w, label="baseline (measured)")
        a2.bar([i + w for i in x], [r.c500_ref_ms or 0 for r in c.rows], w, hatch="//", color="lightgray",
               edgecolor="gray", label=C500_NOTE)
        a2.set_yscale("log")
        a2.set_ylabel("ms per call")
        a2.legend(fontsize=7)
        dev = next((r.device for r in c.rows if r.runtime_ms), "NA")
        a2.set_title(f"runtimes on {dev} vs C500 reference times", fontsize=10)
    else:
        _empty(a2, "no runtimes yet")
    return _save(fig, path, c)


def plot_roofline(c: Campaign, path: Path) -> Path:
    """% of the roofline limit per case against 100%, and achieved GB/s against the measured ceiling."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.8))
    if c.rows:
        x = _case_axis(a1, c)
        have = [(i, r.pct_limit) for i, r in zip(x, c.rows) if r.pct_limit is not None]
        if have:
            a1.bar([i for i, _ in have], [v for _, v in have], color="tab:purple")
        a1.axhline(100.0, color="red", ls="--", lw=1, label="100% = at the limit")
        _na_marks(a1, [i for i, r in zip(x, c.rows) if r.pct_limit is None], 2)
        a1.set_ylim(0, max([120.0] + [v * 1.2 for _, v in have]))
        a1.set_ylabel("% of limit (limit_ms / RUNTIME)")
        a1.legend(fontsize=8, loc="upper left")
        a1.set_title("% of the roofline limit" + ("" if have else f" (NA: {NO_LIMIT})"), fontsize=10)
    else:
        _empty(a1, "no cases")
    if any(r.gbps for r in c.rows):
        x = _case_axis(a2, c)
        have = [(i, r) for i, r in zip(x, c.rows) if r.gbps]
        a2.bar([i for i, _ in have], [r.gbps for _, r in have], color="tab:blue")
        for i, r in have:
            if r.pct_peak is not None:
                a2.text(i, r.gbps, f"{r.pct_peak:.0f}%", ha="center", va="bottom", fontsize=7)
        _na_marks(a2, [i for i, r in zip(x, c.rows) if not r.gbps], 50)
        if c.ceiling_gbps:
            a2.axhline(c.ceiling_gbps, color="red", ls="--",
                       label=f"measured {c.ceiling_kind} ceiling {c.ceiling_gbps:.0f} GB/s")
            a2.legend(fontsize=8, loc="upper right")
        a2.set_ylim(0, 1.2 * max([r.gbps for _, r in have] + [c.ceiling_gbps or 0]))
        a2.set_ylabel("GB/s (bytes a call must move / RUNTIME)")
        a2.set_title(f"achieved bandwidth, % of the {c.ceiling_kind or 'measured'} ceiling"
                     + ("" if c.ceiling_gbps else " (no measured ceiling: NA)"), fontsize=10)
    else:
        _empty(a2, "no GB/s figures yet")
    return _save(fig, path, c)


def plot_trajectory(c: Campaign, path: Path) -> Path:
    """Verdict geomeans per iteration (uniform, ragged), the best so far, outcomes marked."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(10, 4.8))
    pts = c.trajectory
    if not pts:
        _empty(ax, "no verdict iterations yet (for this device)" if c.trajectory_source == "none"
               else "no iterations yet")
        return _save(fig, path, c)
    # The rule compares iterations on one device only: one best-so-far line per device.
    devices = list(dict.fromkeys(p.device for p in pts))
    floor = 1.0
    for dev in devices:
        best, xs, ys = None, [], []
        for p in pts:
            if p.device == dev:
                best = p.geomean if p.outcome == "improved" else best
                if best is not None:
                    xs.append(p.iteration)
                    ys.append(best)
        if xs:
            last = max(p.iteration for p in pts if p.device == dev)
            ax.step(xs + [last + 0.5], ys + ys[-1:], where="post", lw=1.2,
                    label=f"best so far on {dev or 'NA'}")
            floor = min(floor, min(ys))
    for outcome, style in (("improved", dict(marker="o", color="tab:green")),
                           ("not improved", dict(marker="s", color="tab:orange")),
                           ("overfit", dict(marker="D", color="tab:brown")),
                           ("failed", dict(marker="x", color="tab:red")),
                           ("not judged", dict(marker=".", color="tab:gray"))):
        sel = [p for p in pts if p.outcome == outcome]
        if sel:  # a failed or not-judged iteration has no geomean: drawn on the lowest best so far
            ax.scatter([p.iteration for p in sel], [p.geomean or floor for p in sel], label=f"uniform: {outcome}",
                       zorder=3, **style)
    rag = [p for p in pts if p.ragged]
    if rag:
        ax.plot([p.iteration for p in rag], [p.ragged for p in rag], "d--", color="tab:purple", label="ragged cases")
    else:
        ax.plot([], [], " ", label="ragged cases: no verdict timed them yet")
    held = [p for p in pts if p.heldout]
    if held:  # each verdict's own draws: the number to move, not a comparison between iterations
        ax.plot([p.iteration for p in held], [p.heldout for p in held], "^:", color="tab:cyan",
                label="held-out draws (each verdict's own)")
    else:
        ax.plot([], [], " ", label="held-out draws: no verdict timed them yet")
    s = c.shown
    bb = s.best_by_rule.candidate_id if s and s.best_by_rule else None
    for p in pts[::-1]:
        if s and p.candidate_id == s.candidate_id and p.geomean:
            ax.annotate(s.source, (p.iteration, p.geomean), textcoords="offset points", xytext=(0, -16),
                        ha="center", fontsize=8)
            break
    for p in pts[::-1]:
        if bb and p.candidate_id == bb and p.geomean:
            ax.annotate("best by rule", (p.iteration, p.geomean), textcoords="offset points", xytext=(0, 8),
                        ha="center", fontsize=8)
            break
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(pts[0].iteration - 0.5, pts[-1].iteration + 0.5)
    ax.set_xlabel("iteration")
    ax.set_ylabel("verdict geomean SPEEDUP")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"trajectory ({c.trajectory_source})", fontsize=10)
    return _save(fig, path, c)


def plot_peers(c: Campaign, dev: str, path: Path) -> Path:
    """The peer panel of one device (kopt.report.panel.plot), stamped like the other figures."""
    from kopt.report import panel

    p = c.peers[dev]
    stamp = (f"kopt: peers run {p.run_id} of candidate {p.candidate_id} on {p.device}, measured at commit "
             f"{p.commit}; {len(p.rows)} cases (shown: {c.best_id or 'none'})")
    return panel.plot(p, path, finish=lambda fig, out: _save(fig, out, c, stamp))


def _save(fig, path: Path, c: Campaign, stamp: Optional[str] = None) -> Path:
    import io

    import matplotlib.pyplot as plt
    from PIL import Image, PngImagePlugin

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.text(0.005, 0.005, stamp or c.stamp(), fontsize=7, color="dimgray", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    info = PngImagePlugin.PngInfo()
    for k, v in {"Software": "kopt", **c.marker()}.items():  # Software: no library version in the file
        info.add_text(k, v)
    # A palette of 256 colours holds a plot's few colours and their anti-aliasing: the file (committed, and
    # inlined in the report) is ~40% of the RGBA one. Same data, same bytes.
    img = Image.open(buf).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    img.save(path, format="PNG", optimize=True, pnginfo=info)
    return path


def make_plots(ws: Path, out: Optional[Path] = None, campaign: Optional[Campaign] = None,
               device: Optional[str] = None) -> list[Path]:
    """Write speedup.png, roofline.png, trajectory.png and, for each device with a `kopt peers` run,
    peers-<device>.png (the file kopt peers writes, redrawn with its stamp); default folder
    results/<backend>/plots/."""
    import matplotlib

    matplotlib.use("Agg")
    c = campaign or load_campaign(ws, device)
    out = Path(out) if out else Path(ws) / "results" / c.backend / "plots"
    files = [plot_speedup(c, out / "speedup.png"), plot_roofline(c, out / "roofline.png"),
             plot_trajectory(c, out / "trajectory.png")]
    files += [plot_peers(c, dev, out / f"peers-{dev}.png") for dev in c.peers]
    for name in RETIRED:
        (out / name).unlink(missing_ok=True)  # a figure of data no longer shown would read as current
    return files


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG file (where kopt records which candidate an image shows)."""
    data = Path(path).read_bytes()
    out, pos = {}, 8
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"tEXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            out[k.decode("latin-1")] = v.decode("latin-1")
        elif kind == b"zTXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            out[k.decode("latin-1")] = zlib.decompress(v[1:]).decode("latin-1")
        elif kind == b"IEND":
            break
        pos += 12 + n
    return out
