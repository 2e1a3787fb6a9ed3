"""Static checks on candidate source: each rule fires where it should, and not on honest code."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import SHIPPED
from kopt.integrity import RULES, Finding, static_check

ADV = Path(__file__).resolve().parents[2] / "adversarial"
HEAD = ("BACKEND = \"tilelang\"\n\n\n"
        "def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):\n    pass\n")


def _check(tmp_path: Path, body: str, backend: str | None = "tilelang", name: str = "cand.py") -> list[Finding]:
    head = f"BACKEND = {backend!r}\n" if backend is not None else ""
    p = tmp_path / name
    p.write_text(head + textwrap.dedent(body))
    return static_check(p)


def _codes(findings, severity=None) -> set[str]:
    return {f.code for f in findings if severity is None or f.severity == severity}


def test_rule_table_is_consistent():
    assert all(code.startswith("KS") and len(code) == 5 for code in RULES)
    assert {sev for sev, _ in RULES.values()} == {"error", "warning"}


def test_shipped_kernel_has_no_errors():
    if not SHIPPED.exists():
        pytest.skip("shipped kernel not present")
    findings = static_check(SHIPPED)
    assert not [f for f in findings if f.severity == "error"], [str(f) for f in findings]


def test_honest_tilelang_host_glue_is_clean(tmp_path):
    body = """
    import math
    import threading
    import torch
    _LOCK = threading.Lock()

    def _build(d):
        import tilelang.language as T
        def body(acc, x):
            T.gemm(x, x, acc)
            acc[0] = T.exp2(acc[0]) + T.max(acc[0], acc[1])
            T.reduce_sum(acc, acc, dim=1)
        return body

    def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
        B, _, Hq, D = q.shape
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
        lens = cache_seqlens.to(torch.int32).contiguous()
        bt = torch.zeros((B, 1), dtype=torch.int32, device=q.device)
        idx = torch.arange(B, device=q.device)
        out = torch.empty((B, Hq, D), dtype=torch.float32, device=q.device)
        with torch.cuda.device(q.device):
            pass
        return out.to(q.dtype).view(B, 1, Hq, D)[idx]
    """
    assert _check(tmp_path, body) == []


@pytest.mark.parametrize("code,body", [
    ("KS101", "import flash_attn\n"),
    ("KS101", "from flash_attn import flash_attn_with_kvcache as f\n"),
    ("KS101", "def run(*a):\n    import flashinfer\n    return flashinfer.decode(*a)\n"),
    ("KS101", "import xformers.ops as xops\n"),
    ("KS101", "import importlib\nm = importlib.import_module('flash_attn')\n"),
    ("KS102", "import torch\ny = torch.matmul(1, 2)\n"),
    ("KS102", "import torch\ny = torch.bmm\n"),
    ("KS102", "from torch import einsum\ny = einsum('ij,jk', 1, 2)\n"),
    ("KS102", "import torch.nn.functional as F\ny = F.softmax(1, -1)\n"),
    ("KS102", "import torch.nn.functional as F\ny = F.scaled_dot_product_attention\n"),
    ("KS102", "from torch.nn import functional\ny = functional.linear\n"),
    ("KS102", "import torch\nmm = torch.mm\nz = mm(1, 2)\n"),
    ("KS102", "import torch\nz = torch.baddbmm(1, 2, 3)\n"),
    ("KS102", "import torch\nz = torch.exp(1)\n"),
    ("KS102", "import numpy as np\nz = np.einsum('ij', 1)\n"),
    ("KS102", "import torch\nz = getattr(torch, 'softmax')\n"),
    ("KS102", "from torch import *\n"),
    ("KS103", "import torch\nz = torch.ops.aten.mm\n"),
    ("KS104", "def f(a, b):\n    return a @ b\n"),
    ("KS105", "def f(s):\n    return s.softmax(-1)\n"),
    ("KS105", "def f(a, b):\n    return a.matmul(b).exp()\n"),
    ("KS106", "import triton\n"),
    ("KS106", "import torch\nf = torch.compile(lambda x: x)\n"),
    ("KS106", "from torch.utils.cpp_extension import load_inline\n"),
    ("KS107", "import torch\nz = torch.where(1, 2, 3)\n"),
    ("KS108", "def f(s):\n    return s.amax(-1)\n"),
])
def test_backend_rules(tmp_path, code, body):
    assert code in _codes(_check(tmp_path, body))
    # the same code is fine when the candidate honestly declares a torch backend
    assert code not in _codes(_check(tmp_path, body, backend="torch"))


@pytest.mark.parametrize("code,body", [
    ("KS201", "import kopt\n"),
    ("KS201", "from kopt.timing import time_fn\n"),
    ("KS201", "import sys\nt = sys.modules['kopt.timing']\n"),
    ("KS202", "x = open('candidates.jsonl').read()\n"),
    ("KS202", "from pathlib import Path\nx = Path('ITERATIONS.md').read_text()\n"),
    ("KS202", "import os\nws = os.environ['KOPT_WORKSPACE']\n"),
    ("KS202", "import sys\njob = sys.argv[1]\n"),
    ("KS202", "import __main__\n"),
    ("KS203", "import time\ntime.perf_counter = lambda: 0.0\n"),
    ("KS203", "import torch\ntorch.cuda.synchronize = lambda: None\n"),
    ("KS203", "import torch\nsetattr(torch, 'equal', lambda a, b: True)\n"),
    ("KS203", "import torch\nsetattr(torch.Tensor, 'clone', lambda self: self)\n"),
    ("KS203", "from torch import Tensor\nTensor.copy_ = None\n"),
    ("KS203", "import time as t\ndel t.perf_counter\n"),
    ("KS203", "import torch\nc = torch.cuda\nc.synchronize = print\n"),
    ("KS205", "import gc\nobjs = gc.get_objects()\n"),
    ("KS206", "import inspect\nf = inspect.currentframe()\n"),
    ("KS206", "import sys\nf = sys._getframe(1)\n"),
    ("KS206", "def f(frame):\n    return frame.f_back.f_locals\n"),
    ("KS206", "def f(fn):\n    return fn.__globals__\n"),
    ("KS206", "x = object.__subclasses__()\n"),
    ("KS206", "import sys\nsys.settrace(None)\n"),
    ("KS207", "import threading\nt = threading.Thread(target=print)\n"),
    ("KS207", "from threading import Timer\n"),
    ("KS207", "import multiprocessing\n"),
    ("KS207", "from concurrent.futures import ThreadPoolExecutor\n"),
    ("KS207", "import asyncio\n"),
    ("KS207", "import os\npid = os.fork()\n"),
    ("KS207", "import torch\nfut = torch.jit.fork(print)\n"),
    ("KS206", "def f(g):\n    g.__defaults__ = (1,)\n"),
    ("KS212", "def f(x):\n    try:\n        return g(x)\n    except Exception:\n        return h(x)\n"),
    ("KS212", "def f(x):\n    try:\n        return g(x)\n    except:\n        return h(x)\n"),
    ("KS214", "import torch\nclass Fake(torch.Tensor):\n    pass\n"),
    ("KS214", "class Spy:\n    def __torch_function__(self, *a):\n        pass\n"),
])
def test_integrity_errors_apply_to_every_backend(tmp_path, code, body):
    for backend in ("tilelang", "torch"):
        fs = _check(tmp_path, body, backend=backend)
        assert code in _codes(fs, "error"), (backend, [str(f) for f in fs])


@pytest.mark.parametrize("code,body", [
    ("KS204", "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"),
    ("KS208", "import os\nx = os.environ.get('HOME')\n"),
    ("KS208", "import os\nx = os.getenv('HOME')\n"),
    ("KS209", "import ctypes\n"),
    ("KS210", "import torch\ns = torch.cuda.Stream()\n"),
    ("KS210", "import torch\ndef f(s):\n    with torch.cuda.stream(s):\n        pass\n"),
    ("KS211", "def f():\n    try:\n        pass\n    except OSError:\n        pass\n"),
    ("KS211", "import contextlib\nwith contextlib.suppress(OSError):\n    pass\n"),
    ("KS213", "def f(m, n):\n    return getattr(m, n)\n"),
    ("KS213", "import importlib\ndef f(n):\n    return importlib.import_module(n)\n"),
    ("KS213", "exec('x = 1')\n"),
    ("KS213", "import sys\nm = sys.modules.get('torch')\n"),
    ("KS215", "import os\nos._exit(0)\n"),
    ("KS215", "import signal\n"),
    ("KS216", "import subprocess\nsubprocess.run(['true'])\n"),
    ("KS217", "x = open('../results/tilelang/candidates.json')\n"),
    ("KS208", "import os\nfast = os.environ.get('KOPT_TL_NO_FAST_CALL') == '1'\n"),  # a kernel's own knob
])
def test_warnings(tmp_path, code, body):
    fs = _check(tmp_path, body)
    assert code in _codes(fs, "warning"), [str(f) for f in fs]
    assert not _codes(fs, "error"), [str(f) for f in fs]


def test_the_tuning_table_and_a_warning_handler_are_not_flagged(tmp_path):
    """The kernel's own tuning table is the one workspace output it is meant to read, and an except clause that
    warns reports its failure: neither is a finding (the shipped kernel's tuning_lookup.py does both)."""
    assert not _check(tmp_path, "x = open('../results/tilelang/tuning.csv')\n")
    body = ("import warnings\ndef note(m):\n    warnings.warn(m)\ndef f(x):\n    try:\n        return g(x)\n"
            "    except KeyError:\n        note('no key')\n    try:\n        return g(x)\n    except OSError:\n"
            "        warnings.warn('unreadable')\n")
    assert not _check(tmp_path, body)


def test_reraise_in_handler_is_fine(tmp_path):
    body = ("def f(x):\n    try:\n        return g(x)\n    except Exception as e:\n"
            "        raise ValueError('bad') from e\n")
    assert not _check(tmp_path, body)


def test_narrow_handler_with_fallback_is_only_a_warning(tmp_path):
    body = "def f(x):\n    try:\n        return g(x)\n    except KeyError:\n        return 0\n"
    assert _codes(_check(tmp_path, body)) == {"KS211"}


def test_backend_declaration(tmp_path):
    assert _codes(_check(tmp_path, "x = 1\n", backend=None)) == {"KS003"}
    assert "KS002" in _codes(_check(tmp_path, "BACKEND = 'torch'\n"), "error")
    assert "KS002" in _codes(_check(tmp_path, "import os\nBACKEND = os.name\n", backend=None), "error")
    assert "KS002" in _codes(_check(tmp_path, "globals()['BACKEND'] = 'torch'\n"), "error")
    # without a declaration the tilelang rules apply
    assert "KS102" in _codes(_check(tmp_path, "import torch\nz = torch.softmax\n", backend=None))


def test_syntax_error_is_left_to_the_import(tmp_path):
    fs = _check(tmp_path, "def run(:\n")
    assert [(f.code, f.severity) for f in fs] == [("KS001", "warning")] and fs[0].line >= 1


def test_findings_carry_file_and_line(tmp_path):
    fs = _check(tmp_path, "import torch\n\n\nz = torch.softmax\n")
    f = next(f for f in fs if f.code == "KS102")
    assert f.line == 5 and f.file == "cand.py" and f.severity == "error" and "torch.softmax" in f.message
    assert "KS102" in str(f)


def test_docstrings_may_mention_the_harness(tmp_path):
    p = tmp_path / "doc.py"
    p.write_text('"""Loaded by kopt; see candidates.jsonl."""\n\nBACKEND = "tilelang"\n\n\n'
                 'def f():\n    """kopt calls this."""\n')
    assert not static_check(p)


def test_sibling_modules_are_checked(tmp_path):
    (tmp_path / "helper.py").write_text("import torch\n\ndef attn(q, k):\n    return torch.matmul(q, k)\n")
    (tmp_path / "loaded_by_name.py").write_text("import gc\n")
    (tmp_path / "unrelated.py").write_text("import flash_attn\n")
    body = """
    import importlib.util, os
    from helper import attn

    def _load(name):
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), name + ".py"))
        return spec

    _m = _load("loaded_by_name")
    """
    fs = _check(tmp_path, body)
    by_file = {(f.file, f.code) for f in fs if f.severity == "error"}
    assert ("helper.py", "KS102") in by_file
    assert ("loaded_by_name.py", "KS205") in by_file
    assert not any(f.file == "unrelated.py" for f in fs)  # not imported: not part of the candidate


def test_computed_path_loader_checks_every_sibling(tmp_path):
    (tmp_path / "hidden.py").write_text("import flash_attn\n")
    body = """
    import importlib.util
    spec = importlib.util.spec_from_file_location("x", "hid" + "den.py")
    """
    assert ("hidden.py", "KS101") in {(f.file, f.code) for f in _check(tmp_path, body)}


def test_sibling_inherits_the_candidates_backend(tmp_path):
    (tmp_path / "helper.py").write_text("BACKEND = 'torch'\nimport torch\nz = torch.softmax\n")
    fs = _check(tmp_path, "import helper\n")
    assert ("helper.py", "KS102") in {(f.file, f.code) for f in fs}


def test_evasion_by_computed_names_only_warns(tmp_path):
    body = """
    import importlib
    m = importlib.import_module("ti" + "me")
    setattr(m, "perf" + "_counter", lambda: 0.0)
    """
    fs = _check(tmp_path, body)
    assert _codes(fs) == {"KS213"}  # the dynamic guard (tampered) is what catches this one


def test_adversarial_static_candidates():
    expected = {"torch_softmax": "KS102", "flash_attn_call": "KS101", "read_ledger": "KS202", "patch_timer": "KS203"}
    for name, code in expected.items():
        assert code in _codes(static_check(ADV / f"{name}.py"), "error"), name
    for name in ("honest", "patch_sync_evasive", "late_thread", "pointer_cache", "segfault", "shape_table"):
        assert not _codes(static_check(ADV / f"{name}.py"), "error"), name
