"""Jobs on a real two-node Slurm cluster (tests/slurm/conftest.py): the quickstart job's losses
equal the same job on local processes, by fit() and by a rendered script submitted with sbatch
by hand; a failing rank's root cause names its rank, Slurm node and host; stop() is scancel.

The jobs of one module start together and share the cluster (each costs real seconds).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from job_privacy import (
    open_directory,
    open_modes,
    readable_by_other_user,
    require_other_user,
    umask,
)

from meshtrain import Estimator
from meshtrain.backends.slurm.backend import SlurmBackend
from meshtrain.cli import main as cli_main
from meshtrain.contract.errors import JobFailedError

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess, pytest.mark.e2e]

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
CORPUS = QUICKSTART.parent / "data" / "corpus"  # the quickstart's `train` channel
SCRIPTS = Path(__file__).parent / "scripts"
EXAMPLE = QUICKSTART.parent / "slurm" / "launch.py"
STEPS = 4
DISTRIBUTION = {
    "torch_distributed": {"enabled": True, "processes_per_host": 2},
    "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
        "hybrid_shard_degree": 2}}},
}
METRIC = re.compile(r"\[algo-1 rank 0\] \[meshtrain metric\] train:loss=(\S+) step=(\d+)")


def losses(job_dir: Path) -> dict[int, float]:
    """Per-step losses rank 0 logged in the job's merged log."""
    text = (job_dir / "job.log").read_text()
    return {int(step): float(loss) for loss, step in METRIC.findall(text)}


def quickstart(instance_type: str, jobs_dir: Path, **options) -> Estimator:
    return Estimator(entry_point="train.py", source_dir=str(QUICKSTART),
                     instance_type=instance_type, instance_count=2,
                     hyperparameters={"steps": STEPS, "lr": 3e-3}, distribution=DISTRIBUTION,
                     jobs_dir=str(jobs_dir), environment={"OMP_NUM_THREADS": "1"}, **options)


@pytest.fixture(scope="module")
def quickstart_runs(slurm_cluster, tmp_path_factory):
    """The quickstart job three ways at once: fit() on Slurm, a rendered script sbatch'ed by
    hand, fit() on local processes; each one's job directory once it has ended. MESHTRAIN_HOME
    is made by meshtrain in a 0755 directory (a shared filesystem's home), under umask 022."""
    require_other_user()
    with open_directory() as shared, umask(0o022):
        yield _quickstart_runs(shared / "home", tmp_path_factory)


def _quickstart_runs(home: Path, tmp_path_factory) -> dict:
    jobs_dir = home / "jobs"
    example = subprocess.Popen(  # examples/slurm/launch.py: fit() on Slurm
        [sys.executable, str(EXAMPLE), "--job-name", "on-slurm"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, "MESHTRAIN_HOME": str(home)})
    while not (jobs_dir / "on-slurm").exists() and example.poll() is None:
        time.sleep(0.2)
    by_hand = _render(jobs_dir, tmp_path_factory.mktemp("render"))
    local = quickstart("local", jobs_dir)
    local.fit(inputs={"train": str(CORPUS)}, wait=True, job_name="on-local")
    output, _ = example.communicate(timeout=600)
    SlurmBackend(jobs_dir=jobs_dir).attach(by_hand).wait(logs=False)
    return {"jobs_dir": jobs_dir, "example": (example.returncode, output), "local": local,
            "by_hand": by_hand}


