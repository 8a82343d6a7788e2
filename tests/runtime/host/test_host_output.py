"""What a host writes to the job's log, line by line: torchrun's copy of each rank's output in
whole lines (host/whole_lines.py, pinned against the installed torch), a rank's output handed
on a whole line at a time, tracebacks that name the user's source folder, phase lines."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from meshtrain.contract import env as names
from meshtrain.contract.phases import Phase, parse_phase_line
from meshtrain_runtime.host import whole_lines
from meshtrain_runtime.host.rank_entry import in_source_dir, user_traceback


class Writes(io.StringIO):
    """A stream that keeps every write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def _tail(tmp_path: Path) -> tuple[Path, Writes, threading.Event, threading.Thread]:
    log, dst, finished = tmp_path / "rank.log", Writes(), threading.Event()
    log.write_text("")
    thread = threading.Thread(target=whole_lines.tail_whole_lines,
                              args=("[algo-1 rank 0] ", str(log), dst, finished, 0.01))
    thread.start()
    return log, dst, finished, thread


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_a_half_written_line_waits_for_its_end(tmp_path):
    log, dst, finished, thread = _tail(tmp_path)
    with open(log, "a") as rank:
        rank.write("[meshtrain metric] train:loss=2.5")
        rank.flush()
        time.sleep(0.2)  # many polls of the tailer see the half line: it must hold it
        assert dst.calls == []
        rank.write(" step=57\nnext line\nno newline at the end")
    _wait_for(lambda: len(dst.calls) == 2)
    finished.set()
    thread.join(timeout=10)
    assert dst.calls == ["[algo-1 rank 0] [meshtrain metric] train:loss=2.5 step=57\n",
                         "[algo-1 rank 0] next line\n",
                         "[algo-1 rank 0] no newline at the end\n"]  # the rest, at the end


def test_the_installed_torchrun_copies_whole_lines(tmp_path, monkeypatch):
    """The guard: torch's TailLog still looks its tailer up by name with the arguments this
    replaces, so install() takes effect (and a TailLog run shows it)."""
    from torch.distributed.elastic.multiprocessing import tail_log

    monkeypatch.setattr(tail_log, "tail_logfile", tail_log.tail_logfile)  # undone afterwards
    assert whole_lines.install()
    assert tail_log.tail_logfile is whole_lines.tail_whole_lines
    log, dst = tmp_path / "0.log", Writes()
    log.write_text("half")
    tailer = tail_log.TailLog("trainer", {0: str(log)}, dst, {0: "[algo-1 rank 0] "},
                              interval_sec=0.01).start()
    time.sleep(0.2)
    assert dst.calls == []
    with open(log, "a") as rank:
        rank.write(" and whole\n")
    _wait_for(lambda: dst.calls == ["[algo-1 rank 0] half and whole\n"])
    tailer.stop()


def test_install_leaves_torch_alone_when_its_tailer_changed(monkeypatch):
    from torch.distributed.elastic.multiprocessing import tail_log

    def other_tailer(header, file, dst):  # another signature: not the function replaced here
        return None

    monkeypatch.setattr(tail_log, "tail_logfile", other_tailer)
    assert not whole_lines.install()
    assert tail_log.tail_logfile is other_tailer


def test_a_rank_hands_on_whole_lines_only(tmp_path):
    """rank_entry under PYTHONUNBUFFERED (as the hosts run ranks): what the script printed is
    in the pipe once its line ends, and a line still being written is not. The script says on
    stderr when it has printed a whole line and half of the next, then waits: the pipe then
    holds exactly the whole line (unbuffered, it held the half too)."""
    script = tmp_path / "train.py"
    script.write_text("import sys\nfrom meshtrain_runtime import metrics\n"
                      "print('x' * 3000)\nsys.stdout.write('half')\n"
                      "print('ready', file=sys.stderr)\nsys.stdin.readline()\n"
                      "print(' and its end')\nmetrics.log_metric('train:loss', 2.5, step=1)\n")
    proc = subprocess.Popen([sys.executable, "-m", "meshtrain_runtime.host.rank_entry",
                             str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "RANK": "0"})
    try:
        assert proc.stderr.readline() == b"ready\n"
        assert os.read(proc.stdout.fileno(), 65536) == b"x" * 3000 + b"\n"
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        rest = proc.stdout.read()
    finally:
        proc.wait(timeout=60)
    assert rest == b"half and its end\n[meshtrain metric] train:loss=2.5 step=1\n"


def test_tracebacks_name_the_users_source_folder(tmp_path, monkeypatch):
    code = tmp_path / "job" / "opt" / "ml" / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text("def main():\n    raise ValueError('bad lr')\n")
    monkeypatch.setenv(names.SAGEMAKER_BASE_DIR, str(tmp_path / "job" / "opt" / "ml"))
    namespace: dict = {}
    exec(compile((code / "train.py").read_text(), str(code / "train.py"), "exec"), namespace)
    try:
        namespace["main"]()
    except ValueError as error:
        raised = error
    monkeypatch.delenv(names.MESHTRAIN_SOURCE_DIR, raising=False)
    assert f'File "{code}/train.py", line 2' in user_traceback(raised)  # no source known
    monkeypatch.setenv(names.MESHTRAIN_SOURCE_DIR, "/home/me/project/")
    text = user_traceback(raised)
    assert 'File "/home/me/project/train.py", line 2, in main' in text
    assert "raise ValueError('bad lr')" in text  # the line is still read from the job's copy
    assert str(code) not in text
    assert in_source_dir(f"see {code}/train.py") == f"see {code}/train.py"  # frames only


def test_phase_lines_are_printed_by_rank_zero_of_a_job_only(capsys, monkeypatch):
    from meshtrain_runtime.host.phases import announce_on_rank_zero

    monkeypatch.delenv(names.SM_CURRENT_HOST, raising=False)
    announce_on_rank_zero(Phase.RENDEZVOUS, "outside a job")
    monkeypatch.setenv(names.SM_CURRENT_HOST, "algo-1")
    monkeypatch.setenv("RANK", "1")
    announce_on_rank_zero(Phase.RENDEZVOUS, "rank 1")
    monkeypatch.setenv("RANK", "0")
    announce_on_rank_zero(Phase.RENDEZVOUS, "4 ranks joined (gloo)")
    lines = capsys.readouterr().out.splitlines()
    assert [parse_phase_line(line) for line in lines] == [
        (Phase.RENDEZVOUS, "4 ranks joined (gloo)")]


@pytest.fixture(autouse=True)
def _no_torch_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
