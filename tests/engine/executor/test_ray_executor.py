"""--executor ray on a real local Ray cluster (a head and one more node, one CPU each), checked against
--executor local; and the executor's usage errors, which need no cluster."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import REPO, assert_reported_as_recorded
from conftest import TUNE_CANDIDATE as CANDIDATE
from kopt.cli.main import app
from kopt.records import CaseResult
from kopt.store import tuning
from kopt.store.ledger import load

TASK_TITLE = "ray::node_task"   # the process title Ray gives a worker while it runs kopt's task


@dataclass
class Cluster:
    address: str
    temp_dir: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"ray cluster: {what} after {timeout:.0f} s")
        time.sleep(0.3)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster():
    """`ray start --head` plus `ray start --address` as this module's children (--block: each stops its
    node's processes on SIGTERM), one CPU each, a small object store, no dashboard; stopped at the end."""
    ray = pytest.importorskip("ray")
    tmp = tempfile.mkdtemp(prefix="kr")   # short: Ray's unix sockets live under it (108-byte limit)
    port = _free_port()
    (Path(tmp) / "t").mkdir()
    # TMPDIR: the shards' scratch folders (a killed worker cannot remove its own) go with the cluster
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TMPDIR=str(Path(tmp) / "t"))
    cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start", "--block", "--num-cpus=1",
           "--num-gpus=0", "--object-store-memory=80000000", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    procs = []

    def start(*args):
        log = open(Path(tmp) / f"node{len(procs)}.log", "wb")
        procs.append(subprocess.Popen(cli + list(args), env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))

    addr = f"127.0.0.1:{port}"
    try:
        start("--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={tmp}")
        _wait(lambda: _answers(port), 60, "the head did not answer")
        start(f"--address={addr}")
        ray.init(address=addr, log_to_driver=False, logging_level="WARNING")
        try:
            _wait(lambda: sum(n["Alive"] for n in ray.nodes()) >= 2, 60, "the second node did not join")
        finally:
            ray.shutdown()
        yield Cluster(addr, tmp)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _candidate(ws: Path) -> Path:
    """The tests' torch candidate with a CPU config space (the shipped one's space is CUDA-only), in the workspace."""
    p = ws / "cand" / "passes.py"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(CANDIDATE % "False")
    return p


def _tune(cand: Path, csv: Path, *extra: str):
    r = CliRunner().invoke(app, ["tune", "--case", "2,3", "--device", "cpu", "--candidate", str(cand), "--quick",
                                 "--csv", str(csv), "--json", *extra])
    return r, (json.loads(r.stdout) if r.exit_code in (0, 1) and r.stdout.strip() else None)


def test_tune_on_ray_matches_local(cluster, workspace):
    """The same commit tuned locally and on the cluster: the same configs tried with the same outcome (status,
    correctness), each run's winner one of its correct configs and reported as recorded, the same table keys, one
    writer. Which config wins is the timings' call on a shared machine: not compared."""
    cand = _candidate(workspace)
    loc, lj = _tune(cand, workspace / "local.csv")
    assert loc.exit_code == 0, loc.output
    r, rj = _tune(cand, workspace / "ray.csv", "--executor", "ray", "--ray-address", cluster.address)
    assert r.exit_code == 0, r.output
    assert "kopt: ray: 2 node(s), 2 CPU slot(s); the workspace is shipped to each node" in r.stderr
    assert "retrying" not in r.stderr
    tried = lambda c: [(x["index"], x["config"], x["status"], x["correct"]) for x in c["configs"]]  # noqa: E731
    assert [a["case"] for a in lj["cases"]] == [b["case"] for b in rj["cases"]] == [2, 3]
    for a, b in zip(lj["cases"], rj["cases"]):
        assert a["ok"] and b["ok"] and tried(a) == tried(b) and len(tried(b)) == 3
        assert all(ok for *_, ok in tried(b))                  # no crash config here: all three correct
        for c in (a, b):
            assert assert_reported_as_recorded(c)["correct"]
    here = socket.gethostname()
    lt, rt = tuning.read(workspace / "local.csv").rows, tuning.read(workspace / "ray.csv").rows
    # the cluster's two cases finish in either order (rows are written as each ends): compared as sets
    assert sorted(x.key for x in lt) == sorted(x.key for x in rt) and len(rt) == 2
    for rows, js in ((lt, lj), (rt, rj)):
        assert {x.batch: x.config for x in rows} == {c["row"]["batch"]: c["config"] for c in js["cases"]}
    assert all(x.host == here and x.device == "cpu" and x.units > 0 for x in rt)
    led = load(CaseResult, workspace / "candidates.jsonl")
    assert not led.skipped and [x.case for x in led.rows[:2]] == [2, 3]          # local: in case order
    assert sorted(x.case for x in led.rows[2:]) == [2, 3]                        # the nodes append nothing
    assert all(x.mode == "tune" and x.host == here and x.units and x.device == "cpu" for x in led.rows)
    for rows, js in ((led.rows[:2], lj), (led.rows[2:], rj)):
        assert {x.case: x.config for x in rows} == {c["case"]: c["config"] for c in js["cases"]}