def _render(jobs_dir: Path, out: Path) -> str:
    import contextlib
    import io
    import json

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli_main(["slurm", "render", "train.py", "--source-dir", str(QUICKSTART),
                         "--instance-count", "2", "--distribution", json.dumps(DISTRIBUTION),
                         "--hyperparameters", json.dumps({"steps": STEPS, "lr": 3e-3}),
                         "--input", f"train={CORPUS}",
                         "--job-name", "by-hand", "--jobs-dir", str(jobs_dir)])
    assert code == 0, buffer.getvalue()
    script = out / "job.sbatch"
    script.write_text(buffer.getvalue())
    submitted = subprocess.run(["sbatch", str(script)], capture_output=True, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert submitted.returncode == 0, submitted.stderr
    return "by-hand"


def test_quickstart_on_slurm_matches_local_and_leaves_the_model(quickstart_runs):
    jobs_dir = quickstart_runs["jobs_dir"]
    on_local, on_slurm = losses(jobs_dir / "on-local"), losses(jobs_dir / "on-slurm")
    assert sorted(on_local) == list(range(STEPS)), on_local
    assert sorted(on_slurm) == sorted(on_local)
    for step, loss in on_local.items():
        assert abs(on_slurm[step] - loss) <= 1e-6, (step, on_slurm[step], loss)
    code, output = quickstart_runs["example"]
    assert code == 0, output
    model = re.search(r"Model artifacts: (\S+)", output).group(1)
    assert model == f"file://{jobs_dir}/on-slurm/output/model.tar.gz"
    with tarfile.open(model.removeprefix("file://")) as tar:
        assert "model.pt" in tar.getnames()
    # each host ran on its own Slurm node, recorded beside the job
    nodes = {host: (jobs_dir / "on-slurm" / "nodes" / host).read_text() for host in
             ("algo-1", "algo-2")}
    assert nodes == {"algo-1": "n1", "algo-2": "n2"}


def test_a_rendered_script_submitted_by_hand_trains_the_same_job(quickstart_runs):
    jobs_dir = quickstart_runs["jobs_dir"]
    job = SlurmBackend(jobs_dir=jobs_dir).attach(quickstart_runs["by_hand"])
    assert job.describe()["TrainingJobStatus"] == "Completed"
    script = (jobs_dir / "by-hand" / "job.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --requeue",
                 "#SBATCH --time=1440"):  # max_run's default, 24 h, is --time in minutes
        assert line in script.splitlines(), (line, script)
    by_hand, on_local = losses(jobs_dir / "by-hand"), losses(jobs_dir / "on-local")
    assert sorted(by_hand) == sorted(on_local) == list(range(STEPS))
    for step, loss in on_local.items():
        assert abs(by_hand[step] - loss) <= 1e-6, (step, by_hand[step], loss)


def test_slurm_jobs_are_listed_and_found_by_name(quickstart_runs, capsys):
    jobs_dir = str(quickstart_runs["jobs_dir"])
    assert cli_main(["list", "--jobs-dir", jobs_dir]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"^on-slurm\s+Completed", listing, re.MULTILINE), listing
    assert re.search(r"^by-hand\s+Completed", listing, re.MULTILINE), listing
    attached = Estimator.attach("on-slurm", jobs_dir=jobs_dir)
    assert attached.model_data.endswith("on-slurm/output/model.tar.gz")
    assert cli_main(["logs", "on-slurm", "--jobs-dir", jobs_dir]) == 0
    shown = capsys.readouterr().out
    assert shown == (quickstart_runs["jobs_dir"] / "on-slurm" / "job.log").read_text()
    assert re.search(r"^\[algo-1 rank 0\] \[meshtrain metric\] train:loss=\S+ step=0$", shown,
                     re.MULTILINE), shown


def test_a_slurm_jobs_files_on_the_shared_directory_are_its_owners_alone(quickstart_runs):
    """Issue 43: as another user, nothing of the jobs is readable (MESHTRAIN_HOME is 0700, and
    every file and directory the client, the batch step and the nodes wrote is owner-only);
    spec.json keeps the environment's names, not its values (which reached the nodes through
    sbatch's environment, or the script rendered by hand)."""
    home = quickstart_runs["jobs_dir"].parent
    assert readable_by_other_user(home) == []
    for job in ("on-slurm", "by-hand"):
        assert open_modes(home / "jobs" / job) == []
    spec = json.loads((home / "jobs" / "on-slurm" / "spec.json").read_text())
    assert spec["environment"] == {"OMP_NUM_THREADS": "<masked>"}
    script = (home / "jobs" / "by-hand" / "job.sbatch").read_text()
    assert "umask 077" in script and "export MESHTRAIN_JOB_ENVIRONMENT='{}'" in script


def _squeue(name: str) -> str:
    return subprocess.run(["squeue", "-h", "-n", name], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_failing_rank_is_named_and_stop_is_scancel(slurm_cluster, tmp_path):
    """Two jobs at once: rank 2 raises on the second node; another job is stopped mid-run."""
    def job(script: str) -> Estimator:
        return Estimator(entry_point=script, source_dir=str(SCRIPTS), instance_type="slurm",
                         instance_count=2, jobs_dir=str(tmp_path),
                         distribution={"torch_distributed": {"enabled": True,
                                                             "processes_per_host": 2}})
    failing, ticking = job("fails_on_rank2.py"), job("ticks.py")
    failed_job = failing.fit(wait=False, job_name="fails")
    running = ticking.fit(wait=False, job_name="ticks")
    with pytest.raises(JobFailedError) as failed:
        failed_job.wait(logs=False)
    reason = failed.value.reason
    for part in ("rank 2", "algo-2", "Slurm node n2", "ValueError", "bad shard 7 on purpose"):
        assert part in reason, (part, reason)
    # the hosts' output merged into the job log, each line prefixed by its host and rank
    assert re.search(r"^\[algo-2 rank 2\] .*ValueError: bad shard 7", (
        tmp_path / "fails" / "job.log").read_text(), re.MULTILINE)
    log = tmp_path / "ticks" / "job.log"
    deadline = time.monotonic() + 120
    while "tick 2 rank 3" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "tick 2 rank 3" in log.read_text()
    started = time.monotonic()
    running.stop()
    assert running.describe()["TrainingJobStatus"] == "Stopped"
    assert time.monotonic() - started < 60
    deadline = time.monotonic() + 30
    while (running.processes() or _squeue("ticks") or _squeue("fails")) and (
            time.monotonic() < deadline):
        time.sleep(0.5)
    assert running.processes() == [] and failed_job.processes() == []
    assert _squeue("ticks") == "" and _squeue("fails") == ""
