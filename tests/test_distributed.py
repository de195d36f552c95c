"""The distributed planner: the MILP against brute force, its infeasibility reports, the plan's
translation for llama.cpp, and a two-server loopback run compared with a single-machine run."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers import greedy_tokens, post_json, stock_placement, stock_server
from oallama import cluster as D
from oallama.cluster import solver as distsolve
from oallama.errors import InfeasiblePlanError, PlanError

# --- devices files ---------------------------------------------------------------------------


def _doc(n: int = 2, **link: float) -> dict:
    return {"schema": D.DEVICES_SCHEMA, "client": {"flops": {"1": 5e10}},
            "devices": [{"name": f"RPC[127.0.0.1:{50052 + i}]", "memory_free": 2**30, "flops": {"1": 1e10, "64": 4e10},
                         "link": {"rtt_s": 0.002, "bandwidth_Bps": 1e8, **link}} for i in range(n)]}


def test_devices_file_minimal_fields() -> None:
    cl = D.parse_devices(_doc(2, jitter_s=0.001, loss=0.01))
    assert [d.name for d in cl.devices] == ["RPC[127.0.0.1:50052]", "RPC[127.0.0.1:50053]"]
    d = cl.devices[0]
    assert d.link.latency_s == pytest.approx(0.001)  # half the round trip
    assert d.link.bandwidth_up_Bps == d.link.bandwidth_down_Bps == 1e8
    assert (d.link.jitter_s, d.link.loss) == (0.001, 0.01)
    assert d.flops_at(1) == 1e10 and d.flops_at(64) == 4e10 and d.flops_at(512) == 4e10
    assert 1e10 < d.flops_at(8) < 4e10
    # log-linear between the measured 1 and 64 columns: 8 is halfway (log 8 = log 64 / 2), so the
    # geometric mean of 1e10 and 4e10
    assert d.flops_at(8) == pytest.approx(2e10, rel=1e-9)


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d["devices"][0].pop("memory_free"), r"devices\[0\]: missing or bad field"),
    (lambda d: d["devices"][1].update(name=d["devices"][0]["name"]), "listed twice"),
    (lambda d: d["devices"][0]["link"].update(loss=1.5), r"loss in \[0, 1\)"),
    (lambda d: d["devices"][0].update(flops={"1": -1}), "FLOP/s must be positive"),
    (lambda d: d.update(schema="other/1"), "expected 'oallama.devices/1'"),
    (lambda d: d.update(devices=[]), "non-empty 'devices'"),
    (lambda d: d["client"].update(tcp={"slow_start_after_idle": "yes"}), r"client.tcp.slow_start_after_idle"),
    (lambda d: d["client"].update(tcp="bbr"), r"client.tcp must be an object"),
])
def test_devices_file_errors_name_the_field(edit, match: str) -> None:
    doc = _doc(2)
    edit(doc)
    with pytest.raises(PlanError, match=match):
        D.parse_devices(doc, "devices.json")


def test_missing_devices_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="oallama probe"):
        D.read_devices(tmp_path / "none.json")


# --- the objective and the MILP --------------------------------------------------------------


def _problem(compute: list[list[float]], memory: list[float], capacity: list[float], *, entry: float = 1.0,
             exit_: float = 2.0, qos: float = 0.0, w_c: float = 0.0, contiguous: bool = True) -> D.Problem:
    c = np.array(compute, dtype=float)
    m, n = c.shape
    full = np.ones((m, n))
    return D.Problem([f"d{i}" for i in range(m)], c, entry * full, exit_ * full, qos * full, qos * full,
                     np.array(memory, dtype=float), np.array(capacity, dtype=float), w_c, contiguous)


def test_transfers_are_counted_only_where_the_device_changes() -> None:
    p = _problem([[1, 1, 1, 1], [10, 10, 10, 10]], [1] * 4, [9, 9], entry=1, exit_=2, qos=0.5, w_c=3)
    one = D.evaluate(p, [0, 0, 0, 0])
    assert (one.compute, one.data, one.qos, one.complexity) == (4, 3, 1, 3)  # in to block 0, out of block 3
    two = D.evaluate(p, [0, 0, 1, 1])
    assert (two.compute, two.data, two.qos, two.complexity) == (22, 6, 2, 6)  # + one exit + one entry
    back = D.evaluate(p, [0, 1, 0, 0])
    assert (back.data, back.qos, back.complexity) == (9, 3, 6)  # two device changes
    assert D.violation(p, [0, 1, 0, 0]) is not None  # device 0 holds two ranges
    assert D.violation(replace(p, contiguous=False), [0, 1, 0, 0]) is None
    assert "not device 0" in (D.violation(p, [1, 1, 1, 1]) or "")


SOLVERS = [("auto", "segments"), ("dp", "segments"), ("milp", "segments"), ("milp", "assignment")]


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "free"])
def test_milp_equals_brute_force(seed: int, contiguous: bool) -> None:
    n, m = 4 + seed % 4, 2 + seed % 3
    cost, cluster = D.synthetic_instance(n, m, seed, memory_slack=1.1 + 0.1 * (seed % 5))
    w_c = [0.0, 1.0, 5000.0][seed % 3]  # a large w_c favours fewer devices
    p = D.build_problem(cost, cluster, D.DistOptions(contiguous=contiguous, w_c=w_c))
    best = D.brute_force(p)
    for method, form in SOLVERS:
        if method == "dp" and not contiguous:
            continue
        for warm in (True, False):
            if best is None:
                with pytest.raises(InfeasiblePlanError):
                    D.solve(p, method=method, formulation=form, warm_start=warm)
                continue
            sol = D.solve(p, method=method, formulation=form, warm_start=warm)
            assert D.violation(p, sol.assign) is None
            assert sol.terms.total == pytest.approx(best[1].total, rel=1e-7), (method, form, warm, sol.assign, best)


def test_milp_objective_is_the_evaluated_objective() -> None:
    """The MILP's own objective value equals evaluate() of its answer (no hidden terms)."""
    cost, cluster = D.synthetic_instance(12, 4, 3)
    for contiguous in (True, False):
        p = D.build_problem(cost, cluster, D.DistOptions(contiguous=contiguous))
        for form in D.FORMULATIONS:
            lp, decode, encode = distsolve._build(p, form, contiguous=contiguous, pin_first=True)
            h, _ = distsolve._run(lp, 30.0, 1e-9)
            assign = decode(np.asarray(h.getSolution().col_value))
            assert h.getInfo().objective_function_value == pytest.approx(D.evaluate(p, assign).total, rel=1e-9)
            start = encode(assign)
            assert float(np.dot(lp.col_cost_, start)) == pytest.approx(D.evaluate(p, assign).total, rel=1e-9)


