"""Plan a 7B and a 70B Llama run before paying for it: memory per GPU, layouts, pre-flight.

    python examples/planning/plan.py

Pure Python (no torch, no AWS request): meshtrain.plan estimates every layout meshtrain's runtime
can run on the cluster and ranks them; the Estimator's pre-flight refuses a layout that cannot
fit before anything is launched. The same from a shell:

    meshtrain plan --model llama2-7b --instance-type ml.p4d.24xlarge --instance-count 1
    meshtrain plan --model llama2-70b --instance-type ml.p4d.24xlarge --instance-count 4
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from meshtrain import ConfigError, Estimator
from meshtrain.plan import Training, build_cluster, plan_layouts, resolve_model
from meshtrain.plan.layouts import Plan, smallest_fitting_count
from meshtrain.plan.report import distribution_for, render_plan

INSTANCE = "ml.p4d.24xlarge"  # 8 x A100 40 GB per instance
TRAINING = Training(seq_len=4096, micro_batch=1, precision="bf16")
TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "llama_tp_hsdp"


def plan_for(model: str, count: int) -> Plan:
    cluster = build_cluster(instance_type=INSTANCE, instance_count=count)
    return plan_layouts(resolve_model(model), cluster, TRAINING)


def smallest_cluster(model: str, above: int) -> tuple[int, Plan]:
    """The fewest p4d instances on which some layout of `model` fits."""
    found = smallest_fitting_count(
        resolve_model(model), TRAINING,
        lambda count: build_cluster(instance_type=INSTANCE, instance_count=count), above=above)
    if found is None:
        raise SystemExit(f"{model} does not fit on 512 x {INSTANCE}")
    return found


def estimator_for(model: str, count: int, distribution: dict) -> Estimator:
    """The Estimator that would launch the run (with pre-flight on); nothing is started."""
    return Estimator(entry_point="train.py", source_dir=str(TRAIN_SCRIPT),
                     instance_type=INSTANCE, instance_count=count, distribution=distribution,
                     plan_model=model, plan_options={"seq_len": TRAINING.seq_len})


def main() -> None:
    console = Console(width=150)
    console.rule("Llama 2 7B on one p4d.24xlarge")
    plan_7b = plan_for("llama2-7b", 1)
    render_plan(plan_7b, console, top=5)
    assert plan_7b.best is not None and plan_7b.best.fits, "7B should fit on one p4d"
    distribution_7b = distribution_for(plan_7b.best)
    estimator_for("llama2-7b", 1, distribution_7b).check_fits()  # pre-flight passes
    console.print(f"7B distribution: {distribution_7b}")

    console.rule("Llama 2 70B on four p4d.24xlarge")
    plan_70b = plan_for("llama2-70b", 4)
    render_plan(plan_70b, console, top=3)
    count, bigger = smallest_cluster("llama2-70b", above=4)
    best = bigger.best
    console.print(f"70B needs {count} x {INSTANCE}: {best.describe()}, peak "
                  f"{best.memory.peak_bytes / 2**30:.1f} GiB of "
                  f"{best.capacity_bytes / 2**30:.1f} GiB usable per GPU")

    console.rule("Pre-flight")
    naive = {"torch_distributed": {"enabled": True},
             "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                 "hybrid_shard_degree": 32}}}}
    try:
        estimator_for("llama2-70b", 4, naive).check_fits()
        raise SystemExit("pre-flight accepted a 70B layout that the plan says cannot fit")
    except ConfigError as error:
        console.print(f"fit() would refuse hybrid_shard_degree=32 on 4 instances:\n{error}")
    estimator_for("llama2-70b", count, distribution_for(best)).check_fits()
    console.print(f"and accepts the recommended layout on {count} instances.")


if __name__ == "__main__":
    main()
