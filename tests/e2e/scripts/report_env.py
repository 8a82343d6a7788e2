"""Each rank writes what it sees of the host contract into SM_MODEL_DIR (no meshtrain import)."""

import hashlib
import json
import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
seen = {
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith(("SM_", "WORLD_SIZE", "RANK",
                                                                  "LOCAL_RANK"))},
    "cwd": os.getcwd(),
    "channel_files": sorted(os.listdir(os.environ["SM_CHANNEL_TRAIN"])),
    # the environment's secret, as a digest: the job's outputs must not hold a copy of it
    "secret_sha256": hashlib.sha256(os.environ.get("SECRET_TOKEN", "").encode()).hexdigest(),
}
path = os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{dist.get_rank()}.json")
with open(path, "w") as handle:
    json.dump(seen, handle)
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"out-{dist.get_rank()}.txt"), "w") as f:
    f.write("data")
print(f"rank {dist.get_rank()} done", flush=True)