def test_eighty_blocks_on_eight_devices() -> None:
    """The issue's size (a 70B model's 80 blocks); timings are the benchmark's business."""
    cost, cluster = D.synthetic_instance(80, 8, 0, uniform=True)
    p = D.build_problem(cost, cluster, D.DistOptions())
    sol = D.solve(p)
    assert sol.status == "Optimal" and D.violation(p, sol.assign) is None
    assert sol.assign[0] == 0


def test_contiguous_plan_has_one_range_per_device() -> None:
    cost, cluster = D.synthetic_instance(30, 5, 1, uniform=True)
    plan = D.plan(cost, cluster, D.DistOptions(contiguous=True))
    devs = [d for d, _, _ in plan.segments()]
    assert len(devs) == len(set(devs)) and plan.contiguous


# --- infeasible instances name the binding constraint ----------------------------------------


@pytest.mark.parametrize(("memory", "capacity", "contiguous", "match"), [
    ([1, 5, 1], [4, 4], True, r"memory: block 1 needs .* the largest device"),
    ([3, 1, 1], [2, 4], True, r"block 0 on device 0: block 0 needs"),
    ([3, 3, 3], [4, 4], True, r"memory: the blocks need .* in all"),
    ([1, 3, 1], [2, 3], True, r"contiguity: .*contiguous=False"),
    ([1, 3, 3], [3, 4], False, r"block 0 on device 0: the blocks fit only if"),
    ([1, 3, 3], [3, 4], True, r"block 0 on device 0: the blocks fit only if"),
    ([2, 2, 2], [3, 3], False, r"memory: 3 blocks of .* do not pack"),
])
@pytest.mark.parametrize("method", ["auto", "milp"])
def test_infeasible_reports_the_binding_constraint(memory: list[float], capacity: list[float], contiguous: bool,
                                                   match: str, method: str) -> None:
    mib = [x * 2**20 for x in memory]
    p = _problem([[1.0] * len(memory)] * len(capacity), mib, [c * 2**20 for c in capacity], contiguous=contiguous)
    assert D.brute_force(p) is None
    with pytest.raises(InfeasiblePlanError, match=match):
        D.solve(p, method=method)


