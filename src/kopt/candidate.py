"""Load a candidate module by path and check it follows the contract."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from kopt.errors import CandidateLoadError, UsageError

REQUIRED_PARAMS = ("q", "k_cache", "v_cache", "cache_seqlens")


def resolve(path: Path | str) -> Path:
    """The candidate file as an absolute path; a missing file is a usage error (exit 2). A `REV:PATH` spec (a
    commit's candidate) is kopt.store's resolve_candidate, which exports it and then comes here."""
    p = Path(path).expanduser().resolve()
    if p.is_dir():
        raise UsageError(f"candidate is a folder, not a file: {path} (give its run_kernel.py)")
    if not p.is_file():
        raise UsageError(f"candidate file not found: {path}")
    if p.suffix != ".py":
        raise UsageError(f"candidate must be a .py file: {path}")
    return p


#: the file names a patch candidate takes (kopt.store's resolve_candidate: the shipped candidate with it applied)
PATCH_SUFFIXES = (".patch", ".diff")


def is_patch(spec: Path | str) -> bool:
    """Whether a candidate spec is a patch over the shipped candidate (a `.patch` or `.diff` file) rather than a
    candidate file; a missing patch file is a usage error (exit 2)."""
    p = Path(str(spec)).expanduser()
    if p.suffix not in PATCH_SUFFIXES:
        return False
    if not p.is_file():
        raise UsageError(f"candidate patch not found: {spec}")
    return True


def is_revision(spec: Path | str) -> bool:
    """Whether a candidate spec is `REV:PATH.py` (a commit's candidate) rather than a file: it has a colon, names a
    .py file and no file of that name exists."""
    s = str(spec)
    return ":" in s and s.endswith(".py") and not Path(s).expanduser().exists()


def sources(path: Path) -> list[Path]:
    """The candidate file, then the modules of its own folder that it imports (directly or through
    one another), sorted by name: the code a candidate id stands for."""
    import ast

    path = Path(path)
    seen: dict[str, Path] = {}
    todo = [path]
    while todo:
        f = todo.pop()
        try:
            tree = ast.parse(f.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                sib = path.parent / (name.split(".")[0] + ".py")
                if sib != path and sib.name not in seen and sib.is_file():
                    seen[sib.name] = sib
                    todo.append(sib)
    return [path] + [seen[k] for k in sorted(seen)]


#: Module-level names a candidate may declare its config keys under (a tuple or list of str), read without importing it.
CONFIG_KEY_NAMES = ("CONFIG_KEYS", "_CFG_KEYS")
#: Names the config dict goes by in a candidate's code: the string keys read from it (`cfg.get("k")`, `cfg["k"]`)
#: are accepted beside the declared ones (the CPU path's own keys, for one).
_CONFIG_VARS = ("cfg", "config", "conf")


def config_keys(path: Path) -> frozenset[str] | None:
    """The config keys a candidate accepts, read from its source (never imported: the parent runs no candidate
    code): the tuple it declares (CONFIG_KEY_NAMES), with the keys its code reads from the config dict. None when
    it declares none: its keys are then not known before it runs."""
    import ast

    declared: set[str] = set()
    read: set[str] = set()
    found = False
    for f in sources(path):
        try:
            tree = ast.parse(f.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in CONFIG_KEY_NAMES
                                                    for t in node.targets):
                if isinstance(node.value, (ast.Tuple, ast.List)):
                    found = True
                    declared |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)
                                 and isinstance(e.value, str)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                obj, args = node.func.value, node.args
            elif isinstance(node, ast.Subscript):
                obj, args = node.value, [node.slice]
            else:
                continue
            if (isinstance(obj, ast.Name) and obj.id in _CONFIG_VARS and args and isinstance(args[0], ast.Constant)
                    and isinstance(args[0].value, str)):
                read.add(args[0].value)
    return frozenset(declared | read) if found else None


#: The module-level name a candidate declares its plan rule's version under (an int or str constant; tuning rows carry
#: it, and a kernel applies only rows of its own version).
PLAN_VERSION_NAME = "PLAN_VERSION"


def plan_version(path: Path) -> str | None:
    """The candidate file's PLAN_VERSION as text, read from its source (never imported); None when it declares none
    or not as a constant."""
    import ast

    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == PLAN_VERSION_NAME
                                                for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, (int, str)) \
                    and not isinstance(node.value.value, bool):
                return str(node.value.value)
    return None


def content_hash(path: Path) -> str:
    """sha256 of the candidate file's bytes, followed by each sibling module it imports (name and
    bytes): editing tl_decode_cuda.py beside run_kernel.py makes another candidate. Its first
    ID_LEN hex digits are the candidate id (short_id)."""
    files = sources(path)
    h = hashlib.sha256(Path(path).read_bytes())
    for f in files[1:]:
        h.update(b"\0" + f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


#: Hex digits of the content hash that make the candidate id (ledger rows, snapshots, tuning rows, commits).
ID_LEN = 12


def short_id(content_hash_hex: str) -> str:
    """The candidate id of a content hash: its first ID_LEN hex digits (the one place this rule lives)."""
    return content_hash_hex[:ID_LEN]


def candidate_id(path: Path) -> str:
    """Short id of a candidate: its content hash prefix."""
    return short_id(content_hash(path))


def _own_siblings(folder: Path) -> None:
    """Forget the modules this process imported under the names of `folder`'s own modules from another folder (a
    candidate loaded before, whose `tl_decode_cuda` would otherwise serve this one, tuning table and all). The
    candidate loaded before keeps the modules it imported."""
    here = folder.resolve()
    for name in (f.stem for f in folder.glob("*.py")):
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and Path(file).resolve().parent != here:
            del sys.modules[name]


def load(path: Path) -> ModuleType:
    """Import the candidate file as a fresh module (its folder first on sys.path for sibling modules, and its own
    siblings, not another candidate's of the same names), it and every module of its folder compiled from their
    current sources (kopt.bytecode.fresh_sources)."""
    from kopt import bytecode

    path = Path(path)
    folder = str(path.parent)
    _own_siblings(path.parent)
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)  # first, so that its siblings are found before another candidate's
    bytecode.fresh_sources(folder)
    name = f"kopt_candidate_{candidate_id(path)}"
    spec = importlib.util.spec_from_file_location(name, path, loader=bytecode.FreshSourceLoader(name, str(path)))
    if spec is None or spec.loader is None:
        raise CandidateLoadError(f"cannot import {path.name}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise CandidateLoadError(f"syntax error in {path.name} line {e.lineno}: {e.msg}") from None
    except Exception as e:  # the candidate's own import failed: report, never crash the harness
        raise CandidateLoadError(f"import of {path.name} failed: {type(e).__name__}: {e}") from None
    check_contract(mod)
    return mod


@contextmanager
def loaded(path: Path) -> Iterator[ModuleType]:
    """The candidate module (load) for the duration of a with-block, after which this process's imports are as they
    were: its folder leaves sys.path, its own modules leave sys.modules, and the modules of those names that it put
    aside (another candidate's `tl_decode_cuda`) come back. For asking one candidate after another a question in a
    process that goes on (the plans of two candidates side by side), where a later plain import of a sibling name
    must not find this one's."""
    folder = Path(path).parent.resolve()
    names = [f.stem for f in folder.glob("*.py")]
    aside = {n: sys.modules[n] for n in names if n in sys.modules}
    path_before = list(sys.path)
    mod = load(path)
    try:
        yield mod
    finally:
        for n in names:
            file = getattr(sys.modules.get(n), "__file__", None)
            if file and Path(file).resolve().parent == folder:
                del sys.modules[n]
        sys.modules.update(aside)
        sys.modules.pop(mod.__name__, None)
        sys.path[:] = path_before


def check_contract(mod: ModuleType) -> None:
    """`run` must exist, be callable and take the contract's arguments; BACKEND should be a string."""
    run = getattr(mod, "run", None)
    if not callable(run):
        raise CandidateLoadError("candidate has no callable `run`")
    try:
        params = list(inspect.signature(run).parameters)
    except (TypeError, ValueError):
        return
    has_var = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in inspect.signature(run).parameters.values())
    if not has_var and params[:4] != list(REQUIRED_PARAMS):
        raise CandidateLoadError(f"`run` must take {', '.join(REQUIRED_PARAMS)} first; got {', '.join(params[:4])}")
    backend = getattr(mod, "BACKEND", None)
    if backend is not None and not isinstance(backend, str):
        raise CandidateLoadError("BACKEND must be a string")


def backend_of(mod: ModuleType) -> str:
    """The candidate's declared backend, or NA."""
    return str(getattr(mod, "BACKEND", "NA"))


def accepts_config(mod: ModuleType) -> bool:
    """Whether `run` takes a `config=` keyword."""
    try:
        ps = inspect.signature(mod.run).parameters
    except (TypeError, ValueError):
        return False
    return "config" in ps or any(p.kind == p.VAR_KEYWORD for p in ps.values())
