"""A torch-free rank of a fault-tolerant job, for the backend's tests (no torchft: what is tested
is the supervisor): it records what its host was told, then

- replica group 1, first attempt: ticks until the test SIGKILLs it;
- replica group 1, a later attempt: says it is back and exits 0;
- replica group 0: ticks (one line per tick in ticks-0.txt) until group 1 is back, ticks
  `--after-ticks` more, exits 0.

Everything goes to the folder named by FT_TEST_DIR (the test's tmp dir, seen by every host).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from meshtrain.contract import env as names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--after-ticks", type=int, default=5)
    args, _ = parser.parse_known_args()  # the job also passes --mp_parameters
    shared = Path(os.environ["FT_TEST_DIR"])
    group = int(os.environ[names.MESHTRAIN_FT_REPLICA_GROUP])
    attempt = int(os.environ[names.MESHTRAIN_ATTEMPT])
    told = {key: os.environ.get(key) for key in (
        names.MESHTRAIN_FT_REPLICA_GROUP, names.MESHTRAIN_FT_REPLICA_GROUPS,
        names.MESHTRAIN_FT_LIGHTHOUSE, "MASTER_PORT", "WORLD_SIZE", "RANK",
        "MESHTRAIN_FT_MIN_REPLICA_GROUPS", names.SM_CURRENT_HOST)}
    told["pid"] = os.getpid()
    (shared / f"start-{group}-{attempt}.json").write_text(json.dumps(told))
    if group == 1 and attempt == 1:
        while True:
            time.sleep(0.1)
    if group == 1:
        (shared / "group-1-back").touch()
        return
    ticks, after = 0, None
    with open(shared / "ticks-0.txt", "a") as log:
        while after is None or ticks < after:
            ticks += 1
            log.write(f"{ticks} {time.time()}\n")
            log.flush()
            if after is None and (shared / "group-1-back").exists():
                after = ticks + args.after_ticks
            time.sleep(0.1)


if __name__ == "__main__":
    main()