def test_relaxing_the_binding_constraint_makes_it_feasible() -> None:
    p = _problem([[1.0] * 3] * 2, [1, 3, 1], [2, 3], contiguous=True)
    with pytest.raises(InfeasiblePlanError, match="contiguity"):
        D.solve(p)
    assert D.solve(replace(p, contiguous=False)).assign == [0, 1, 0]


# --- llama.cpp's layer split and the plan's translation --------------------------------------


def test_layer_split_is_llama_cpps_rule() -> None:
    # 8 blocks + the output layer = 9 layers; equal shares: layers 0-4 | 5-8
    assert D.layer_split(8, [1, 1]) == [0] * 5 + [1] * 3
    assert D.layer_split(8, [3, 1]) == [0] * 7 + [1]  # 0.75 * 9 = 6.75 -> layers 0..6
    assert D.layer_split(4, [0, 1, 1]) == [1, 1, 1, 2]  # a zero share gets nothing


@pytest.mark.parametrize("seed", range(8))
def test_tensor_split_reproduces_the_plan(seed: int) -> None:
    """What load_kwargs() hands llama.cpp gives every block the plan's device."""
    cost, cluster = D.synthetic_instance(20 + seed, 5, seed, uniform=True, memory_slack=1.3)
    plan = D.plan(cost, cluster, D.DistOptions())
    kw = plan.load_kwargs()
    order = kw["devices"][1:]
    assert kw["devices"][0] == D.CLIENT and kw["n_gpu_layers"] == cost.n_blocks + 1
    assert [order[k] for k in D.layer_split(cost.n_blocks, kw["tensor_split"])] == plan.block_devices


def test_placement_keeps_embedding_and_head_on_the_client() -> None:
    cost, cluster = D.synthetic_instance(6, 3, 2, uniform=True)
    plan = D.plan(cost, cluster)
    pl = plan.placement()
    assert pl["token_embd.weight"] == pl["output.weight"] == "CPU"
    assert all(pl[f"blk.{j}.w"] == dev for j, dev in enumerate(plan.block_devices))


def test_emit_is_a_stock_command() -> None:
    cost, cluster = D.synthetic_instance(10, 3, 4, uniform=True, memory_slack=1.2)
    plan = D.plan(cost, cluster)
    cmd = plan.emit()
    text = shlex.join(cmd)
    assert cmd[0] == "llama-server" and "--rpc" in cmd and "-ot" in cmd
    eps = cmd[cmd.index("--rpc") + 1].split(",")
    assert [f"RPC[{e}]" for e in eps] == plan.pipeline_devices()  # --rpc in pipeline order
    assert cmd[cmd.index("--device") + 1] == ",".join(f"RPC{k}" for k in range(len(eps)))
    split = [float(x) for x in cmd[cmd.index("--tensor-split") + 1].split(",")]
    assert split == plan.tensor_split()
    # llama.cpp's layer split of that --tensor-split over the --rpc devices gives each block the plan's
    # device (layer_split is checked against llama.cpp's own load below)
    pipeline = plan.pipeline_devices()
    assert [pipeline[k] for k in D.layer_split(cost.n_blocks, split)] == plan.block_devices
    assert "=CPU" in text and f"=RPC0[{eps[0]}]" in text


