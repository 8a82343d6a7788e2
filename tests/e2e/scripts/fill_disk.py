"""No torch: write zeros into SM_MODEL_DIR until the disk is full (the OSError ends the run)."""

import os

with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.bin"), "wb") as handle:
    while True:
        handle.write(b"\0" * 65536)
        handle.flush()
