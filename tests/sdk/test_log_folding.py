"""The live view folds tracebacks and C++/torchrun noise (meshtrain/log_folding.py)."""

from __future__ import annotations

from meshtrain.log_folding import LogFolder

PRIMARY = [
    "[algo-2 rank 2] Traceback (most recent call last):",
    '[algo-2 rank 2]   File "/opt/ml/code/train.py", line 9, in <module>',
    "[algo-2 rank 2]     check(lr)",
    "[algo-2 rank 2]     ^^^^^^^^^",
    "[algo-2 rank 2] ValueError: learning rate must be positive",
]
SECONDARY = [
    "[algo-1 rank 0] Traceback (most recent call last):",
    '[algo-1 rank 0]   File "/opt/ml/code/train.py", line 10, in <module>',
    "[algo-1 rank 0] RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer",
]
# what a successful TP run printed when algo-2's agent exited after the store's host
TCPSTORE = [
    "[algo-2] [W1126 12:00:00.000 TCPStore.cpp:125] [c10d] recvValueWithTimeout failed",
    "[algo-2] Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:6",
    "[algo-2] frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98",
    "[algo-2] frame #1: <unknown function> + 0x5d1e7a1 (0x7f in libtorch_cpu.so)",
]
ELASTIC = [
    "[algo-1] W1126 23:32:59.722000 20654 torch/distributed/elastic/multiprocessing/api.py:1028]"
    " Sending process 20754 closing signal SIGTERM",
    "[algo-1] E1126 23:32:59.873000 20654 torch/distributed/elastic/multiprocessing/api.py:1002]"
    " failed (exitcode: 1) local_rank: 0 (pid: 20752) of binary: /venv/bin/python",
]


def shown(folder: LogFolder, lines: list[str]) -> list[str]:
    return [out for line in lines for out in folder.feed(line)] + folder.flush()


def test_a_traceback_becomes_its_exception_line_with_the_command_for_the_rest():
    lines = ["step 1", *PRIMARY, "[algo-1 rank 0] step 2"]
    assert shown(LogFolder("job-1", full=False), lines) == [
        "step 1",
        "[algo-2 rank 2] ValueError: learning rate must be positive  (traceback: meshtrain logs "
        "job-1 --rank 2)",
        "[algo-1 rank 0] step 2",
    ]


def test_interleaved_ranks_are_folded_each_on_its_own():
    lines = [PRIMARY[0], SECONDARY[0], *PRIMARY[1:], *SECONDARY[1:]]
    assert shown(LogFolder("j", full=False), lines) == [
        "[algo-2 rank 2] ValueError: learning rate must be positive  (traceback: meshtrain logs "
        "j --rank 2)"]  # the peer's consequence is left to the failure reason


def test_a_consequence_printed_without_its_traceback_is_left_out_too():
    lines = [SECONDARY[-1], "[algo-1 rank 1] RuntimeError: the learning rate is negative"]
    assert shown(LogFolder("j", full=False), lines) == lines[1:]


def test_cpp_backtraces_and_torchrun_worker_lines_are_left_out():
    assert shown(LogFolder("j", full=False), [*TCPSTORE, *ELASTIC]) == [TCPSTORE[0]]


def test_a_cut_off_traceback_says_where_the_rest_is():
    assert shown(LogFolder("j", full=False), PRIMARY[:3]) == [
        "[algo-2 rank 2] (a traceback cut off: meshtrain logs j --rank 2)"]


def test_the_full_view_shows_every_line(monkeypatch):
    lines = [*PRIMARY, *SECONDARY, *TCPSTORE, *ELASTIC]
    assert shown(LogFolder("j", full=True), lines) == lines
    monkeypatch.setenv("MESHTRAIN_LOG_VIEW", "full")
    assert shown(LogFolder("j"), lines) == lines
