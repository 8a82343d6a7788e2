"""torch_distributed.hang_timeout: a rank that stops making progress ends the job with a reason
that names it and shows where it is stuck, and leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtrain import Estimator, JobFailedError

SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


def test_a_sleeping_rank_is_named_with_its_stuck_frame(tmp_path):
    estimator = Estimator("hang_on_rank1.py", source_dir=str(SCRIPTS), jobs_dir=str(tmp_path),
                          max_run=300, distribution={"torch_distributed": {
                              "enabled": True, "processes_per_host": 2, "hang_timeout": 10}})
    with pytest.raises(JobFailedError) as failure:
        estimator.fit(job_name="hang", logs=False)
    reason = str(failure.value)
    # the root cause is the rank the other waits for, not the one waiting in the collective
    assert "rank 1 on algo-1: Hang: no progress for 10 s and not in a collective" in reason
    assert "time.sleep(int(os.environ.get(\"SLEEP_SECONDS\", \"600\")))" in reason
    assert "hang_on_rank1.py" in reason
    assert "Failed as a consequence: rank 0 on algo-1" in reason
    assert "MaxRuntimeExceeded" not in reason
    job = estimator.latest_training_job
    assert job.processes() == []
    log = "\n".join(job.log_lines())
    assert "rank 1 step 1" in log and "rank 1 step 2" not in log
