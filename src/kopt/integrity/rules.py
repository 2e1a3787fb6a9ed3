"""The static rule table: codes, severities, and the names each rule matches.

Two families. Backend rules (KS1xx) apply to candidates that declare BACKEND = "tilelang" (or
declare nothing): the math must be TileLang's, so prebuilt attention kernels and torch/numpy
attention math on the host are errors. Integrity rules (KS2xx) apply to every backend: reading
harness state, patching modules, introspecting the harness, or leaving work running behind
`run`'s back is cheating whatever the kernel is written in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    """One static-check result: a rule code, its severity, what was found, and where."""

    code: str
    severity: Severity
    message: str
    line: int
    file: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file else f"line {self.line}"
        return f"{self.code} {self.severity} {where}: {self.message}"


#: code -> (severity, what the rule catches); the report and `kopt` docs print this table.
RULES: dict[str, tuple[Severity, str]] = {
    "KS001": ("warning", "file does not parse (the import reports it as compile_error)"),
    "KS002": ("error", "BACKEND is not one literal string assigned once at module level"),
    "KS003": ("warning", "no BACKEND declared; the tilelang rules are applied"),
    "KS004": ("warning", "an imported sibling module cannot be read or parsed"),
    "KS101": ("error", "tilelang: imports or calls a prebuilt attention library (flash_attn, flashinfer, xformers, "
                       "...)"),
    "KS102": ("error", "tilelang: torch/numpy attention math on the host (matmul, bmm, einsum, softmax, exp, sdpa, "
                       "F.*)"),
    "KS103": ("error", "tilelang: calls registered operators directly (torch.ops, torch._C)"),
    "KS104": ("warning", "tilelang: `@` matrix-multiply operator (host matmul if the operands are tensors)"),
    "KS105": ("error", "tilelang: tensor method doing attention math (.softmax(, .matmul(, .bmm(, .exp(, ...)"),
    "KS106": ("error", "tilelang: a non-TileLang kernel system (triton, torch.compile, cpp_extension, cupy, numba, "
                       "...)"),
    "KS107": ("warning", "tilelang: host torch op outside the glue allowlist (allocation, dtype, shape, index)"),
    "KS108": ("warning", "tilelang: host reduction on a tensor (.sum(, .amax(, .max(, ...)"),
    "KS201": ("error", "imports or reaches into kopt (the harness)"),
    "KS202": ("error", "refers to harness state (ledger, ITERATIONS.md, the child's job/result files, sys.argv, "
                       "__main__)"),
    "KS203": ("error", "monkey-patches a module (attribute assignment, setattr/delattr on "
                       "torch/time/kopt/builtins/...)"),
    "KS204": ("warning", "sets a torch.backends flag (changes numerics of the baseline in the same process)"),
    "KS205": ("error", "uses the gc module (can find and alter harness objects)"),
    "KS206": ("error", "introspects frames or hooks the interpreter (inspect, sys._getframe, settrace, f_back, "
                       "__globals__)"),
    "KS207": ("error", "starts threads or processes (threading.Thread, multiprocessing, concurrent.futures, asyncio, "
                       "fork)"),
    "KS208": ("warning", "reads or writes the environment (os.environ, os.getenv)"),
    "KS209": ("warning", "ctypes / cffi: raw memory and native calls"),
    "KS210": ("warning", "creates or switches CUDA streams (work must be finished when run returns)"),
    "KS211": ("warning", "except clause that neither re-raises nor warns (a failure may be hidden)"),
    "KS212": ("error", "broad except (bare/Exception/BaseException) that returns another computation (silent "
                       "fallback)"),
    "KS213": ("warning", "dynamic code or lookup (exec, eval, compile, __import__, non-literal "
                         "getattr/setattr/import_module)"),
    "KS214": ("error", "tensor subclass or __torch_function__/__torch_dispatch__ (can fake comparisons of the output)"),
    "KS215": ("warning", "process control (os._exit, os.kill, os.abort, signal, atexit, sys.exit)"),
    "KS216": ("warning", "runs external programs (subprocess, os.system, os.popen)"),
    "KS217": ("warning", "refers to workspace outputs (results/, trajectory/, .git/); the tuning table kopt tune "
                         "writes for the kernel (results/<backend>/tuning.csv) is not flagged"),
}

# ---- backend family (tilelang) -------------------------------------------------------------

#: Roots of prebuilt attention kernels.
ATTENTION_LIBS = (
    "flash_attn", "flash_attn_interface", "flash_attn_2_cuda", "flash_attn_3", "flashattn", "flashinfer",
    "xformers", "vllm", "vllm_flash_attn", "sageattention", "flash_mla", "flashmla", "sgl_kernel",
    "apex", "transformer_engine", "deepspeed", "liger_kernel", "natten",
)

#: Roots of other kernel systems: their code is not TileLang.
OTHER_KERNEL_SYSTEMS = (
    "triton", "cupy", "numba", "pycuda", "cuda", "jax", "cutlass", "torch.compile", "torch._inductor",
    "torch._dynamo", "torch.utils.cpp_extension", "torch.library", "torch.jit", "torch.fx",
)

#: Attention math (exact names); numpy names are checked with the same list.
_MATH = (
    "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "dot", "vdot", "inner", "outer",
    "tensordot", "einsum", "chain_matmul", "softmax", "log_softmax", "_softmax", "_log_softmax", "exp",
    "exp2", "exp_", "expm1", "logsumexp", "sigmoid", "kron", "linalg", "special",
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_fused_sdp_choice", "_flash_attention_forward",
    "_efficient_attention_forward", "nn.MultiheadAttention", "nn.Linear", "nn.Softmax", "nn.attention",
)
TORCH_MATH = tuple(f"torch.{n}" for n in _MATH) + tuple(f"torch.Tensor.{n}" for n in _MATH) + tuple(
    f"numpy.{n}" for n in _MATH) + ("torch.nn.functional",)

#: Host glue a TileLang candidate may use freely (allocation, dtypes, devices, shapes).
TORCH_GLUE = (
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "arange", "tensor", "as_tensor", "from_numpy", "cat", "stack", "Generator", "device", "dtype", "Size",
    "Tensor", "is_tensor", "is_floating_point", "finfo", "iinfo", "no_grad", "inference_mode", "enable_grad",
    "set_grad_enabled", "manual_seed", "get_default_dtype", "__version__", "version", "cuda", "backends",
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8", "int16",
    "uint16", "int32", "uint32", "int64", "uint64", "int", "long", "bool", "float8_e4m3fn", "float8_e5m2",
    "utils.dlpack", "from_dlpack", "nn.functional.pad", "OutOfMemoryError", "Stream", "Event",
    "broadcast_shapes", "get_num_threads", "set_num_threads", "result_type", "promote_types",
)
TORCH_GLUE_QUALIFIED = tuple(f"torch.{g}" for g in TORCH_GLUE)
#: `.name(` on a tensor (unknown receiver) that computes attention math.
TENSOR_MATH_METHODS = frozenset({
    "softmax", "log_softmax", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "exp", "exp_",
    "exp2", "exp2_", "expm1", "logsumexp", "sigmoid", "scaled_dot_product_attention", "matmul_",
})
#: `.name(` on a tensor that reduces on the host (a warning: also plain Python, e.g. `lst.max`).
TENSOR_REDUCTIONS = frozenset({"sum", "amax", "amin", "max", "mean", "norm", "cumsum", "prod", "nansum"})

# ---- integrity family (every backend) ------------------------------------------------------

#: Lower-cased substrings of a (non-docstring) string constant that point at harness state.
HARNESS_STRINGS = ("candidates.jsonl", "iterations.md", "result.json", "job.json", "child.log", "kopt-eval",
                   "kopt_candidate", "kopt_workspace")
#: A string naming the kopt package or its files: `kopt`, `kopt.timing`, `.../kopt/...` (not a candidate's own
#: `KOPT_...` environment knobs: reading the environment is KS208).
KOPT_STRING = re.compile(r"^kopt($|\.)|[/\\]kopt($|[./\\])", re.IGNORECASE)
HARNESS_PATH_PARTS = ("results/", "trajectory/", "/results", "/trajectory", ".git/")
#: The one workspace output a kernel is meant to read: the tuning table `kopt tune` writes for it.
TUNING_TABLE = re.compile(r"^(.*/)?results/[A-Za-z0-9_.-]+/tuning\.csv$")
#: Calls that report a failure (an except clause making one is not silent).
WARNS = ("warnings.warn",)
GC = ("gc",)
INTROSPECTION = (
    "inspect", "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
    "sys.monitoring", "sys.gettrace", "sys.getprofile", "threading.settrace", "threading.setprofile",
    "threading.settrace_all_threads", "threading.setprofile_all_threads", "traceback.extract_stack",
    "traceback.walk_stack", "ctypes.pythonapi",
)
HARNESS_NAMES = ("sys.argv", "sys.orig_argv", "__main__", "kopt")
FRAME_ATTRS = frozenset({
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame", "cr_frame",
    "ag_frame", "__globals__", "__closure__", "__subclasses__", "__builtins__", "__self__", "__defaults__",
    "__kwdefaults__", "__code__",
})
CONCURRENCY = (
    "threading.Thread", "threading.Timer", "threading._start_new_thread", "threading._start_joinable_thread",
    "_thread", "multiprocessing", "concurrent", "asyncio", "os.fork", "os.forkpty", "os.spawnl", "os.spawnle",
    "os.spawnlp", "os.spawnlpe", "os.spawnv",
    "os.spawnve", "os.spawnvp", "os.spawnvpe", "os.posix_spawn", "os.posix_spawnp", "os.execv", "os.execve",
    "os.execl", "os.execle", "os.execlp", "os.execlpe", "os.execvp", "os.execvpe", "os.register_at_fork",
    "pty", "sched", "torch.multiprocessing", "torch.jit.fork", "torch.jit._fork", "torch.futures",
)
PROGRAMS = ("subprocess", "os.system", "os.popen")
ENVIRON = ("os.environ", "os.environb", "os.getenv", "os.getenvb", "os.putenv", "os.unsetenv")
NATIVE = ("ctypes", "cffi", "_ctypes")
STREAMS = ("torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.stream", "torch.cuda.set_stream",
           "torch.cuda.StreamContext", "torch.Stream", "torch.cuda.streams")
PROCESS_CONTROL = ("os._exit", "os.kill", "os.killpg", "os.abort", "signal", "atexit", "sys.exit", "faulthandler")
DYNAMIC_BUILTINS = frozenset({"exec", "eval", "compile", "__import__"})


def matches(qualified: str, names) -> str | None:
    """The entry of `names` that `qualified` is or lies under (`a.b` matches `a.b` and `a.b.c`)."""
    for n in names:
        if qualified == n or qualified.startswith(n + "."):
            return n
    return None
