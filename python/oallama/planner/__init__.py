"""Decide where each weight lives and where each op runs (seed 002: operator affinity).

    graph       the graph llama.cpp builds for the model (metadata-only load), its target ops
    profile     every target op timed on every device, copies and launches fitted
    calibrate   the real graph timed: what one-op timings miss (other ops, overheads, streams, splits)
    routing     a mixture of experts' routing recorded in a real pass (what a streamed expert copies)
    layouts     host weight layouts (plain / repacked) as placement choices
    schedmodel  ggml's scheduler reproduced: a placement's node -> device assignment and its cost
    optimal     the MILP over the scheduler model (HiGHS)
    chaindp     the same program solved exactly by dynamic programming along the graph order
    context     budgets, the workload, the planning context (pass models, sizes, profile)
    verify      placements checked against llama.cpp's own memory accounting
    strategies  layers, affinity, optimal, fit, flexgen: one interface, one registry
    plan        plans built in one place (make_plan), plan files, `oallama plan`
"""
