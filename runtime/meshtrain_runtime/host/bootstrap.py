"""Host entry point: read the /opt/ml contract, run torchrun (or python), report the outcome.

``python -m meshtrain_runtime.host.bootstrap`` (the container's ``train``) does what the SageMaker
training toolkit does: provision /opt/ml/code from sourcedir.tar.gz, export the SM_* variables,
start ``torchrun`` with static rendezvous (algo-1 is node 0), and on exit write
/opt/ml/output/success or /opt/ml/output/failure. Exit codes: 0 success, 1 user error, 2
framework error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from pathlib import Path

from meshtrain.contract import env as names
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.failures import (
    HOST_RECORD,
    HOST_STOPPED_EXIT_CODE,
    OOM_INFO,
    RankFailure,
    describe_consequences,
    killed_by,
    pick_root_cause,
    write_host_record,
)
from meshtrain.contract.paths import OptMLPaths
from meshtrain.contract.phases import Phase
from meshtrain.contract.private_files import restrict_umask
from meshtrain_runtime.host import fork_server, rank_entry, rank_preload, rendezvous
from meshtrain_runtime.host.agent_entry import AGENT_FAILURES
from meshtrain_runtime.host.contract import PYTHON, HostContract, build_sm_env, python_path
from meshtrain_runtime.host.lifeline import die_with_parent
from meshtrain_runtime.host.phases import announce
from meshtrain_runtime.host.provision import ProvisionError, provision_code
from meshtrain_runtime.host.watchdog import HANG_TIMEOUT_ENV

USER_ERROR = 1
FRAMEWORK_ERROR = 2
TAIL_LINES = 60
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*$", re.MULTILINE)


def host_work_dir(paths: OptMLPaths) -> Path:
    """Where this host keeps torchrun's logs and the failure records (never $TMPDIR):
    the local backend's per-host job folder, else /opt/ml/output/meshtrain."""
    override = os.environ.get(names.MESHTRAIN_HOST_WORK_DIR)
    return Path(override) if override else paths.output_dir / "meshtrain"


def build_command(contract: HostContract, script: Path, log_dir: Path | None = None) -> list[str]:
    """The per-host command, as the toolkit's TorchDistributed / Process runners build it.

    torchrun runs through `meshtrain_runtime.host.agent_entry` (same arguments), which dies with
    this bootstrap and records how each failed rank ended.
    """
    wrapped = ["-m", "meshtrain_runtime.host.rank_entry", str(script), *contract.user_args()]
    if not contract.torch_distributed:
        return [PYTHON, *wrapped]
    command = [PYTHON, "-m", "meshtrain_runtime.host.agent_entry",
               "--nproc-per-node", str(contract.processes_per_host)]
    # a fault-tolerant job: this host's torchrun world is its replica group's hosts only
    world = contract.world_hosts
    elastic = rendezvous.elastic_arguments(os.environ, _rendezvous_name(contract), len(world))
    if elastic is not None:
        command += elastic
    else:
        command += ["--nnodes", str(len(world))]
        if len(world) > 1 or names.MESHTRAIN_MASTER_PORT in os.environ:
            command += ["--master-addr", contract.master_addr,
                        "--master-port", str(contract.master_port),
                        "--node-rank", str(contract.node_rank)]
    log_dir = log_dir or host_work_dir(contract.paths) / "torchrun"
    if fork_server.forks_ranks(contract.num_gpus, os.environ):  # ranks forked, imports done
        wrapped = [str(Path(rank_entry.__file__)), *wrapped[2:]]
        command += ["--start-method", fork_server.FORKSERVER, "--run-path"]
    return [*command, "--tee", "3", "--log-dir", str(log_dir), *wrapped]


def launch_text(contract: HostContract) -> str:
    """What this host starts, for its launch phase line."""
    hosts = len(contract.world_hosts)
    if not contract.torch_distributed:
        return f"{contract.current_host} runs {contract.entry_point} (one process)"
    return (f"{contract.current_host} starts torchrun: {contract.processes_per_host} "
            f"process{'es' if contract.processes_per_host != 1 else ''} on each of {hosts} "
            f"host{'s' if hosts != 1 else ''}")


def _rendezvous_name(contract: HostContract) -> str:
    """The job's rendezvous id; each replica group of a fault-tolerant job meets on its own."""
    group = contract.replica_group
    return contract.job_name if group is None else f"{contract.job_name}-group-{group}"


