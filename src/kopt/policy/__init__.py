"""The rules over what the store holds: which candidate ranks first, which iteration improved, which
candidate the views show. They read through kopt.store and write nothing.

- `ranking`    : candidates ranked over the ledger; the raw-row helpers (candidate id, speedup, geomeans).
- `iterations` : the committed iterations judged by the improvement rule; the trajectory the views draw.
- `shown`      : which candidate the report, the plots, `kopt status` and `kopt candidates` show.
"""

#: The face: the calls other stages make most, by the module that holds each.
_FACE = {"rank": "ranking", "Iteration": "iterations", "IterPoint": "iterations", "history": "iterations",
         "judge": "iterations", "threshold": "iterations", "Shown": "shown", "check_device": "shown",
         "shown_candidate": "shown"}

__all__ = sorted(_FACE)


def __getattr__(name: str):
    """The public face, imported on first use (as kopt.eval's): a stage that only ranks loads no other rule."""
    if name in _FACE:
        from importlib import import_module

        return getattr(import_module(f"kopt.policy.{_FACE[name]}"), name)
    raise AttributeError(f"module 'kopt.policy' has no attribute {name!r}")
