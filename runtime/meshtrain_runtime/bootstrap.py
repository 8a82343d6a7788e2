"""Host entry point: read the /opt/ml contract, run torchrun (or python), report the outcome.

``python -m meshtrain_runtime.bootstrap`` (the container's ``train``) does what the SageMaker
training toolkit does: provision /opt/ml/code from sourcedir.tar.gz, export the SM_* variables,
start ``torchrun`` with static rendezvous (algo-1 is node 0), and on exit write
/opt/ml/output/success or /opt/ml/output/failure. Exit codes: 0 success, 1 user error, 2
framework error.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import traceback
from collections import deque
from pathlib import Path

from meshtrain.contract import env as names
from meshtrain.contract.paths import OptMLPaths
from meshtrain.errors import ConfigError
from meshtrain_runtime.host import PYTHON, HostContract, build_sm_env, python_path
from meshtrain_runtime.provision import ProvisionError, provision_code

USER_ERROR = 1
FRAMEWORK_ERROR = 2
TAIL_LINES = 60
OOM_INFO = "OutOfMemory: Process killed by SIGKILL (signal 9)"


def build_command(contract: HostContract, script: Path) -> list[str]:
    """The per-host command, as the toolkit's TorchDistributed / Process runners build it."""
    wrapped = ["-m", "meshtrain_runtime.rank_entry", str(script), *contract.user_args()]
    if not contract.torch_distributed:
        return [PYTHON, *wrapped]
    command = [PYTHON, "-m", "torch.distributed.run",
               "--nnodes", str(len(contract.hosts)),
               "--nproc-per-node", str(contract.processes_per_host)]
    if len(contract.hosts) > 1 or names.MESHTRAIN_MASTER_PORT in os.environ:
        command += ["--master-addr", contract.master_addr,
                    "--master-port", str(contract.master_port),
                    "--node-rank", str(contract.host_rank)]
    return [*command, "--tee", "3", "--log-dir", tempfile.mkdtemp(prefix="meshtrain-torchrun-"),
            *wrapped]


def build_environment(contract: HostContract, error_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(build_sm_env(contract))
    env["PYTHONPATH"] = python_path(contract.paths.code_dir)
    env[names.MESHTRAIN_RANK_ERROR_DIR] = str(error_dir)
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = f"[{contract.current_host} rank ${{rank}}] "
    threads = max(1, (os.cpu_count() or 1) // contract.processes_per_host)
    env.setdefault("OMP_NUM_THREADS", str(threads))  # also silences torchrun's banner
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_streaming(command: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run `command`, echo its output, forward SIGTERM; return (exit code, last lines)."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    try:
        for raw in iter(proc.stdout.readline, b""):
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            tail.append(raw.decode(errors="replace"))
        return proc.wait(), "".join(tail)
    finally:
        signal.signal(signal.SIGTERM, previous)


def first_rank_error(error_dir: Path) -> dict | None:
    """The earliest failure any rank of this host recorded (the root cause, not the fallout)."""
    reports = []
    for path in error_dir.glob("rank-*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return min(reports, key=lambda r: r["time"]) if reports else None


def failure_message(code: int, command: list[str], error: dict | None, tail: str) -> str:
    """The toolkit's ExecuteUserScriptError text, with the failing rank's error first."""
    if error:
        where = f"rank {error['rank']} on {error['host']}"
        detail = f"{where}: {error['message']}\n{error['traceback']}"
    else:
        detail = tail
    killed = code in (137, -9) or re.search(r"exitcode\s*:\s*-9\b", tail) is not None
    extra = f'ExtraInfo "{OOM_INFO}"\n' if killed else ""
    return (f"ExecuteUserScriptError:\nExitCode {code}\nErrorMessage \"{detail.strip()}\"\n"
            f"{extra}Command \"{shlex.join(command)}\"")


def write_failure(paths: OptMLPaths, message: str) -> None:
    """Write the failure file unless the script already wrote its own reason (which wins)."""
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(paths.failure_file, "x") as handle:
            handle.write(message)
    except FileExistsError:
        pass


def train(paths: OptMLPaths) -> int:
    """Run the user's job on this host; return the exit code."""
    contract = HostContract.read(paths)
    if not contract.entry_point:
        raise ConfigError("hyperparameters.json has no sagemaker_program: nothing to run.")
    for directory in (paths.model_dir, paths.output_data_dir, paths.checkpoints_dir):
        directory.mkdir(parents=True, exist_ok=True)  # SageMaker creates them for the script
    script = provision_code(contract)
    error_dir = Path(tempfile.mkdtemp(prefix="meshtrain-rank-errors-"))
    command = build_command(contract, script)
    code, tail = run_streaming(command, build_environment(contract, error_dir), paths.code_dir)
    if code == 0:
        paths.output_dir.mkdir(parents=True, exist_ok=True)
        paths.success_file.touch()
        return 0
    write_failure(paths, failure_message(code, command, first_rank_error(error_dir), tail))
    return USER_ERROR


def main() -> None:
    paths = OptMLPaths.from_env()
    try:
        code = train(paths)
    except (ConfigError, ProvisionError) as error:
        write_failure(paths, f"ClientError: {error}")
        print(f"meshtrain: {error}", file=sys.stderr)
        code = USER_ERROR
    except Exception as error:
        write_failure(paths, f"Framework Error: \n{traceback.format_exc()}\n{error}")
        traceback.print_exc()
        code = FRAMEWORK_ERROR
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