def test_verify_on_ray_matches_local(cluster, workspace):
    """The shipped candidate verified locally and on the cluster (shared path): same rows, same verdict."""
    shutil.copytree(REPO / "solution" / "tilelang", workspace / "solution" / "tilelang",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cases_yaml = workspace / "bench" / "cases.yaml"
    spec = yaml.safe_load(cases_yaml.read_text())
    spec["verify"] = {"seeds": 1, "matrix": [{"cases": [3], "dtype": "bf16", "page_size": 16, "seqlens": "ragged"}],
                      "hidden": 1, "heldout": 2}   # a small Verdict: perf, matrix, hidden rows and two held-out draws
    cases_yaml.write_text(yaml.safe_dump(spec, sort_keys=False))
    base = ["verify", "--case", "2", "--device", "cpu", "--quick-timing", "--json", "--heldout-seed", "7", "--no-pair"]
    loc = CliRunner().invoke(app, base)
    assert loc.exit_code == 0, loc.output
    r = CliRunner().invoke(app, base + ["--executor", "ray", "--ray-address", cluster.address, "--ray-shared"])
    assert r.exit_code == 0, r.output
    lj, rj = json.loads(loc.stdout), json.loads(r.stdout)
    assert lj["verdict"].split()[0] == rj["verdict"].split()[0] == "VERDICT:pass"
    key = lambda row: (row["case"], row["variant"], row["status"], row["correct"])  # noqa: E731
    assert [key(x) for x in lj["rows"][:2]] == [key(x) for x in rj["rows"][:2]]      # hidden shapes are random
    assert len(lj["rows"]) == len(rj["rows"]) == 5 and rj["rows"][2]["correct"]
    held = lambda rows: [(x["case"], x["shape"], x["variant"], x["heldout_seed"]) for x in rows[3:]]  # noqa: E731
    assert held(lj["rows"]) == held(rj["rows"]) and {x["case_kind"] for x in rj["rows"][3:]} == {"heldout"}
    led = load(CaseResult, workspace / "candidates.jsonl").rows
    assert len(led) == 10                   # the nodes share this workspace: a node's own append would show
    assert all(x.host == socket.gethostname() and x.units for x in led[5:])
    assert len({x.run_id for x in led[5:]}) == 1 and all(x.mode == "verdict" for x in led)


def _our_task_workers(temp_dir: str) -> list[int]:
    """Pids of Ray workers of this module's cluster (their raylet names its temp dir) running kopt's task."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if not (d / "cmdline").read_bytes().startswith(TASK_TITLE.encode()):
                continue
            ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[1]
            if temp_dir in Path(f"/proc/{ppid}/cmdline").read_text(errors="replace"):
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL a worker and the tuning children it started (each in its own session), so none outlives the test."""
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                os.killpg(int(d.name), signal.SIGKILL)
        except (OSError, IndexError):
            continue
    os.kill(pid, signal.SIGKILL)


def test_killed_worker_shard_is_retried(cluster, workspace):
    """A worker killed mid-shard: that shard's failure is reported, it runs again on the other node, the run ends."""
    cand = _candidate(workspace)
    killed, stop = [], threading.Event()

    def killer():
        seen: dict[int, float] = {}
        while not stop.is_set() and not killed:
            for pid in _our_task_workers(cluster.temp_dir):
                if time.monotonic() - seen.setdefault(pid, time.monotonic()) > 1.0:  # its tuning child is at work
                    _kill_tree(pid)
                    killed.append(pid)
                    break
            time.sleep(0.1)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        r, rj = _tune(cand, workspace / "ray.csv", "--executor", "ray", "--ray-address", cluster.address)
    finally:
        stop.set()
        t.join()
    assert killed and r.exit_code == 0, r.output
    assert "died on host" in r.stderr and "retrying once on another node" in r.stderr
    notes = [c["note"] for c in rj["cases"]]
    assert sum("retried after: died on host" in n for n in notes) == 1 and all(c["ok"] for c in rj["cases"])
    assert sorted(x.case for x in load(CaseResult, workspace / "candidates.jsonl").rows) == [2, 3]


def test_stale_copy_is_refused_not_measured(cluster, workspace, monkeypatch):
    """A node whose copy of the candidate hashes differently refuses the shard (retried once); nothing is written."""
    from kopt.executor.ray import RayExecutor

    cand = _candidate(workspace)
    real = RayExecutor.checkout

    def stale(self, path):
        co = real(self, path)
        co.content_hash = "0" * 64            # what the head would expect of another version
        return co

    monkeypatch.setattr(RayExecutor, "checkout", stale)
    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--candidate", str(cand), "--quick",
                                 "--executor", "ray", "--ray-address", cluster.address, "--ray-shared"])
    assert r.exit_code == 1, r.output
    assert "STATUS:failed" in r.stdout and "MESSAGE:ray_task_refused_on_host_" in r.stdout and "stale_copy" in r.stdout
    assert "kopt: ray: shard 1/2 refused on host" in r.stderr and "retrying once" in r.stderr   # 2 slots: 2 shards
    assert not (workspace / "candidates.jsonl").exists() and not (workspace / "results").exists()


