# run_tree.py: fp.sh and char2.sh run each side from its tree this way
"""python run_tree.py TREE_PYTHON_DIR oallama-args...: run `python -m oallama` from another tree's sources."""
import runpy
import sys

tree = sys.argv[1]
sys.meta_path = [f for f in sys.meta_path if "editable" not in (getattr(f, "__module__", "") or type(f).__module__).lower()
                 and "editable" not in type(f).__module__.lower()]
sys.path.insert(0, tree)
sys.argv = ["oallama", *sys.argv[2:]]
runpy.run_module("oallama", run_name="__main__")
