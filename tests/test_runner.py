"""The simulator runner's build policy, without building: which C++ optimization a Verilator
model gets, and which prebuilt run-time objects a cache keeps for the next models."""

from opentrn.sim import runner


def test_optimization_by_top_and_tracing(monkeypatch):
    monkeypatch.delenv("OPENTRN_VERILATOR_OPT", raising=False)
    assert runner.verilator_optimization("core_with_memory") == "-O2"
    assert runner.verilator_optimization("core") == "-O1"
    assert runner.verilator_optimization("tensor_engine") == "-O1"
    for top in runner.UNIT_TOPS:
        assert runner.verilator_optimization(top) == "-O0"
    assert runner.verilator_optimization("core_with_memory", waves=True) == "-O0"
    monkeypatch.setenv("OPENTRN_VERILATOR_OPT", "-O3")
    assert runner.verilator_optimization("fp_adder") == "-O3"


def _fake_build(folder, names):
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(name.encode())
    return folder


def test_a_model_that_does_not_trace_leaves_its_runtime_for_the_next(tmp_path, monkeypatch):
    """A model without waves has no VCD writer among its run-time objects: its four are
    kept (they once were not, because the VCD writer was required too, so every such
    model compiled the library again); a tracing model needs the VCD writer as well."""
    monkeypatch.setenv("OPENTRN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "verilator").mkdir(parents=True)
    plain = _fake_build(tmp_path / "plain", runner._runtime_objects(False))
    assert "verilated_vcd_c.o" not in runner._runtime_objects(False)
    assert not runner._verilator_runtime(False).exists()
    runner._keep_verilator_runtime(plain, False)
    kept = runner._verilator_runtime(False)
    assert sorted(path.name for path in kept.iterdir()) == sorted(runner._runtime_objects(False))
    # The tracing models' library is another: not made from a build without the VCD writer.
    runner._keep_verilator_runtime(plain, True)
    assert not runner._verilator_runtime(True).exists()
    traced = _fake_build(tmp_path / "traced", runner._runtime_objects(True))
    runner._keep_verilator_runtime(traced, True)
    assert sorted(path.name for path in runner._verilator_runtime(True).iterdir()) == \
        sorted(runner._runtime_objects(True))
    # The first one kept stays.
    runner._keep_verilator_runtime(traced, False)
    assert (kept / "verilated.o").read_bytes() == b"verilated.o"