def build_environment(contract: HostContract, error_dir: Path,
                      script: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if script is not None and contract.torch_distributed and fork_server.forks_ranks(
            contract.num_gpus, os.environ):
        env[names.MESHTRAIN_RANK_PRELOAD] = ",".join(rank_preload.preload_modules(script))
    env.update(build_sm_env(contract))
    env["PYTHONPATH"] = python_path(contract.code_dir)
    env[names.MESHTRAIN_RANK_ERROR_DIR] = str(error_dir)
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = f"[{contract.current_host} rank ${{rank}}] "
    threads = max(1, (os.cpu_count() or 1) // contract.processes_per_host)
    env.setdefault("OMP_NUM_THREADS", str(threads))  # also silences torchrun's banner
    env.setdefault("PYTHONUNBUFFERED", "1")
    torch_distributed = contract.distribution().torch_distributed
    grace = str(torch_distributed.stop_grace_seconds)
    env[names.MESHTRAIN_STOP_GRACE_SECONDS] = grace
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = grace  # torchrun: SIGTERM to the ranks -> SIGKILL
    hang_timeout = torch_distributed.hang_timeout
    if hang_timeout:
        env[HANG_TIMEOUT_ENV] = str(hang_timeout)
    return env


class StopForwarder:
    """SIGTERM handler for the bootstrap's whole life: forward the signal to the running child
    and remember it, so the bootstrap still writes its failure record before it exits."""

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.received: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.received = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


def run_streaming(command: list[str], env: dict[str, str], cwd: Path,
                  forwarder: StopForwarder | None = None) -> tuple[int, str]:
    """Run `command`, echo its output, forward stop signals; return (exit code, last lines)."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    forwarder = forwarder or StopForwarder()
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    forwarder.child = proc
    if forwarder.received is not None:  # a stop that came while the child was starting
        proc.send_signal(forwarder.received)
    for raw in iter(proc.stdout.readline, b""):
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        tail.append(raw.decode(errors="replace"))
    return proc.wait(), "".join(tail)


def _read_json_files(paths: list[Path]) -> list:
    found = []
    for path in paths:
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def exited(host: str, rank: int | None, code: int, when: float, tail: str) -> RankFailure:
    """A process that exited non-zero without a record: its last exception line, if any."""
    matches = [m.group(0).strip() for m in EXCEPTION_LINE.finditer(tail)]
    message = f"exited with code {code}" + (f": {matches[-1]}" if matches else "")
    return RankFailure(host, rank, when, "exit", message, tail)


def collect_failures(host: str, error_dir: Path, code: int, tail: str,
                     stopped_by: int | None, rank_of_child: int | None) -> list[RankFailure]:
    """Every failure this host saw: ranks that raised (rank-*.json, written by rank_entry),
    ranks the agent saw die (agent-failures.json), else the launcher itself."""
    failures: dict[int, RankFailure] = {}
    for report in _read_json_files(sorted(error_dir.glob("rank-*.json"))):
        failures[report["rank"]] = RankFailure(host, report["rank"], report["time"], "exception",
                                               report["message"], report.get("traceback", ""))
    for records in _read_json_files([error_dir / AGENT_FAILURES]):
        for item in records:
            rank, exitcode = item["rank"], item["exitcode"]
            if rank in failures:
                continue
            if exitcode < 0:
                failures[rank] = killed_by(host, rank, -exitcode, item["time"])
            else:
                failures[rank] = exited(host, rank, exitcode, item["time"], tail)
    if failures:
        return sorted(failures.values(), key=lambda f: f.time)
    now = time.time()
    if stopped_by is not None:
        return [killed_by(host, None, stopped_by, now, verb="stopped by")]
    if code < 0:
        return [killed_by(host, rank_of_child, -code, now)]
    return [exited(host, rank_of_child, code, now, tail)]


def failure_message(code: int, command: list[str], root: RankFailure | None, tail: str,
                    others: list[RankFailure] = ()) -> str:
    """The toolkit's ExecuteUserScriptError text: who failed and how first, then the
    consequences and the command, the traceback (or the output's last lines) last, so the
    1024-character cut of the failure reason only ever drops the end of the traceback."""
    killed = (root is not None and root.signal == "SIGKILL") or code in (137, -9) or re.search(
        r"exitcode\s*:\s*-9\b", tail) is not None
    lines = ["ExecuteUserScriptError:", f"ExitCode {code}"]
    if root is not None:
        lines.append(f'ErrorMessage "{root.headline}"')
    if killed:
        lines.append(f'ExtraInfo "{OOM_INFO}"')
    if others:
        lines.append(describe_consequences(list(others)))
    lines.append(f'Command "{shlex.join(command)}"')
    detail = root.detail if root is not None and root.detail else tail
    return "\n".join(lines) + "\n" + detail.strip()


def write_failure(paths: OptMLPaths, message: str) -> None:
    """Write the failure file unless the script already wrote its own reason (which wins).
    A full disk is reported on stderr, which the local supervisor keeps the end of."""
    try:
        paths.output_dir.mkdir(parents=True, exist_ok=True)
        with open(paths.failure_file, "x") as handle:
            handle.write(message)
    except FileExistsError:
        pass
    except OSError as error:
        print(f"meshtrain: could not write {paths.failure_file}: {error}\n{message[:500]}",
              file=sys.stderr)


def report_failure(paths: OptMLPaths, host: str, code: int, failures: list[RankFailure],
                   message: str) -> None:
    """The failure file (SageMaker's) and the structured record (for the local client)."""
    write_failure(paths, message)
    record = host_work_dir(paths) / HOST_RECORD
    try:
        write_host_record(record, host, code, failures)
    except OSError as error:
        print(f"meshtrain: could not write {record}: {error}", file=sys.stderr)


def train(paths: OptMLPaths, forwarder: StopForwarder | None = None) -> int:
    """Run the user's job on this host; return the exit code."""
    forwarder = forwarder or StopForwarder()
    contract = HostContract.read(paths)
    if not contract.entry_point:
        raise ConfigError("hyperparameters.json has no sagemaker_program: nothing to run.")
    for directory in (paths.model_dir, paths.output_data_dir, paths.checkpoints_dir):
        directory.mkdir(parents=True, exist_ok=True)  # SageMaker creates them for the script
    script = provision_code(contract)
    work_dir = host_work_dir(paths)
    error_dir = work_dir / "rank-errors"
    error_dir.mkdir(parents=True, exist_ok=True)
    command = build_command(contract, script, work_dir / "torchrun")
    if contract.torch_distributed and len(contract.world_hosts) > 1:
        elastic = rendezvous.elastic_arguments(os.environ, _rendezvous_name(contract),
                                               len(contract.world_hosts))
        rendezvous.wait_until_resolvable(rendezvous.endpoint_host(elastic, contract.master_addr))
    announce(Phase.LAUNCH, launch_text(contract))
    environment = build_environment(contract, error_dir, script)
    with fork_server.server_folder(environment):
        code, tail = run_streaming(command, environment, contract.code_dir, forwarder)
    if code == 0 and forwarder.received is None:
        paths.output_dir.mkdir(parents=True, exist_ok=True)
        paths.success_file.touch()
        return 0
    child_rank = None if contract.torch_distributed else 0
    failures = collect_failures(contract.current_host, error_dir, code, tail,
                                forwarder.received, child_rank)
    root, others = pick_root_cause(failures)
    report_failure(paths, contract.current_host, code, failures,
                   failure_message(code, command, root, tail, others))
    if forwarder.received == signal.SIGTERM:  # stopped (a reclaimed instance), not failed
        return HOST_STOPPED_EXIT_CODE
    return USER_ERROR


def _host_failure(paths: OptMLPaths, kind: str, text: str) -> None:
    host = os.environ.get(names.SM_CURRENT_HOST) or "algo-1"
    with contextlib.suppress(Exception):  # the config itself may be what is broken
        host = HostContract.read(paths).current_host
    headline = f"{kind}: {text.splitlines()[0]}" if text else kind
    failure = RankFailure(host, None, time.time(), "host", headline, text)
    report_failure(paths, host, USER_ERROR, [failure], f"{kind}: {text}")


def main() -> None:
    die_with_parent()
    restrict_umask()  # what the host and the user's script write is the job owner's alone
    forwarder = StopForwarder()
    previous = signal.signal(signal.SIGTERM, forwarder)
    paths = OptMLPaths.from_env()
    try:
        code = train(paths, forwarder)
    except (ConfigError, ProvisionError, rendezvous.RendezvousError) as error:
        _host_failure(paths, "ClientError", str(error))
        print(f"meshtrain: {error}", file=sys.stderr)
        code = USER_ERROR
    except Exception as error:
        _host_failure(paths, "Framework Error", f"{type(error).__name__}: {error}\n"
                                                f"{traceback.format_exc()}")
        traceback.print_exc()
        code = FRAMEWORK_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
