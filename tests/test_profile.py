"""The profiler: one-op graphs on each device, host<->device links, a keyed cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oallama import ProfileError, _core
from oallama.planner.cost import hostspeed
from oallama.planner.cost.measure import profile_model
from oallama.planner.cost.profile import SCHEMA, Link, Profile, Settings, device_identity, host_description
from oallama.planner.graph import TargetOp, inventory
from oallama.planner.workload import Ubatch
from oallama.runtime import rpc


@pytest.fixture(scope="session")
def prof(synth_model, rpc_server: rpc.RpcServer) -> Profile:
    return profile_model(synth_model("tiny", "q8_0"), ["CPU", rpc_server.device_name], threads=1,
                         n_tokens=(1, 32), repeats=3, progress=False)


def test_every_signature_is_measured_on_every_device(prof: Profile, synth_model, rpc_server: rpc.RpcServer) -> None:
    # every target op of both graphs, taken from the inventory itself (not from signatures(), which
    # decides what the profiler measures): measured exactly at its own column count, on each device
    inv = inventory(synth_model("tiny", "q8_0"), (1, 32))
    ops = [o for n in (1, 32) for o in inv.target_ops(n)]
    assert {o.n_tokens for o in ops} == {1, 32}  # decode, prefill (and the 1-token ops after out_ids)
    for dev in ("CPU", rpc_server.device_name):
        for o in ops:
            st = prof.ops[dev][Profile.op_key(o.op, o.weight_type, o.weight_shape, o.n_tokens)]
            assert st["n"] == 3 and 0 < st["min_us"] <= st["median_us"] <= st["max_us"]
            assert st["stdev_us"] >= 0 and st["buffer_type"]
            assert prof.op_time_us(dev, o) == st["median_us"]
        # and nothing else: one measurement per distinct (op, type, shape, columns)
        assert len(prof.ops[dev]) == len({o.signature for o in ops})
    assert prof.ops["CPU"] and prof.settings.threads == 1
    link = prof.links[rpc_server.device_name]
    assert link["h2d"].bytes_per_us > 0 and link["d2h"].bytes_per_us > 0
    assert prof.devices[rpc_server.device_name]["launch_us"] > 0


def test_cache_is_reused_when_everything_matches(prof: Profile, synth_model, rpc_server: rpc.RpcServer) -> None:
    again = profile_model(synth_model("tiny", "q8_0"), ["CPU", rpc_server.device_name], threads=1,
                          n_tokens=(1, 32), repeats=3, progress=False)
    assert again.key == prof.key and again.created == prof.created  # read back, not measured
    other = profile_model(synth_model("tiny", "q8_0"), ["CPU"], threads=2, n_tokens=(1, 32), repeats=2,
                          progress=False)
    assert other.key != prof.key  # other devices and threads: another profile


def test_loopback_server_on_another_port_reuses_the_profile(prof: Profile, synth_model) -> None:
    with rpc.start_server(threads=1) as second:
        again = profile_model(synth_model("tiny", "q8_0"), ["CPU", second.device_name], threads=1,
                              n_tokens=(1, 32), repeats=3, progress=False)
        assert again.key == prof.key and second.device_name in again.ops


def test_profile_records_the_device_speed_around_its_measurement(prof: Profile, rpc_server: rpc.RpcServer) -> None:
    # the reference ops timed before the first op and after the calibration, on both devices
    hs = prof.host_speed
    assert hs["reference"] == hostspeed.REF_DESCRIPTION
    for when in ("before", "after"):
        assert set(hs[when]) == {"host", "accelerator"}
        for times in hs[when].values():
            assert set(times) == {*hostspeed.REF_OPS, "launch_us"} and all(v > 0 for v in times.values())
            # 32 columns cost more than 1 (the same weight, 32x the arithmetic); a 16x larger weight too
            assert times["n32_us"] > times["n1_us"] and times["big_n1_us"] > times["n1_us"]
    assert prof.renamed(["CPU", rpc_server.device_name]).host_speed == hs


def test_device_speed_ratios_and_mean() -> None:
    ref = {"n1_us": 100.0, "n32_us": 1000.0}
    assert hostspeed.ratio(ref, {"n1_us": 200.0, "n32_us": 2000.0}) == pytest.approx(0.5)  # twice as slow now
    assert hostspeed.ratio(ref, {"n1_us": 50.0, "n32_us": 2000.0}) == pytest.approx(1.0)  # geometric mean
    assert hostspeed.ratio(ref, {"n1_us": 80.0}) == pytest.approx(1.25)  # the ops both have
    assert hostspeed.ratio(None, ref) is None and hostspeed.ratio(ref, {}) is None
    both = {"host": ref, "accelerator": {"n1_us": 10.0}}
    now = hostspeed.mean([{"host": {"n1_us": 300.0, "n32_us": 3000.0}, "accelerator": {"n1_us": 15.0}},
                          {"host": {"n1_us": 100.0, "n32_us": 1000.0}, "accelerator": {"n1_us": 25.0}}])
    assert now == {"host": {"n1_us": 200.0, "n32_us": 2000.0}, "accelerator": {"n1_us": 20.0}}
    assert hostspeed.ratios(both, now) == pytest.approx({"host": 0.5, "accelerator": 0.5})
    # a host-only measurement (no roles) is the host's; a role one side lacks is left out
    assert hostspeed.ratios(ref, now) == pytest.approx({"host": 0.5})
    per_op = hostspeed.op_ratios(both, now)  # which op moved
    assert set(per_op) == {"host", "accelerator"} and per_op["accelerator"] == pytest.approx({"n1_us": 0.5})
    assert per_op["host"] == pytest.approx({"n1_us": 0.5, "n32_us": 0.5})


def test_json_round_trip(prof: Profile, tmp_path: Path) -> None:
    p = prof.save(tmp_path / "p.json")
    back = Profile.load(p)
    assert back.ops == prof.ops and back.key == prof.key and back.settings == prof.settings
    assert back.host_speed == prof.host_speed
    assert json.loads(p.read_text())["schema"] == SCHEMA


def test_a_profile_keeps_the_machine_that_measured_it(prof: Profile, tmp_path: Path) -> None:
    """A profile names the machine that measured it; saved again (on another machine, here a rewritten
    one), it still names that one, not the machine that saved it."""
    assert prof.host == host_description()
    doc = prof.to_json()
    doc["host"] = {**doc["host"], "node": "elsewhere", "cpu_detail": "family 0 model 0"}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    again = Profile.load(tmp_path / "a.json").save(tmp_path / "b.json")
    assert json.loads(again.read_text())["host"] == doc["host"]


def test_two_cpus_of_one_name_are_two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's identity in profile and device-model keys has what tells apart two CPUs that report one name (a
    VM's "AMD EPYC" is two generations here)."""
    from oallama.planner.cost import profile as profmod
    from oallama.runtime import devices as devmod

    cpu = devmod.resolve("CPU")
    monkeypatch.setattr(profmod, "cpu_detail", lambda: "family 25 model 1; L2 512K")
    one = device_identity(cpu)
    monkeypatch.setattr(profmod, "cpu_detail", lambda: "family 25 model 17; L2 1024K")
    assert device_identity(cpu) != one and "family 25 model 17" in device_identity(cpu)


