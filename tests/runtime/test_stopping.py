"""stop_requested(): SIGTERM becomes a stop request, agreed by every rank (real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

TWO_RANKS = textwrap.dedent("""
    import os, signal, sys
    import torch.distributed as dist
    import meshtrain_runtime as mr
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                            world_size=2)
    answers = [mr.stop_requested()]  # nobody was signalled yet
    if rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is told to stop
    answers.append(mr.stop_requested())
    print(rank, answers, flush=True)
    dist.destroy_process_group()
""")


def _python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sigterm_ends_a_script_that_does_not_watch_for_stops():
    code = ("import os, signal, time\nfrom meshtrain_runtime.stopping import install\n"
            "install()\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(30)\nprint('alive')")
    proc = _python(code)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM and "alive" not in out


def test_a_watching_script_sees_the_stop_and_keeps_running():
    code = ("import os, signal\nimport meshtrain_runtime as mr\n"
            "first = mr.stop_requested()\nos.kill(os.getpid(), signal.SIGTERM)\n"
            "print(first, mr.stop_requested())")
    proc = _python(code)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["False", "True"]


@pytest.mark.multiprocess
def test_every_rank_agrees_when_one_rank_was_signalled(tmp_path):
    store = str(tmp_path / "store")
    procs = [_python(TWO_RANKS, str(rank), store) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert sorted(out.strip() for out, _ in outputs) == ["0 [False, True]", "1 [False, True]"]
