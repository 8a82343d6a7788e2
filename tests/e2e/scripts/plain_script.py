"""A script with no torch at all and no torch_distributed: run once per host by python."""

import os
import sys

with open(os.path.join(os.environ["SM_MODEL_DIR"], f"{os.environ['SM_CURRENT_HOST']}.txt"),
          "w") as f:
    f.write(" ".join(sys.argv[1:]))
