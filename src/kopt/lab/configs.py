"""Kernel configs as the lab tools take them: `label=JSON;label=+JSON`, a `+` laying the config over the case's own
resolved plan (so a tuned shape keeps its tuned tiles and one switch is tried), and the plan as the config that
pins it. Pure functions: no torch, no candidate code."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from kopt.errors import UsageError

#: plan_info fields that describe the call, not a config key (the rest of a plan is its config, laid under '+{..}').
PLAN_ONLY = ("path", "paged", "page_size")


@dataclass(frozen=True)
class LabConfig:
    """One config of a screen: its label, the JSON object, and whether it is laid over the case's own plan."""

    label: str
    config: dict
    over: bool = False

    def full(self, resolved: dict, plan_of: Optional[Callable[[dict], Optional[dict]]] = None) -> dict:
        """The config a call gets: laid over `resolved` (the case's plan as a config) when `over`, else as given;
        with `plan_of`, laid over as much of that plan as the candidate accepts (fit_over)."""
        if not self.over:
            return dict(self.config)
        return fit_over(resolved, self.config, plan_of) if plan_of else {**resolved, **self.config}


#: fit_over drops at most this many of the plan's keys to make an overlay resolve
FIT_MAX_DROPPED = 3


def fit_over(resolved: dict, override: dict, plan_of: Callable[[dict], Optional[dict]]) -> dict:
    """`override` laid over `resolved` (the case's plan as a config), keeping as much of that plan as the candidate
    accepts. A plan reports every field, also those another plan class may not pin (a balanced plan's split count,
    an unsplit plan's merge), and the candidate refuses a key a plan cannot use. So: the whole overlay where the
    candidate resolves it; else the overlay without the fewest of the plan's keys (up to FIT_MAX_DROPPED) that makes
    it resolve, choosing the one whose plan keeps the most of `resolved`'s values. `plan_of(config)`: the candidate's
    plan of a config, None where it refuses the config. Where nothing resolves: the whole overlay, so the caller
    reports the candidate's own error."""
    full = {**resolved, **override}
    if plan_of(full) is not None:
        return full
    mine = [k for k in resolved if k not in override]
    for n in range(1, min(FIT_MAX_DROPPED, len(mine)) + 1):
        best, best_kept = None, -1
        for dropped in itertools.combinations(mine, n):
            cfg = {k: v for k, v in full.items() if k not in dropped}
            plan = plan_of(cfg)
            if plan is None:
                continue
            got = resolved_config(plan)
            kept = sum(got.get(k) == resolved[k] for k in mine)
            if kept > best_kept:
                best, best_kept = cfg, kept
        if best is not None:
            return best
    return full


def parse_configs(text: str, labelled: bool = True) -> list[LabConfig]:
    """'label=JSON;label=+JSON' (labelled) or 'JSON;+JSON' (not) -> LabConfigs; a bad entry is a usage error."""
    out = []
    for i, part in enumerate(filter(None, (p.strip() for p in text.split(";")))):
        if labelled:
            label, sep, body = part.partition("=")
            if not sep or not label.strip():
                raise UsageError(f"config {part!r}: want label=JSON")
            label, body = label.strip(), body.strip()
        else:
            label, body = f"c{i}", part
        over = body.startswith("+")
        try:
            cfg = json.loads(body.lstrip("+"))
        except ValueError:
            raise UsageError(f"config {label!r}: not valid JSON: {body[:60]!r}") from None
        if not isinstance(cfg, dict):
            raise UsageError(f"config {label!r}: want a JSON object")
        out.append(LabConfig(label, cfg, over))
    return out


def check_keys(configs: list[LabConfig], known: Optional[frozenset]) -> None:
    """A config key the candidate does not declare (kopt.candidate.config_keys; None: keys not known) is a usage
    error, before any work."""
    if known is None:
        return
    for c in configs:
        unknown = sorted(set(c.config) - known)
        if unknown:
            raise UsageError(f"config {c.label!r}: unknown key{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)} (the candidate's keys: {', '.join(sorted(known))})")


def resolved_config(plan: dict, keys: Optional[frozenset] = None) -> dict:
    """A resolved plan (the candidate's plan_info) as the config that pins it: what '+{..}' is laid over. Booleans
    as 0/1; the call's own fields (PLAN_ONLY) and any field that is no config key of the candidate left out."""
    return {k: int(v) if isinstance(v, bool) else v for k, v in plan.items()
            if k not in PLAN_ONLY and (keys is None or k in keys)}


def same_plan(plan: dict, default_plan: dict) -> bool:
    """Whether a config's resolved plan is the default plan: then the kernels are the same and a pair is an A/A."""
    return plan == default_plan
