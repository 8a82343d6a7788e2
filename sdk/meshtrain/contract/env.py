"""Names of the environment variables of the host contract (sagemaker-training-toolkit's)."""

from __future__ import annotations

SAGEMAKER_BASE_DIR = "SAGEMAKER_BASE_DIR"  # root of the /opt/ml tree (toolkit's override)

SM_HOSTS = "SM_HOSTS"
SM_CURRENT_HOST = "SM_CURRENT_HOST"
SM_CURRENT_HOST_RANK = "SM_CURRENT_HOST_RANK"
SM_HOST_COUNT = "SM_HOST_COUNT"
SM_NETWORK_INTERFACE_NAME = "SM_NETWORK_INTERFACE_NAME"
SM_CURRENT_INSTANCE_TYPE = "SM_CURRENT_INSTANCE_TYPE"
SM_HPS = "SM_HPS"
SM_HP_PREFIX = "SM_HP_"
SM_CHANNEL_PREFIX = "SM_CHANNEL_"
SM_CHANNELS = "SM_CHANNELS"
SM_USER_ENTRY_POINT = "SM_USER_ENTRY_POINT"
SM_USER_ARGS = "SM_USER_ARGS"
SM_MODULE_NAME = "SM_MODULE_NAME"
SM_MODULE_DIR = "SM_MODULE_DIR"
SM_FRAMEWORK_PARAMS = "SM_FRAMEWORK_PARAMS"
SM_RESOURCE_CONFIG = "SM_RESOURCE_CONFIG"
SM_INPUT_DATA_CONFIG = "SM_INPUT_DATA_CONFIG"
SM_TRAINING_ENV = "SM_TRAINING_ENV"
SM_LOG_LEVEL = "SM_LOG_LEVEL"
SM_NUM_CPUS = "SM_NUM_CPUS"
SM_NUM_GPUS = "SM_NUM_GPUS"
SM_NUM_NEURONS = "SM_NUM_NEURONS"
SM_MODEL_DIR = "SM_MODEL_DIR"
SM_INPUT_DIR = "SM_INPUT_DIR"
SM_INPUT_DATA_DIR = "SM_INPUT_DATA_DIR"
SM_INPUT_CONFIG_DIR = "SM_INPUT_CONFIG_DIR"
SM_OUTPUT_DIR = "SM_OUTPUT_DIR"
SM_OUTPUT_DATA_DIR = "SM_OUTPUT_DATA_DIR"
SM_OUTPUT_INTERMEDIATE_DIR = "SM_OUTPUT_INTERMEDIATE_DIR"
SM_OUTPUT_FAILURE = "SM_OUTPUT_FAILURE"
SM_CHECKPOINT_DIR = "SM_CHECKPOINT_DIR"  # meshtrain addition: CheckpointConfig.LocalPath
SM_MASTER_ADDR = "SM_MASTER_ADDR"
SM_MASTER_PORT = "SM_MASTER_PORT"
SM_HP_MP_PARAMETERS = "SM_HP_MP_PARAMETERS"
SM_SOURCE_DIR = "SM_SOURCE_DIR"  # SDK v3 (ModelTrainer) drivers: the code's folder
SM_ENTRY_SCRIPT = "SM_ENTRY_SCRIPT"  # SDK v3: SourceCode.entry_script
SM_DISTRIBUTED_CONFIG = "SM_DISTRIBUTED_CONFIG"  # SDK v3: the launcher's distributed.json
TRAINING_JOB_NAME = "TRAINING_JOB_NAME"