def test_prediction_adds_up() -> None:
    cost, cluster = D.synthetic_instance(8, 3, 5, uniform=True)
    opts = D.DistOptions(n_prompt=64, n_gen=16)
    plan = D.plan(cost, cluster, opts)
    pred = plan.predicted()
    for stage in pred.stages.values():
        assert stage["total_s"] == pytest.approx(stage["compute_s"] + stage["transfer_s"] + stage["client_s"])
        assert stage["compute_s"] > 0 and stage["transfer_s"] > 0
    assert pred.ttft_s == pred.stages["prefill"]["total_s"]
    assert pred.e2e_s == pytest.approx(pred.ttft_s + 15 * pred.tpot_s)


def test_options_are_validated() -> None:
    for bad in ({"beta": 0}, {"objective": "fast"}, {"protocol_efficiency": 2}, {"w_q1": -1}, {"method": "x"},
                {"formulation": "x"}):
        with pytest.raises(PlanError):
            D.DistOptions(**bad)


def test_qos_penalties_steer_away_from_a_lossy_jittery_link() -> None:
    doc = _doc(3)
    for d in doc["devices"]:
        d["memory_free"] = 2**40
    doc["devices"][1]["flops"] = {"1": 5e10, "64": 2e11}  # fastest device ...
    doc["devices"][1]["link"].update(jitter_s=0.02, loss=0.05)  # ... behind a bad link
    cluster = D.parse_devices(doc)
    cost, _ = D.synthetic_instance(6, 3, 0, uniform=True)
    with_qos = D.plan(cost, cluster, D.DistOptions())
    without = D.plan(cost, cluster, D.DistOptions(w_q1=0, w_q2=0, w_q3=0))
    assert cluster.devices[1].name not in with_qos.block_devices
    assert cluster.devices[1].name in without.block_devices


