"""scripts/repredict.py over this run's every round (each with its own profile), as it is and with
the one-op profile's times bounded from above by the same shape's time at more columns (a matmul
over more columns does no less work; a smaller column count measured slower ran in a slow moment).

    GGML_VK_VISIBLE_DEVICES=0 python monotone.py RESULTS_DIR [bounded]   (from the repository root; needs raw/)

The accelerator is Vulkan0 itself (repredict's loopback rpc-server stand-in has no op offload, so it
would not stream a prompt's weights to lavapipe as the plans do).
"""
import contextlib
import sys
import types

sys.path.insert(0, "scripts")
import repredict

repredict.rpc.start_server = lambda **kw: contextlib.nullcontext(types.SimpleNamespace(device_name="Vulkan0"))
from oallama.planner.profile import Profile, ProfileError  # noqa: E402

if len(sys.argv) > 2 and sys.argv[2] == "bounded":
    def _interpolated(self, table, device, op, n, field):
        prefix = self.op_key(op.op, op.weight_type, op.weight_shape, 0)[:-1]
        pts = sorted((int(k.rsplit(":", 1)[1]), float(v[field])) for k, v in table.items()
                     if k.startswith(prefix) and field in v)
        if not pts:
            raise ProfileError(f"profile has no measurement of {prefix.rstrip(':')} on {device}")
        for i in range(len(pts) - 2, -1, -1):  # suffix minimum: bounded by every larger column count
            pts[i] = (pts[i][0], min(pts[i][1], pts[i + 1][1]))
        exact = [t for c, t in pts if c == n]
        if exact:
            return exact[0]
        if len(pts) == 1:
            return pts[0][1] * max(n, 1) / max(pts[0][0], 1)
        lo = max([p for p in pts if p[0] <= n], default=pts[0], key=lambda p: p[0])
        hi = min([p for p in pts if p[0] >= n], default=pts[-1], key=lambda p: p[0])
        if lo[0] == hi[0]:
            i = pts.index(lo)
            lo, hi = (pts[i - 1], pts[i]) if i > 0 else (pts[0], pts[1])
        return max(lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0]), 0.0)
    Profile._interpolated = _interpolated
    print("# one-op times bounded by more columns'")
sys.argv = sys.argv[:2]
sys.exit(repredict.main())
