"""kopt.eval.prewarm: a verdict's kernels, deduplicated through the candidate's device_plan, compiled ahead on CUDA
(the compiles themselves need a GPU: tests/gpu); here, without one, what is planned and when."""

from __future__ import annotations

from conftest import SHIPPED
from kopt.cases import load_file
from kopt.eval import prewarm, verdict
from kopt.eval.bench import BenchOptions
from kopt.hardware import profile


def test_a_verdicts_rows_resolve_to_fewer_distinct_kernels_on_an_h200():
    """A verdict's rows (named cases, the matrix, held-out draws) on an H200 plan to fewer kernels than rows (shapes
    that share a plan share a kernel), each keyed by what selects a build, none failing to plan."""
    from kopt import candidate

    cf = load_file()
    cases = list(cf.cases) + verdict.matrix_cases(cf) + verdict.heldout_draw(4, 7, "cuda")
    ks = prewarm.distinct(candidate.load(SHIPPED), [(c, None) for c in cases], profile("H200").model_dump())
    assert 1 < len(ks) < len(cases)
    assert not [k.error for k in ks if k.error]
    assert len({k.key for k in ks}) == len(ks) and all(dict(k.key)["dtype"] in ("fp16", "bf16") for k in ks)


def test_a_plan_that_raises_is_a_kernel_with_its_error():
    """A shape the candidate cannot plan is not dropped: it comes back with the candidate's words."""
    from kopt import candidate

    mod = candidate.load(SHIPPED)
    case = load_file().cases[3].with_variant(dtype="fp16")
    ks = prewarm.distinct(mod, [(case, {"no_such_key": 1})], profile("H200").model_dump())
    assert len(ks) == 1 and "no_such_key" in ks[0].error


def test_the_verdict_warms_its_kernels_on_cuda_only(monkeypatch, tmp_path):
    """verdict.run compiles ahead on a CUDA device (every row's case, with the run's config), never on the CPU; on
    CUDA each evaluation is handed a child started before the compiles (a live process), on the CPU none."""
    seen, given = [], {}

    def evaluate(path, cases, o, on_result, child=None):
        given.setdefault(o.device, []).append(child is not None and child.popen.poll() is None)
        if child is not None:
            child.close()
        return []

    monkeypatch.setattr(prewarm, "warm_cases", lambda path, cases, emit, jobs=None, config=None:
                        seen.append((len(cases), config)))
    monkeypatch.setattr(verdict, "evaluate", evaluate)
    monkeypatch.setattr("kopt.hardware.resolve_device", lambda device: device)  # no GPU here: plan as if
    cf = load_file()
    for device in ("cpu", "cuda"):
        verdict.run(SHIPPED, cf, BenchOptions(device=device, cold=True, config={"block_N": 64}), [4, 5], None, [],
                    quick=True)
    assert len(seen) == 1 and seen[0][0] > 2 and seen[0][1] == {"block_N": 64}
    assert given["cpu"] and not any(given["cpu"]) and given["cuda"] and all(given["cuda"])


def test_the_candidate_is_loaded_for_the_compiles_in_a_process_of_its_own(tmp_path):
    """warm_cases runs the candidate's code in a child (`python -m kopt.eval.prewarm`), never in the process that
    judges it: a candidate that marks the process importing it leaves this one unmarked, and the child's answer (no
    hooks to plan with) comes back as the reason."""
    import builtins

    cand = tmp_path / "marks.py"
    cand.write_text('import builtins\nbuiltins.KOPT_TEST_MARK = True\nBACKEND = "torch"\n\n\n'
                    'def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):\n'
                    '    return q\n')
    said = []
    why = prewarm.warm_cases(cand, load_file().cases[:2], said.append)
    assert why == "the candidate has no device_plan()/prepare() hooks" and said == []
    assert not hasattr(builtins, "KOPT_TEST_MARK")


def test_a_failing_compile_process_is_a_reason_not_an_error(tmp_path):
    """The shipped candidate on a host without CUDA: the child cannot name the device; the verdict goes on, told
    why nothing was compiled ahead."""
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("a CUDA device is visible here")
    why = prewarm.warm_cases(SHIPPED, load_file().cases[3:5], lambda line: None)
    assert why and why.startswith("exit ") and len(why) <= 300