@pytest.mark.parametrize("loss", [0.0, 0.02, 0.1])
def test_a_lossy_link_delays_each_crossing_by_its_segments_recovery(loss: float) -> None:
    """Every crossing of a link that loses `loss` of its segments takes segments x loss x
    loss_recovery_rtts round trips longer than over the same link without loss."""
    cost, _ = D.synthetic_instance(4, 1, 0, uniform=True)
    doc = _doc(1)
    doc["devices"][0]["memory_free"] = 2**40
    clean = D.parse_devices(doc)
    doc["devices"][0]["link"]["loss"] = loss
    lossy = D.parse_devices(doc)
    opts = D.DistOptions(n_prompt=64, n_gen=2)
    rtt = 2 * clean.devices[0].link.latency_s
    for tokens, stage in ((64, "prefill"), (1, "decode")):
        a = D.predict(cost, clean, [0] * 4, opts).stages[stage]
        b = D.predict(cost, lossy, [0] * 4, opts).stages[stage]
        segments = sum(-(-n // 1448) for n in (cost.blocks[0].act_in_bytes[tokens], cost.out_bytes[tokens]))
        assert b["transfer_s"] - a["transfer_s"] == pytest.approx(segments * loss * 2.0 * rtt), stage
        assert b["compute_s"] == a["compute_s"]


@pytest.mark.parametrize(("tcp", "restarts"), [
    ({"congestion_control": "cubic", "slow_start_after_idle": 1}, True),
    ({"congestion_control": "reno", "slow_start_after_idle": 1}, True),
    ({"congestion_control": "bbr", "slow_start_after_idle": 1}, False),
    ({"congestion_control": "cubic", "slow_start_after_idle": 0}, False),
    ({}, True),
], ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "unknown" if isinstance(v, dict) else str(v))
def test_the_prompt_pays_slow_start_only_where_the_kernel_restarts_the_window(tcp: dict, restarts: bool) -> None:
    """A request's prompt after an idle link starts from TCP's initial window where the client's
    kernel restarts it (CUBIC, Reno with net.ipv4.tcp_slow_start_after_idle = 1), not with BBR or
    the restart switched off (the committed idle_window experiments: TTFT over a 31-ms link 293 ->
    482 ms from 0.05 to 8 s of idle under CUBIC, flat under BBR); decode never pays it."""
    cost, _ = D.synthetic_instance(4, 1, 0, uniform=True)
    doc = _doc(1, rtt_s=0.03)
    doc["devices"][0]["memory_free"] = 2**40
    doc["client"]["tcp"] = tcp
    cluster = D.parse_devices(doc)
    assert cluster.idle_restart is restarts
    assert cost.blocks[0].act_in_bytes[64] > 64 * 1448  # many initial windows' worth
    opts = D.DistOptions(n_prompt=64, n_gen=2)
    got = D.predict(cost, cluster, [0] * 4, opts).stages
    warm = D.predict(cost, cluster, [0] * 4, replace(opts, tcp_initial_window=0)).stages
    assert got["decode"] == warm["decode"]
    extra = got["prefill"]["transfer_s"] - warm["prefill"]["transfer_s"]
    if restarts:  # 64 windows of 10 segments take 6 doublings
        assert extra >= 6 * 0.03 - 1e-9
    else:
        assert extra == 0


# --- a real model ----------------------------------------------------------------------------


def test_model_cost_from_llama_cpps_graph(tiny_q8: Path) -> None:
    from oallama.model import gguf_file

    info = gguf_file.read(tiny_q8)
    cost = D.model_cost(tiny_q8, (1, 16), n_ctx=256)
    n_embd = int(info.hparam("embedding_length"))
    assert cost.n_blocks == int(info.hparam("block_count"))
    # a block is every tensor of its layer (blk.<j>.*) in the file, read here by gguf-py
    tensors = gguf.GGUFReader(tiny_q8).tensors
    for j, b in enumerate(cost.blocks):
        mine = [t for t in tensors if t.name.startswith(f"blk.{j}.")]
        assert sorted(b.tensors) == sorted(t.name for t in mine)
        assert b.weight_bytes == sum(int(t.n_bytes) for t in mine)
        assert b.kv_bytes > 0 and b.flops[16] > b.flops[1] > 0
        assert b.act_in_bytes == {1: 4 * n_embd, 16: 16 * 4 * n_embd}  # f32 residual stream
    # the client keeps the rest: embedding, output norm, head
    assert sorted(cost.client_tensors) == sorted(t.name for t in tensors if not t.name.startswith("blk."))
    assert {"token_embd.weight", "output.weight", "output_norm.weight"} <= set(cost.client_tensors)
    assert cost.head_flops[1] > 0 and cost.identity == info.identity()


# --- two rpc-servers on loopback: plan, load, compare with one machine ------------------------


@pytest.fixture(scope="session")
def two_servers() -> Iterator[list]:
    """Session-scoped on purpose: once a process has used an rpc-server, ggml keeps it
    registered, and ggml aborts the process if a registered server is gone when a later test
    lists devices with their memory."""
    from oallama.runtime import rpc

    with rpc.start_server(threads=1) as a, rpc.start_server(threads=1) as b:
        yield [a, b]


@pytest.fixture(scope="module")
def devices_file(two_servers: list, tmp_path_factory: pytest.TempPathFactory, tiny_q8: Path) -> Path:
    from oallama.cluster import probe

    opts = probe.ProbeOptions(matmul_k=256, matmul_m=256, tokens=(1, 16), samples=3, rtt_samples=5, warmup=1,
                              payload_bytes=2**16, compute_target_s=0.02, compute_repeats=1)
    doc = probe.probe([s.endpoint for s in two_servers], opts)
    # each device may hold ~60% of the blocks: the plan needs both
    need = sum(b.memory_bytes for b in D.model_cost(tiny_q8, (1, 16), n_ctx=256).blocks)
    for d in doc["devices"]:
        d["memory_free"] = int(need * 0.6 / 0.9)
    path = tmp_path_factory.mktemp("dist") / "devices.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_probe_records_the_client_kernels_tcp_settings(devices_file: Path) -> None:
    doc = json.loads(devices_file.read_text())
    ipv4 = Path("/proc/sys/net/ipv4")
    assert doc["client"]["tcp"] == {
        "congestion_control": (ipv4 / "tcp_congestion_control").read_text().strip(),
        "slow_start_after_idle": int((ipv4 / "tcp_slow_start_after_idle").read_text())}
    assert D.read_devices(devices_file).idle_restart is D.restarts_after_idle(doc["client"]["tcp"])


@pytest.mark.parametrize("shares", [[1, 1], [3, 1], [1, 3], [2, 3], [0, 1], [1, 0]], ids=str)
def test_layer_split_is_what_llama_cpp_loads(tiny_q8: Path, two_servers: list, shares: list[float]) -> None:
    """layer_split against llama.cpp's own answer: a load with every layer offloaded, this
    tensor_split and no per-tensor overrides, each block's device read back from the model."""
    from oallama.runtime.llama import Llama

    devs = [s.device_name for s in two_servers]
    n = int(gguf.GGUFReader(tiny_q8).fields["llama.block_count"].contents())
    llm = Llama(str(tiny_q8), devices=["CPU", *devs], n_gpu_layers=n + 1, tensor_split=shares, n_ctx=256,
                verbose=False)
    try:
        got = llm.tensor_devices()
    finally:
        llm.close()
    loaded = [{d for name, d in got.items() if name.startswith(f"blk.{j}.")} for j in range(n)]
    assert loaded == [{devs[k]} for k in D.layer_split(n, shares)]


def _logits(llm, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


def test_two_server_run_matches_one_machine(tiny_q8: Path, devices_file: Path, tmp_path: Path) -> None:
    from oallama.runtime.llama import Llama

    cluster = D.read_devices(devices_file)
    plan = D.plan_model(tiny_q8, cluster, D.DistOptions(n_prompt=16, n_gen=4, n_ctx=256))
    assert len(plan.pipeline_devices()) == 2
    ref = Llama(str(tiny_q8), n_ctx=256, logits_all=True, verbose=False)
    tokens = ref.tokenize(b"The quick brown fox jumps over", add_bos=True)
    want = _logits(ref, tokens)
    ref.close()

    path = plan.write(tmp_path / "plan.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == D.PLAN_SCHEMA and doc["model"]["identity"] == plan.cost.identity
    assert doc["devices"][0] == "CPU" and doc["placement"]["output.weight"] == "CPU"
    for source in (plan, path):
        llm = D.load(source, n_ctx=256, logits_all=True, verbose=False)
        try:
            got_devices = llm.tensor_devices()
            for name, dev in plan.placement().items():
                assert got_devices[name] == dev, name
            got = _logits(llm, tokens)
        finally:
            llm.close()
        nmse = float(((got - want) ** 2).mean() / (want**2).mean())
        assert nmse < 1e-6
        assert (got.argmax(-1) == want.argmax(-1)).all()


def test_plan_file_loads_with_llama_placement(tiny_q8: Path, devices_file: Path, tmp_path: Path) -> None:
    """Llama(path, placement=plan_file): devices and per-tensor placement from the file."""
    from oallama.runtime.llama import Llama

    plan = D.plan_model(tiny_q8, D.read_devices(devices_file), D.DistOptions(n_prompt=16, n_gen=4, n_ctx=256))
    path = plan.write(tmp_path / "plan.json")
    llm = Llama(str(tiny_q8), placement=str(path), n_ctx=256, verbose=False)
    try:
        got = llm.tensor_devices()
        assert all(got[n] == d for n, d in plan.placement().items())
        # a contiguous plan (the default) also gives llama.cpp the layer split (KV placement)
        assert plan.contiguous
        load = json.loads(path.read_text())["load"]
        assert load["tensor_split"] == plan.tensor_split()
        assert llm.model_params.n_gpu_layers == load["n_gpu_layers"] == plan.cost.n_blocks + 1
    finally:
        llm.close()


def test_cli_distribute_writes_plan_and_emits(tiny_q8: Path, devices_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "oallama", "distribute", str(tiny_q8), "--devices", str(devices_file),
                        "-o", str(out), "--emit", "--n-prompt", "16", "--n-gen", "4", "--ctx", "256"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "objective" in r.stdout and "predicted TTFT" in r.stdout
    emitted = [line for line in r.stdout.splitlines() if line.startswith("llama-server ")]
    assert emitted and "--rpc" in emitted[0]
    assert json.loads(out.read_text())["schema"] == D.PLAN_SCHEMA


def test_emitted_command_runs_on_a_stock_llama_server(tiny_q8: Path, devices_file: Path, tmp_path: Path) -> None:
    """`oallama distribute --emit` on oallama's stock llama-server with two rpc-servers: every weight
    on the device the plan says (the server's own load log), the greedy completion oallama's."""
    from oallama.runtime import rpc

    plan = D.plan_model(tiny_q8, D.read_devices(devices_file), D.DistOptions(n_prompt=16, n_gen=4, n_ctx=256))
    cmd = plan.emit()
    eps = cmd[cmd.index("--rpc") + 1].split(",")
    assert len(eps) == 2
    prompt, n = "The quick brown fox jumps over", 8
    llm = D.load(plan, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, flash_attn=False, verbose=False)
    try:
        want = greedy_tokens(llm, prompt, n)
    finally:
        llm.close()
    log = tmp_path / "llama-server.log"
    with rpc.start_server(threads=1) as a, rpc.start_server(threads=1) as b:  # fresh: one client each
        new = dict(zip(eps, [a.endpoint, b.endpoint], strict=True))
        args = cmd[1:]
        for old, fresh in new.items():
            args = [x.replace(old, fresh) for x in args]
        with stock_server([*args, "-c", "256", "-b", "64", "-ub", "64", "-t", "1", "-fa", "off", "-v"], log) as url:
            out = post_json(url + "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0,
                                                  "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True})
        fresh_eps = [a.endpoint, b.endpoint]
    placed = stock_placement(log.read_text(errors="replace"), list(plan.placement()), plan.cost.n_blocks)

    def ours(dev: str) -> str:  # stock names -> the plan's: "RPC0[fresh ep]", "RPC1" (the second --rpc)
        if dev.startswith("RPC") and "[" in dev:
            return f"RPC[{eps[fresh_eps.index(dev[dev.index('[') + 1:-1])]}]"
        if dev.startswith("RPC"):
            return f"RPC[{eps[int(dev[3:])]}]"
        return "CPU" if dev.startswith("CPU") else dev

    assert {w: ours(d) for w, d in placed.items()} == plan.placement()
    assert out["tokens"] == want


def test_cli_infeasible_names_the_constraint(tiny_q8: Path, devices_file: Path, tmp_path: Path) -> None:
    doc = json.loads(devices_file.read_text())
    for d in doc["devices"]:
        d["memory_free"] = 1000
    small = tmp_path / "small.json"
    small.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "oallama", "distribute", str(tiny_q8), "--devices", str(small)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "no feasible plan: memory: block 0 needs" in r.stderr
    assert "time blocks" not in r.stderr  # said before the blocks are timed (memory needs no timing)


# --- emulated networks (bench/scripts/netem_scenario.py) -------------------------------------------

SCRIPTS = Path(__file__).resolve().parents[1] / "bench" / "scripts"


def _netem_module():
    import importlib.util

    if "netem_scenario" in sys.modules:
        return sys.modules["netem_scenario"]
    spec = importlib.util.spec_from_file_location("netem_scenario", SCRIPTS / "netem_scenario.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["netem_scenario"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


SCENARIOS = sorted((SCRIPTS / "scenarios").glob("*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_committed_scenarios_are_valid(path: Path) -> None:
    ns = _netem_module()
    sc = ns.load_scenario(path)
    assert sc.name == path.stem and len(sc.devices) >= 2
    # what was loaded is what the file says (json, key by key; absent keys are the documented zeros)
    doc = json.loads(path.read_text())
    assert sc.duration_s == doc["duration_s"] and len({d.name for d in sc.devices}) == len(sc.devices)
    for dev, raw in zip(sc.devices, doc["devices"], strict=True):
        assert (dev.name, dev.memory_mib, dev.threads) == (raw["name"], raw["memory_mib"], raw.get("threads", 1))
        link = raw.get("link", {})
        assert (dev.link.rate_mbit, dev.link.delay_ms, dev.link.jitter_ms, dev.link.loss_pct) == tuple(
            link.get(k, 0) for k in ("rate_mbit", "delay_ms", "jitter_ms", "loss_pct"))


def test_committed_scenarios_cover_the_readmes_networks() -> None:
    """The README's results name a clean LAN, a jittery lossy link and a far one: each is a
    property of some committed scenario's devices, whatever the files are called."""
    ns = _netem_module()
    links = [[d.link for d in ns.load_scenario(p).devices] for p in SCENARIOS]
    assert any(all(ln.loss_pct == 0 and ln.jitter_ms == 0 and ln.delay_ms <= 1 for ln in sc) for sc in links)
    assert any(any(ln.loss_pct > 0 and ln.jitter_ms > 0 for ln in sc) for sc in links)
    assert any(any(ln.delay_ms >= 10 for ln in sc) for sc in links)


@pytest.mark.parametrize(("edit", "match"), [
    ({"devices": []}, "1..32 devices"),
    ({"duration_s": 0}, "duration_s"),
    ({"devices": [{"name": "d0"}]}, "bad scenario"),
    ({"devices": [{"name": "d0", "memory_mib": 10, "link": {"loss_pct": 100}}]}, "bad scenario"),
    ({"devices": [{"name": "d0", "memory_mib": 10, "link": {"speed": 1}}]}, "bad scenario"),
])
def test_bad_scenarios_are_named(tmp_path: Path, edit: dict, match: str) -> None:
    ns = _netem_module()
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "s", "devices": [{"name": "d0", "memory_mib": 10}], **edit}))
    with pytest.raises(ns.ScenarioError, match=match):
        ns.load_scenario(path)


def test_scenario_run_in_namespaces_and_torn_down(tmp_path: Path) -> None:
    """One shaped device in its namespace: reachable from the client namespace at the
    scenario's address, with the scenario's delay; nothing left afterwards."""
    ns = _netem_module()
    caps = ns.check()
    if not caps.get("shaper"):
        pytest.skip(f"network namespaces not usable here: {caps.get('reason')}")
    scenario = tmp_path / "one.json"
    scenario.write_text(json.dumps({"name": "one", "duration_s": 120, "devices": [
        {"name": "d0", "memory_mib": 64, "link": {"rate_mbit": 200, "delay_ms": 5, "jitter_ms": 0, "loss_pct": 0}}]}))
    out = tmp_path / "probe.json"
    client = ("import json, os, sys; from oallama.cluster import probe; "
              "sc = json.load(open(os.environ['OALLAMA_SCENARIO'])); "
              "o = probe.ProbeOptions(payload_bytes=2**16, samples=3, rtt_samples=5, warmup=1, matmul_k=256, "
              "matmul_m=128, tokens=(1,), compute_target_s=0.02, compute_repeats=1); "
              f"json.dump(probe.probe([sc['devices'][0]['endpoint']], o, client=False), open({str(out)!r}, 'w'))")
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    r = subprocess.run([sys.executable, str(SCRIPTS / "netem_scenario.py"), "run", str(scenario), "--workdir",
                        str(tmp_path / "logs"), "--", sys.executable, "-c", client],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    dev = doc["devices"][0]
    assert dev["name"] == f"RPC[{ns.SUBNET}.0.2:{ns.RPC_PORT}]"
    assert dev["link"]["rtt_s"] >= 0.009  # 5 ms each way
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before  # torn down


def test_scenario_time_bound_stops_the_command(tmp_path: Path) -> None:
    ns = _netem_module()
    caps = ns.check()
    if not caps.get("shaper"):
        pytest.skip(f"network namespaces not usable here: {caps.get('reason')}")
    scenario = tmp_path / "one.json"
    scenario.write_text(json.dumps({"name": "one", "duration_s": 60, "devices": [{"name": "d0", "memory_mib": 64}]}))
    r = subprocess.run([sys.executable, str(SCRIPTS / "netem_scenario.py"), "run", str(scenario), "--timeout", "3",
                        "--", "sleep", "60"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 124 and "time bound" in r.stderr
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(ns.PREFIX)]
