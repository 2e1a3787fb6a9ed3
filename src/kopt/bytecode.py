"""Python bytecode: cached for library code where the environment turns writing off, never used for a candidate.

Library code. Where $PYTHONDONTWRITEBYTECODE is set (container images often set it) no `.pyc` is ever
written, so every kopt process compiles torch, tilelang and tvm from their sources again: on an H200 host
`import torch` then took 4.0-5.7 s and `import tilelang` another 2.0-3.4 s, the larger part of a `kopt bench`
(1.4-1.7 s and 0.9-1.3 s from the cache).
kopt's processes and children then keep their bytecode in a cache folder of kopt's own instead
($PYTHONPYCACHEPREFIX; nothing is written beside any source): $KOPT_PYCACHE names that folder (default
$XDG_CACHE_HOME/kopt/pycache, else ~/.cache/kopt/pycache), `KOPT_PYCACHE=0` keeps the environment as it is. A
$PYTHONPYCACHEPREFIX of the user's own is left alone.

Candidate code. A `.pyc` is trusted by its source's size and whole-second time, so an edit that keeps the size
within the same second (`block_N = 64` -> `32`) would run the old code. A candidate's file and every module
under its folder are therefore compiled from their current sources each time a process imports them
(`fresh_sources`, which kopt.candidate.load applies): no `.pyc` read or written for them, and no stray `.pyc`
there imported in place of a source. Library code keeps its bytecode.

Standard library only: the `kopt` command calls `use_cache` before its own imports.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

ENV_CACHE = "KOPT_PYCACHE"


def cache_dir(env: dict | None = None) -> str | None:
    """The folder kopt keeps bytecode in under `env` (default: this process's environment), or None when
    nothing is to change: writing is on, the user set a prefix, or $KOPT_PYCACHE is 0."""
    env = os.environ if env is None else env
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX") or env.get(ENV_CACHE) == "0":
        return None
    if env.get(ENV_CACHE):
        return env[ENV_CACHE]
    from kopt.paths import cache_home

    return str(cache_home(env) / "pycache")


def child_env(env: dict) -> dict:
    """env with kopt's bytecode cache for a child process: a new dict when that changes anything, else env
    itself (never modified)."""
    folder = cache_dir(env)
    if folder is None:
        return env
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = folder
    return out


def use_cache() -> None:
    """This process: bytecode in kopt's cache folder from now on (as child_env gives a child)."""
    folder = cache_dir()
    if folder is not None and sys.pycache_prefix is None:
        sys.pycache_prefix = folder
        sys.dont_write_bytecode = False


class FreshSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader that compiles the file as it is now: no cached bytecode read, none written."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


#: Folders whose modules compile from their sources in this process (fresh_sources).
_FRESH: set[str] = set()


def _under(path: str, root: str) -> bool:
    """Whether sys.path entry `path` ('' is the working folder) is `root` (a real path) or below it."""
    real = os.path.realpath(path or os.getcwd())
    return real == root or real.startswith(root + os.sep)


def fresh_sources(folder: str) -> None:
    """Modules this process imports from `folder` or below are compiled from their sources from now on
    (FreshSourceLoader; extension modules load as usual, lone `.pyc` files are not imported)."""
    root = os.path.realpath(folder)
    loaders = ((importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
               (FreshSourceLoader, importlib.machinery.SOURCE_SUFFIXES))

    def hook(path: str):
        if not _under(path, root):
            raise ImportError("not under the candidate's folder")
        return importlib.machinery.FileFinder(path, *loaders)

    if root not in _FRESH:
        _FRESH.add(root)
        sys.path_hooks.insert(0, hook)
    for path in [p for p in sys.path_importer_cache if _under(p, root)]:  # finders made before the hook: again
        del sys.path_importer_cache[path]
