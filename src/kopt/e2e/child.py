"""The e2e child: `python -m kopt.e2e.child JOB.json RESULT.json` runs one e2e job (kopt.e2e.runner) and writes its
E2EResult; a usage error or a failing candidate is a result too (error_kind), so only a crash leaves none."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from pydantic import BaseModel

from kopt.e2e.models import E2EOptions, E2EResult
from kopt.records import Status


class Job(BaseModel):
    """What the parent asks: the candidate file and the options."""

    candidate: str
    options: E2EOptions


def _failed(job: Job, kind: str, status: Status, message: str) -> E2EResult:
    return E2EResult(options=job.options, passed=False, status=status, message=message, error_kind=kind)


def main(argv: list[str]) -> int:
    """Run the job of argv[1], write the result to argv[2]; exit 0 whenever a result was written."""
    from kopt.e2e import runner
    from kopt.errors import UsageError

    job = Job.model_validate_json(Path(argv[1]).read_text())
    try:
        res = runner.run(Path(job.candidate), job.options)
    except UsageError as e:
        res = _failed(job, "usage", Status.ok, str(e))
    except Exception as e:  # an error surfacing later (a bad kernel's async CUDA error): the run failed
        traceback.print_exc()
        first = str(e).splitlines()[0][:300] if str(e) else ""
        oom = "out of memory" in str(e).lower()
        res = _failed(job, "candidate", Status.oom if oom else Status.runtime_error,
                      f"the decode run failed: {type(e).__name__}: {first}")
    Path(argv[2]).write_text(res.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