def test_ctrl_c_cancels_the_tasks_and_leaves_the_ledger_whole(cluster, workspace):
    """Ctrl-C after the first case: the tasks still out are cancelled, the ledger holds that case's whole row."""
    import ray

    from kopt.cases import load_cases, select
    from kopt.tune import TuneOptions, tune

    cand = _candidate(workspace)
    logs = []

    def interrupt(ct):
        raise KeyboardInterrupt

    opts = TuneOptions(device="cpu", quick=True, executor="ray", ray_address=cluster.address,
                       csv=workspace / "t.csv")
    with pytest.raises(KeyboardInterrupt):
        tune(cand, select(load_cases(), [2, 3, 4]), opts, on_case=interrupt, log=logs.append)
    assert any(m.startswith("kopt: ray: cancelled ") for m in logs), logs
    led = load(CaseResult, workspace / "candidates.jsonl")
    assert not led.skipped and len(led.rows) == 1 and len(tuning.read(workspace / "t.csv").rows) == 1
    assert not ray.is_initialized()                                     # the head left the cluster


# ---------------------------------------------------------------- no cluster needed

def test_without_ray_executor_ray_is_one_line_exit_2(workspace, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` now fails as if it were not installed
    cand = _candidate(workspace)
    for args in (["tune", "--case", "2", "--candidate", str(cand)], ["verify", str(cand)]):
        r = CliRunner().invoke(app, [*args, "--device", "cpu", "--executor", "ray"])
        assert r.exit_code == 2, r.output
        assert r.stderr == 'kopt: error: --executor ray needs Ray: pip install -e ".[ray]"\n'


@pytest.mark.parametrize("args, msg", [
    (["--executor", "slurm"], "unknown executor 'slurm'"),
    (["--ray-address", "127.0.0.1:1"], "need --executor ray"),
    (["--executor", "ray", "--gpus", "2"], "with --executor ray every shard takes one GPU"),
])
def test_executor_usage_errors(workspace, args, msg):
    cand = _candidate(workspace)
    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--candidate", str(cand), *args])
    assert r.exit_code == 2 and msg in r.stderr and r.stderr.count("\n") == 1, r.output


def test_dead_address_and_candidate_outside_a_shipped_workspace(workspace, tmp_path):
    pytest.importorskip("ray")
    from kopt.candidate import content_hash
    from kopt.errors import UsageError
    from kopt.executor.node import stale_copy
    from kopt.executor.ray import RayExecutor, _probe

    with pytest.raises(UsageError, match="no Ray cluster answers"):
        _probe(f"127.0.0.1:{_free_port()}")
    ex = RayExecutor("cpu")
    ex.workspace = workspace
    outside = tmp_path / "elsewhere.py"
    outside.write_text(CANDIDATE % "False")
    with pytest.raises(UsageError, match="must be inside it"):
        ex.checkout(outside)
    co = ex.checkout(_candidate(workspace))
    assert co.path == "cand/passes.py" and co.workspace is None            # found relative to the shipped copy
    assert stale_copy(str(outside), content_hash(outside)) is None
    assert "stale copy of the candidate" in stale_copy(str(outside), "f" * 64)
