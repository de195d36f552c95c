"""Decide where each weight lives and where each op runs (seed 002: operator affinity).

    graph       the graph llama.cpp builds for the model (metadata-only load), its target ops
    profile     every target op timed on every device, copies and launches fitted
    schedmodel  ggml's scheduler reproduced: a placement's node -> device assignment and its cost
    optimal     the MILP over the scheduler model (HiGHS)
    plan        strategies (layers, affinity, optimal, fit, flexgen), plan files, `oallama plan`
"""
