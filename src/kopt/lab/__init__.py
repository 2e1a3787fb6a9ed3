"""The lab: research tools over kopt's public faces and the candidate's contract (run, configs, prepare, plan_info,
device_plan), for what an engineer measures again; `kopt lab ...` runs them.

- `configs`   : kernel configs as `label=JSON;label=+JSON` (a `+` lays one over the case's own plan), pure.
- `screen`    : configs ABBA-paired against the candidate's own plan, case by case, in one process (GPU).
- `timeline`  : each kernel's start and end inside a cold call, the candidate and configs in place (GPU).
- `readbound` : the fastest pure read of each case's bytes paired with the candidate; per-layout reads (GPU;
                its Triton reads in `reads`).
- `prewarm`   : every kernel a run will need, deduplicated through device_plan, compiled in parallel (GPU; the
                list on any machine).
- `export`    : the ledger's runs as the committed bench CSV or the README table.
- `flashinfer`: the `flashinfer` peer checked against the reference and under graph replay (GPU); the build of
                kopt's C library of FlashInfer's decode (nvcc, no GPU).
- `campaign`  : a declarative file of named kopt steps, run in order with a log each, packed for `kopt import`.
- `ab`        : the A/B of a kernel change on the named cases and held-out draws whose plans it changes (plans on
                any machine; the timing paired on a GPU).
- `gpu_tests` : the GPU test matrix in shards side by side, then its failures alone, as one record.
- `common`    : what the GPU studies share (the CUDA check, cases, candidate, header line, table file).

Modules import torch, Triton and the candidate inside their functions: importing kopt.lab is light.
"""

#: The public face: name -> (module, its name there), imported on first use.
_FACE = {
    "LabConfig": ("configs", "LabConfig"), "parse_configs": ("configs", "parse_configs"),
    "check_keys": ("configs", "check_keys"), "resolved_config": ("configs", "resolved_config"),
    "same_plan": ("configs", "same_plan"),
    "require_cuda": ("common", "require_cuda"), "pick_cases": ("common", "pick_cases"),
    "candidate_path": ("common", "candidate_path"), "write_table": ("common", "write_table"),
    "run_screen": ("screen", "run"), "HUNG_EXIT": ("screen", "HUNG_EXIT"),
    "run_timeline": ("timeline", "run"), "TIMELINE_CALLS": ("timeline", "CALLS"),
    "TIMELINE_MIN_CALLS": ("timeline", "MIN_CALLS"), "TIMELINE_CONFIGS": ("timeline", "DEFAULT_CONFIGS"),
    "run_readbound": ("readbound", "run"), "read_layouts": ("readbound", "by_layout"),
    "prewarm_plan": ("prewarm", "plan"),
    "export_rows": ("export", "rows_for"), "export_csv": ("export", "to_csv"),
    "export_markdown": ("export", "to_markdown"), "ragged_names": ("export", "ragged_names"),
    "check_flashinfer": ("flashinfer", "check_all"), "build_flashinfer": ("flashinfer", "build"),
    "load_campaign": ("campaign", "load"), "select_steps": ("campaign", "select"), "dry_run": ("campaign", "dry_run"),
    "run_campaign": ("campaign", "run"), "campaign_summary": ("campaign", "summary"),
    "CampaignFile": ("campaign", "CampaignFile"), "CampaignResult": ("campaign", "CampaignResult"),
    "AbGroup": ("ab", "Group"), "ab_select": ("ab", "select"), "ab_selection_lines": ("ab", "selection_lines"),
    "run_ab": ("ab", "run"), "ab_registers": ("ab", "registers"),
    "save_ab_selection": ("ab", "save_selection"), "load_ab_selection": ("ab", "load_selection"),
    "run_gpu_tests": ("gpu_tests", "run"), "gpu_tests_record": ("gpu_tests", "record"),
    "GpuTestsResult": ("gpu_tests", "MatrixResult"),
    "Step": ("campaign", "Step"), "StepResult": ("campaign", "StepResult"), "StepStatus": ("campaign", "StepStatus"),
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    """The face's functions and models, each imported from its module on first use."""
    if name in _FACE:
        from importlib import import_module

        module, attr = _FACE[name]
        return getattr(import_module(f"kopt.lab.{module}"), attr)
    raise AttributeError(f"module 'kopt.lab' has no attribute {name!r}")