# meshtrain's own variables (set by backends, read by the runtime)
MESHTRAIN_MASTER_ADDR = "MESHTRAIN_MASTER_ADDR"  # override algo-1's address (local processes)
MESHTRAIN_MASTER_PORT = "MESHTRAIN_MASTER_PORT"
MESHTRAIN_JOB_NAME = "MESHTRAIN_JOB_NAME"  # the job's name, for scripts and logs
MESHTRAIN_JOB_TOKEN = "MESHTRAIN_JOB_TOKEN"  # per-job unique token: marks every process of a job
MESHTRAIN_HOST_WORK_DIR = "MESHTRAIN_HOST_WORK_DIR"  # torchrun logs, failure records
MESHTRAIN_RANK_ERROR_DIR = "MESHTRAIN_RANK_ERROR_DIR"  # where failing ranks leave their traceback
MESHTRAIN_ATTEMPT = "MESHTRAIN_ATTEMPT"  # 1, then 2, 3 ... when a job's hosts are restarted
MESHTRAIN_STOP_GRACE_SECONDS = "MESHTRAIN_STOP_GRACE_SECONDS"  # SIGTERM -> SIGKILL on a stop
MESHTRAIN_NUM_GPUS = "MESHTRAIN_NUM_GPUS"  # override GPU detection on a host
# "exec": one fresh process per rank, also on a host without GPUs, where ranks are otherwise
# forks of a process that imported torch once (meshtrain_runtime.host.fork_server)
MESHTRAIN_RANK_START = "MESHTRAIN_RANK_START"
MESHTRAIN_RANK_PRELOAD = "MESHTRAIN_RANK_PRELOAD"  # the fork server's imports (by the bootstrap)
MESHTRAIN_FORK_SERVER_DIR = "MESHTRAIN_FORK_SERVER_DIR"  # its socket's folder (by the bootstrap)
# every rank's process name (/proc/PID/comm) is this and its RANK: how a job's ranks are found
RANK_PROCESS_NAME_PREFIX = "mt-rank-"
# The user's source_dir (the folder the code dir was packed from) where it is on the client's
# machine: tracebacks name the user's files, not the job's copy in /opt/ml/code
MESHTRAIN_SOURCE_DIR = "MESHTRAIN_SOURCE_DIR"
# fault tolerance (torch_distributed.fault_tolerance): each replica group is its own torchrun
# world; the backend tells every host (and so every rank) which group it is and where the
# torchft lighthouse listens
MESHTRAIN_FT_REPLICA_GROUP = "MESHTRAIN_FT_REPLICA_GROUP"  # 0 .. N-1
MESHTRAIN_FT_REPLICA_GROUPS = "MESHTRAIN_FT_REPLICA_GROUPS"  # N
MESHTRAIN_FT_LIGHTHOUSE = "MESHTRAIN_FT_LIGHTHOUSE"  # http://host:port
# a folder every replica group's ranks can read and write (the job's): which group finished the
# job, which group writes a step's checkpoint (meshtrain_runtime.fault.coordination)
MESHTRAIN_FT_COORDINATION_DIR = "MESHTRAIN_FT_COORDINATION_DIR"

BOOTSTRAP_MODULE = "meshtrain_runtime.host.bootstrap"
"""What every backend runs in each host (``python -m``; the image's ``train`` does the same)."""

# Kubernetes pods learn which host they are from the operator's replica labels (downward API):
# Master 0 is algo-1, Worker i is algo-(i+2).
MESHTRAIN_REPLICA_TYPE = "MESHTRAIN_REPLICA_TYPE"
MESHTRAIN_REPLICA_INDEX = "MESHTRAIN_REPLICA_INDEX"
# A fault-tolerant job renders one PyTorchJob per replica group: its Master 0 is host
# algo-(offset + 1), where offset is the hosts of the groups before it.
MESHTRAIN_HOST_OFFSET = "MESHTRAIN_HOST_OFFSET"


def host_from_replica(replica_type: str, replica_index: str, offset: int = 0) -> str:
    """algo-N of a PyTorchJob replica ("master"/"worker", index as its label gives it), the
    job's hosts numbered from algo-(offset + 1)."""
    first = {"master": 1, "worker": 2}.get(replica_type.lower())
    if first is None or not replica_index.isdigit():
        raise ValueError(f"not a PyTorchJob replica: type={replica_type!r}, "
                         f"index={replica_index!r}")
    return f"algo-{int(replica_index) + first + offset}"
MESHTRAIN_NODE_RANK = "MESHTRAIN_NODE_RANK"  # 0-based host index (TrainJob's completion index)
