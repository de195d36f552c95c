import sys, runpy
from oallama.planner.cost import calfit
orig = calfit.op_key
def op_key(op, n_tokens):
    return f"{op}:1" if op in ("FLASH_ATTN_EXT", "MUL_MAT") and n_tokens == 1 else op
calfit.op_key = op_key
what = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(what, run_name="__main__")
