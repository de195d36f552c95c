#!/usr/bin/env python3
"""Run another script with the activation matmuls of one-token passes fitted on a line of their
own (`calfit.op_key` "MUL_MAT:1", as flash attention's already are): the variant of the README's
last table.

    python decode_attn.py SCRIPT [ARGS ...]      e.g. dm_refit.py median-kinds OUT
"""
import runpy
import sys

from oallama.planner.cost import calfit


def op_key(op: str, n_tokens: int | None) -> str:
    return f"{op}:1" if op in ("FLASH_ATTN_EXT", "MUL_MAT") and n_tokens == 1 else op


if __name__ == "__main__":
    calfit.op_key = op_key
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
