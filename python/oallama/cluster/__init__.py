"""Several weak machines as one (seed 004): probe the devices and links, assign decoder blocks to
rpc-server devices (the patent's MILP, an exact DP), write and load the plan.

    problem   devices/links files, the model's blocks, the objective's terms, baselines
    timing    the model's blocks timed in its real graph on the client (the compute term)
    solver    the MILP (HiGHS) and the exact DP for contiguous plans
    distribute the plan: file, loading through `Llama`, the `oallama distribute` command
    probe     `oallama probe`: memory, FLOP/s, latency, bandwidth, jitter, loss per device/link
"""

from .distribute import (
    DistPlan,
    Prediction,
    baseline_plan,
    load,
    plan,
    plan_model,
    predict,
    read_plan,
    synthetic_instance,
)
from .problem import (
    CLIENT,
    DEVICES_SCHEMA,
    FORMULATIONS,
    METHODS,
    OBJECTIVES,
    PLAN_SCHEMA,
    Block,
    BlockTimes,
    Cluster,
    DeviceSpec,
    DistOptions,
    LinkSpec,
    ModelCost,
    Problem,
    Terms,
    baseline,
    brute_force,
    build_problem,
    evaluate,
    layer_split,
    model_cost,
    parse_devices,
    read_devices,
    restarts_after_idle,
    violation,
)
from .solver import Solution, dp_tractable, solve, solve_dp
from .timing import calibrate as time_blocks

__all__ = [
    "CLIENT", "DEVICES_SCHEMA", "FORMULATIONS", "METHODS", "OBJECTIVES", "PLAN_SCHEMA", "Block", "BlockTimes", "Cluster",
    "DeviceSpec", "DistOptions", "DistPlan", "LinkSpec", "ModelCost", "Prediction", "Problem", "Solution",
    "Terms", "baseline", "baseline_plan", "brute_force", "build_problem", "dp_tractable", "evaluate",
    "layer_split", "load", "model_cost", "parse_devices", "plan", "plan_model", "predict", "read_devices",
    "read_plan", "restarts_after_idle", "solve", "solve_dp", "synthetic_instance", "time_blocks", "violation",
]
