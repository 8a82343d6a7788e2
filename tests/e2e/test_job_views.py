"""What a user sees of a real 2 hosts x 2 processes job: fit()'s plain output with its progress,
`meshtrain status` with the progress, `meshtrain logs --host/--rank` and `meshtrain plot`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from meshtrain import Estimator
from meshtrain.cli import main

SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def fit_output(tmp_path_factory) -> tuple[str, Path, str]:
    jobs = tmp_path_factory.mktemp("jobs")
    estimator = Estimator(str(SCRIPTS / "print_metrics.py"), instance_count=2, jobs_dir=str(jobs),
                          hyperparameters={"max_steps": 3},
                          distribution={"torch_distributed": {"enabled": True,
                                                              "processes_per_host": 2}})
    shown = io.StringIO()  # not a terminal: fit() must print plain lines
    with contextlib.redirect_stdout(shown):
        estimator.fit(job_name="views")
    return "views", jobs, shown.getvalue()


@pytest.fixture
def job(fit_output) -> tuple[str, Path]:
    return fit_output[0], fit_output[1]


def test_fit_prints_the_log_and_a_plain_progress_line(fit_output):
    _, _, shown = fit_output
    assert "\x1b" not in shown and "\r" not in shown  # no control characters off a terminal
    lines = shown.splitlines()
    assert "[algo-2 rank 3] hello from rank 3 on algo-2" in lines
    final = "[meshtrain] views: step 2/3 · loss 1.0000 · 2,048 tokens/s · ran "  # + H:MM:SS
    assert any(line.startswith(final) for line in lines)
    assert lines[-1] == "===== Job Completed ====="


def test_status_reports_the_progress_the_metric_lines_show(job, capsys):
    name, jobs = job
    capsys.readouterr()
    assert main(["status", name, "--jobs-dir", str(jobs)]) == 0
    progress = json.loads(capsys.readouterr().out)["Progress"]
    assert progress == {"Step": 2, "TotalSteps": 3, "Loss": 1.0, "TokensPerSecond": 2048.0,
                        "MFU": None, "EtaSeconds": None,
                        "Summary": "step 2/3 · loss 1.0000 · 2,048 tokens/s"}


def _logs(capsys, job, *flags: str) -> list[str]:
    name, jobs = job
    capsys.readouterr()
    assert main(["logs", name, "--jobs-dir", str(jobs), *flags]) == 0
    return capsys.readouterr().out.splitlines()


def test_logs_filter_by_host_and_rank(job, capsys):
    everything = _logs(capsys, job)
    assert {f"hello from rank {r}" for r in range(4)} <= {
        line.split("] ", 1)[-1].rsplit(" on ", 1)[0] for line in everything}
    host = _logs(capsys, job, "--host", "algo-2")
    assert host and all(line.startswith(("[algo-2]", "[algo-2 ")) for line in host)
    assert any("hello from rank 2 on algo-2" in line for line in host)
    assert not any("hello from rank 0" in line for line in host)
    rank = _logs(capsys, job, "--rank", "3")
    assert rank == ["[algo-2 rank 3] hello from rank 3 on algo-2"]
    assert _logs(capsys, job, "--host", "algo-1", "--rank", "3") == []
    # an ended job: no wait, and the outcome last (issue 35: `logs -f` ends with it)
    assert _logs(capsys, job, "--follow", "--rank", "3") == [*rank, "===== Job Completed ====="]


def test_plot_writes_the_jobs_loss_curve(job, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    name, jobs = job
    output = tmp_path / "loss.png"
    assert main(["plot", name, "--jobs-dir", str(jobs), "-o", str(output)]) == 0
    assert f"wrote {output}" in capsys.readouterr().out
    with Image.open(output) as image:
        assert image.text["Title"] == name
        assert image.text["Description"] == "loss vs step; tokens/s vs step"
    assert main(["plot", name, "--jobs-dir", str(jobs), "-o", str(tmp_path / "x.jpg")]) == 2
    assert "writes PNG files" in capsys.readouterr().err