def test_bad_profile_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such profile"):
        Profile.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not a JSON profile"):
        Profile.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"schema": "other"}')
    with pytest.raises(ProfileError, match="not an oallama profile"):
        Profile.load(tmp_path / "y.json")


def test_accelerator_matmuls_are_timed_at_the_workloads_pass_sizes(synth_model, rpc_server: rpc.RpcServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A 40-token prompt is no column count the profile times: the accelerator's matmuls are timed
    at 40 when a plan is costed (a GPU-class kernel runs columns in tiles: lavapipe's took as long
    at 40 as at 64), kept in the profile and its cache file, and timed once; the host's stay
    interpolated."""
    from oallama.planner.cost import opsizes
    from oallama.planner.cost.profile import cache_dir
    from oallama.planner.graph import target_ops
    from oallama.planner.plan import Workload, build_context

    model, acc = synth_model("tiny", "q8_0"), rpc_server.device_name
    ctx = build_context(model, acc, Workload(prompt=40, gen=4, n_ubatch=64), threads=1, progress=False)
    ops = target_ops(ctx.passes[Ubatch(40)].graph)
    assert ops and all(o.n_tokens in (1, 40) for o in ops)  # the last layer's tail runs the one token read
    wide = [o for o in ops if o.n_tokens == 40]
    key = Profile.op_key
    for prof in (ctx.profile, Profile.load(cache_dir() / f"{ctx.profile.key}.json").renamed(list(ctx.profile.devices))):
        assert all(key(o.op, o.weight_type, o.weight_shape, 40) in prof.ops[acc] for o in wide)
        assert not any(key(o.op, o.weight_type, o.weight_shape, 40) in prof.ops["CPU"] for o in wide)
        assert all(prof.op_time_us(acc, o) == prof.ops[acc][key(o.op, o.weight_type, o.weight_shape, 40)]["median_us"]
                   for o in wide)
    assert not opsizes.missing(ctx.profile, [ctx.passes[Ubatch(40)].graph], acc)

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError(f"timed again: {a}")

    monkeypatch.setattr(opsizes, "time_op", refuse)
    again = build_context(model, acc, Workload(prompt=40, gen=4, n_ubatch=64), threads=1, progress=False)
    assert again.passes[Ubatch(40)].t_acc.keys() == ctx.passes[Ubatch(40)].t_acc.keys()


def test_op_time_interpolates_between_measured_column_counts() -> None:
    key = Profile.op_key
    ops = {"CPU": {key("MUL_MAT", "q8_0", (64, 64), 1): {"median_us": 10.0},
                   key("MUL_MAT", "q8_0", (64, 64), 32): {"median_us": 41.0}}}
    p = Profile("k", "s", {"CPU": {}}, Settings(1), {}, ops, {})

    def op(n: int) -> TargetOp:
        return TargetOp(0, "x", "MUL_MAT", "w", "q8_0", (64, 64), 1, 0, n, 0, 0, 0, (), ())

    assert p.op_time_us("CPU", op(1)) == 10.0
    assert p.op_time_us("CPU", op(11)) == pytest.approx(20.0)
    assert p.op_time_us("CPU", op(63)) == pytest.approx(72.0)  # extrapolated along the last segment
    with pytest.raises(ProfileError, match="no measurements for device GPU"):
        p.op_time_us("GPU", op(1))


@pytest.mark.parametrize("launch_us", [8.0, 11981.0], ids=["launch-8us", "launch-12ms-disturbed"])
def test_an_op_s_compute_is_its_time_less_the_least_of_its_device_s_launch_timings_and_fastest_op(launch_us: float) -> None:
    # every op's profiled time includes one launch: a launch timed slower than the fastest op cannot
    # be subtracted whole (the fastest op's time is then all launch, as far as the profile can tell)
    key = Profile.op_key
    ops = {"CPU": {key("MUL_MAT", "q6_K", (4096, 1024), 1): {"median_us": 46.0},
                   key("MUL_MAT", "q6_K", (4096, 151936), 1): {"median_us": 10281.0},
                   key("MUL_MAT", "q1_0", (4096, 1024), 1): {"unsupported": True}}}
    p = Profile("k", "s", {"CPU": {"launch_us": launch_us}}, Settings(1), {}, ops, {})

    def op(shape: tuple[int, int]) -> TargetOp:
        return TargetOp(0, "x", "MUL_MAT", "w", "q6_K", shape, 1, 0, 1, 0, 0, 0, (), ())

    launch = min(launch_us, 46.0)
    assert p.launch_us("CPU") == launch
    assert p.compute_us("CPU", op((4096, 151936))) == pytest.approx(10281.0 - launch)
    assert p.compute_us("CPU", op((4096, 1024))) == pytest.approx(max(46.0 - launch, 4.6))
    # timed just before the profile (host_speed), undisturbed: the least of the three; not the timing after
    # the calibration, which the calibration's fit did not see
    p.host_speed = {"before": {"host": {"launch_us": 7.0}}, "after": {"host": {"launch_us": 5.0}}}
    assert p.launch_us("CPU") == min(launch_us, 7.0)
    assert p.compute_us("CPU", op((4096, 151936))) == pytest.approx(10281.0 - min(launch_us, 7.0))
    # an rpc-server's launch, a round trip like its ops', is taken as measured
    p.devices["RPC[127.0.0.1:1]"], p.ops["RPC[127.0.0.1:1]"] = {"kind": "rpc", "launch_us": launch_us}, ops["CPU"]
    assert p.launch_us("RPC[127.0.0.1:1]") == launch_us


@pytest.mark.parametrize("warmup", [0, 2])
@pytest.mark.parametrize("op", ["MUL_MAT", "MUL_MAT_ID"])
def test_a_long_run_is_timed_three_times(op: str, warmup: int) -> None:
    # long_us: a column count whose first run (warm-up or timed) takes that long gets at most 3 runs
    # (1 ns: every run; a 1M-multiply-add op takes tens of us)
    def runs(long_us: float) -> list[int]:
        if op == "MUL_MAT":
            res = _core.profile_mul_mat("CPU", "q8_0", 1024, 1024, [1, 8], 1, warmup, 6, True, "", "", long_us)
        else:
            res = _core.profile_mul_mat_id("CPU", "q8_0", 1024, 1024, 8, 2, [1, 8], [], 1, warmup, 6, True, "", "",
                                           long_us)
        return [len(r.samples_us) for r in res]

    assert runs(0.0) == [6, 6]
    assert runs(1e9) == [6, 6]  # none that long
    assert runs(1e-3) == [3, 3]


def test_link_fit() -> None:
    link = Link.fit([(1000, 12.0), (2000, 14.0), (4000, 18.0)])
    assert link.latency_us == pytest.approx(10.0) and link.bytes_per_us == pytest.approx(500.0)
    assert link.time_us(0) == 0.0 and link.time_us(500) == pytest.approx(11.0)


def test_link_follows_its_measured_curve() -> None:
    # an rpc-server's h2d copies as measured on loopback: small sets are taken at once (socket
    # buffer), large ones at the drain rate; no single line holds both ends
    pts = [(4096, 59.0), (131072, 79.0), (524288, 132.0), (2097152, 1439.0), (4194304, 4975.0),
           (7340032, 10818.0), (29360128, 45998.0)]
    link = Link.fit(pts)
    for b, t in pts:
        assert link.time_us(b) == pytest.approx(t)
    assert 59.0 < link.time_us(16384) < 79.0  # between its neighbours (the line said 26 us)
    last = (45998.0 - 10818.0) / (29360128 - 7340032)
    assert link.time_us(58720256) == pytest.approx(45998.0 + 29360128 * last)  # the last segment, extended
    # a noisy sample below its predecessor does not make a larger copy cheaper
    bumpy = Link.fit([(1000, 20.0), (2000, 15.0), (4000, 30.0)])
    assert bumpy.time_us(2000) == pytest.approx(20.0) and bumpy.time_us(1500) == pytest.approx(20.0)
    # a link the planner derives (no samples) stays a line
    assert Link(5.0, 100.0).time_us(1000) == pytest.approx(15.0)
