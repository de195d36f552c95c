"""Placement solvers over the pass model (cost/schedmodel.py): the exact MILP (optimal), the
chain dynamic programme and the walk it is built on."""
