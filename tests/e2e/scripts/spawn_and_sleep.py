"""No torch: start a detached grandchild (its own session, no lifeline), then sleep.

The grandchild inherits the job's token but not the lifeline, so only a stop that sweeps by
token can end it once the supervisor is gone.
"""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "escapee.pid"), "w") as handle:
    handle.write(str(child.pid))
print("running with an escapee", flush=True)
time.sleep(600)
