"""`kopt doctor`: what this machine has and what kopt will run on it; with --plan-for, a device's plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kopt.cli.options import Candidate, Config, VariantOpts


def command(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
            plan_for: Optional[str] = typer.Option(
                None, "--plan-for", help="A device of hardware.yaml (e.g. C500): print the plan the kernel would run "
                                         "there for --case, resolved here from the device's profile."),
            case: Optional[int] = typer.Option(None, "--case", "-c", help="With --plan-for: the case id."),
            dtype: Optional[str] = VariantOpts.dtype, head_dim: Optional[int] = VariantOpts.head_dim,
            page_size: Optional[int] = VariantOpts.page_size, config: Config = None, candidate: Candidate = None,
            wave64: bool = typer.Option(False, "--wave64", help="With --plan-for: also lower the plan's kernels for "
                                                               "TileLang's HIP target (gfx942, wave64) and compile "
                                                               "them where a HIP toolchain is found.")) -> None:
    """Device, arch, torch/TileLang/flash-attn versions, nvcc, profilers; what will and will not run."""
    from kopt.cli.common import out_console

    if plan_for is None:
        from kopt.doctor import report

        d = report()
        show = lines
    else:
        from kopt.cli.options import config_json
        from kopt.doctor import device_plan
        from kopt.errors import UsageError

        if case is None:
            raise UsageError("--plan-for needs --case N")
        d = device_plan(plan_for, case, candidate=Path(candidate) if candidate else None, dtype=dtype,
                        head_dim=head_dim, page_size=page_size, config=config_json(config), wave64=wave64)
        show = plan_lines
    if as_json:
        print(json.dumps(d, indent=2))
        return
    con = out_console()
    for line in show(d):
        con.print(line, highlight=False, soft_wrap=True)


#: Names of the version rows, in print order.
VERSIONS = ("python", "torch", "tilelang", "flash_attn", "nvcc", "kopt")


def _row(w: int):
    def row(label: str, value: str, style: str = "bold") -> str:
        return f"[{style}]{label}[/{style}]{' ' * (w - len(label))}{value}"

    return row


def lines(d: dict) -> list[str]:
    """The report as rich-markup lines: one label column, as wide as its longest label plus two."""
    dev = d["device"]
    labels = ("device", *VERSIONS, "profilers", "kept child", "bytecode", "will run", "will not run")
    row = _row(max(map(len, labels)) + 2)
    out = [row("device", str(dev.get("name")) + (f"  cc {dev['capability']}  {dev['units']} units  "
               f"{dev['l2_mib']} MiB L2  arch {dev['tilelang_arch']}" if "capability" in dev else ""))]
    out += [row(k, d[k] or "not found") for k in VERSIONS]
    out.append(row("profilers", ", ".join(f"{k}:{'yes' if v else 'no'}" for k, v in d["profilers"].items())))
    kept = d.get("kept_children") or []
    out += [row("kept child", f"supervisor pid {k['pid']} (ends after {k['keep_s']:g} s idle, or kill it)")
            for k in kept] or [row("kept child", "none (a CUDA run leaves one for the next: kopt.eval.warm)")]
    cache = d.get("bytecode_cache")
    out.append(row("bytecode", f"cached in {cache} (the environment writes none: kopt.bytecode)" if cache
                   else "Python's own rule"))
    out += [row("will run", x, "green") for x in d["will_run"]]
    out += [row("will not run", x, "yellow") for x in d["will_not_run"]]
    return out


#: The plan's fields, in print order (device_plan's dict has them all).
PLAN_FIELDS = ("kernels", "block_N", "num_splits", "threads", "eager", "last_cta", "balanced", "v_split",
               "red_batch", "red_once", "pdl", "fast_math", "tile_page", "even_split", "k_clamp", "comb_unroll")


def plan_lines(d: dict) -> list[str]:
    """device_plan's answer as rich-markup lines: the device, the case, the plan, and the wave64 check if asked."""
    dev, c, p = d["device"], d["case"], d["plan"]
    row = _row(len("hopper-only") + 2)
    out = [row("device", f"{dev['name']} ({dev['vendor']}, {dev['arch']}): {dev['units']} units, warp "
                         f"{dev['warp_size']}, {dev['smem_per_unit_bytes'] // 1024} KB shared a unit, "
                         f"{(dev['l2_bytes'] or 0) / 2**20:g} MiB L2"),
           row("case", f"{c['id']}: batch {c['batch']}, seqlen_k {c['seqlen_k']}, kv_heads {c['kv_heads']}, "
                       f"gqa {c['gqa']}, head_dim {c['head_dim']}, {c['dtype']}, "
                       + (f"{c['page_size']}-token pages" if c["page_size"] else "contiguous")),
           row("candidate", d["candidate"] + (f"  config {json.dumps(d['config'])}" if d["config"] else ""))]
    if p is None:
        return out + [row("plan", f"NA: {d['why']}", "yellow")]
    out.append(row("plan", "  ".join(f"{k} {_text(p[k])}" for k in PLAN_FIELDS if k in p)))
    out.append(row("shared", f"about {p['smem_bytes']} bytes a CTA of {dev['smem_per_unit_bytes']} a unit"))
    out.append(row("hopper-only", ", ".join(f"{k} {'on' if p.get(k) else 'off'}" for k in d["hopper_only"])
                   + " (" + "; ".join(f"{k}: {why}" for k, why in d["hopper_only"].items()) + ")"))
    if d["wave64"] is not None:
        out += _wave64_lines(d["wave64"], row)
    return out


def _text(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return "+".join(v) if isinstance(v, list) else str(v)


def _wave64_lines(w: dict, row) -> list[str]:
    """The wave64 check's lines: lowered (per kernel: dynamic shared memory), compiled (per kernel: registers,
    spills, occupancy) or NA with the reason."""
    if not w["lowered"]:
        return [row("wave64", f"does not lower for HIP gfx942: {w['error']}", "red")]
    out = [row("wave64", "lowers for HIP gfx942: " + ", ".join(f"{k} {v} B shared" for k, v in w["smem"].items())
               + ("; MFMA" if w["mfma"] else "; no MFMA") + (f"; CUDA-only: {w['cuda_only']}" if w["cuda_only"]
                                                            else ""))]
    if not w["compiled"]:
        return out + [row("compile", f"NA: {w['not_compiled']}", "yellow")]
    for k, c in w["compiled"].items():
        if not c["ok"]:
            out.append(row("compile", f"{k}: fails: {c['log'].splitlines()[-1] if c['log'] else ''}", "red"))
            continue
        use = "; ".join(f"{u['name']} {u['vgprs']} VGPRs + {u['agprs']} AGPRs, {u['spills']} spilled, "
                        f"{u['scratch_bytes']} B scratch, occupancy {u['occupancy']}" for u in c["kernels"])
        out.append(row("compile", f"{k}: {c['code_object_bytes']} B code object for gfx942 ({use})"))
    stubs = sorted({s for c in w["compiled"].values() for s in c["stubs"]})
    return out + [row("stubbed", ", ".join(stubs) or "nothing")]
