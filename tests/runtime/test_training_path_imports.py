"""The training path imports no debug/profiling module and runs without numpy.

README's first command installs only the `runtime` extra. A module on the path from init() to a
training step that pulls in torch's debug tooling (CommDebugMode needs numpy) broke every rank of
the quickstart once; this runs that path in a fresh interpreter where numpy cannot be imported.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, warnings

    # None in sys.modules is how Python spells "not installed": `import numpy` raises
    # ModuleNotFoundError and importlib.util.find_spec("numpy") returns None.
    sys.modules["numpy"] = None
    warnings.simplefilter("ignore")  # torch warns that numpy is missing; that is the point

    import torch
    import meshtrain_runtime
    from meshtrain_runtime import checkpoint, data, grad, parallelize  # noqa: F401

    meshtrain_runtime.init({"hybrid_shard_degree": 1})
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = meshtrain_runtime.transform(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    meshtrain_runtime.clip_grad_norm_(model, 1.0)
    optimizer.step()
    debug = sorted(m for m in sys.modules if m.startswith("torch.distributed.tensor.debug"))
    print("DEBUG_MODULES", debug)
    print("LOSS_OK", bool(torch.isfinite(loss)))
    meshtrain_runtime.reset()
""")


def test_a_training_step_imports_no_debug_module_and_needs_no_numpy(tmp_path):
    # no RANK/WORLD_SIZE: init() makes a world of one process, as a plain `python train.py`
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path),
           "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DEBUG_MODULES []" in done.stdout, done.stdout
    assert "LOSS_OK True" in done.stdout, done.stdout
