"""Decide where each weight lives and where each op runs (seed 002: operator affinity).

    graph       the graph llama.cpp builds for the model (metadata-only load), its target ops
    profile     every target op timed on every device, copies and launches fitted
    schedmodel  ggml's scheduler reproduced: a placement's node -> device assignment and its cost
    optimal     the MILP over the scheduler model (HiGHS)
    context     budgets, the workload, the planning context (pass models, sizes, profile)
    verify      placements checked against llama.cpp's own memory accounting
    strategies  layers, affinity, optimal, fit, flexgen: one interface, one registry
    plan        plans built in one place (make_plan), plan files, `oallama plan`
"""
