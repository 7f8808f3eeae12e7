import json

import pytest

from opentrn import config
from opentrn.config import Config, ConfigError


@pytest.mark.parametrize("name", list(config.PRESETS))
def test_presets_are_valid_and_round_trip(name, tmp_path):
    cfg = config.preset(name)
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert config.resolve(file=path) == cfg
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_small_presets():
    assert (config.preset("tiny").pe_rows, config.preset("tiny").pe_cols) == (4, 4)
    assert (config.preset("small").pe_rows, config.preset("small").pe_cols) == (8, 8)
    assert (config.preset("fpga").pe_rows, config.preset("fpga").pe_cols) == (4, 4)
    assert config.resolve() == config.preset("tiny")


@pytest.mark.parametrize("name, core, chip, system", [
    ("trn2", "v3", "trainium2", "trn2_ultraserver"),
    ("trn3", "v4", "trainium3", "trn3_ultraserver"),
])
def test_trainium_presets_carry_the_published_figures(name, core, chip, system):
    core_name, chip_name, system_name = core, chip, system
    ref = config.reference()
    core, chip, system = ref["neuroncore"][core], ref["chip"][chip], ref["system"][system]
    cfg = config.preset(name)
    assert (cfg.pe_rows, cfg.pe_cols) == (core["pe_rows"], core["pe_cols"]) == (128, 128)
    assert cfg.clock_hz == core["tensor_clock_ghz"] * 1e9 == 2.4e9
    assert cfg.sbuf_partitions * cfg.sbuf_bytes_per_partition == \
        128 * core["sbuf_kib_per_partition"] * 1024
    # PSUM: 2 MiB = 128 partitions x 8 banks x 512 FP32 entries.
    assert cfg.pe_cols * cfg.psum_banks * cfg.psum_bank_entries * cfg.acc_bits // 8 == \
        128 * core["psum_kib_per_partition"] * 1024 == 2 * 1024 * 1024
    assert cfg.dma_engines == core["dma_engines"] == 16
    assert cfg.cores_per_chip == chip["cores"] == 8
    assert cfg.hbm_bytes == chip["hbm_gib"] * 2**30
    assert cfg.hbm_bytes_per_s == chip["hbm_tb_s"] * 1e12
    assert cfg.link_bytes_per_s == chip["link_tb_s"] * 1e12
    assert cfg.chips_per_server == system["chips"]
    # The projection compares the preset against these same tables.
    assert config.PUBLISHED[name] == (core_name, chip_name, system_name)


def test_trn3_sizes():
    cfg = config.preset("trn3")
    assert cfg.sbuf_partitions * cfg.sbuf_bytes_per_partition == 32 * 2**20
    assert cfg.chips_per_server == 144


def test_resolution_order(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('preset = "small"\nmoving_max = 8\npsum_banks = 2\n')
    cfg = config.resolve(file=path, overrides=["moving_max=4"])
    assert (cfg.pe_rows, cfg.psum_banks, cfg.moving_max) == (8, 2, 4)
    # --preset beats the file's preset key; the file's keys still apply.
    cfg = config.resolve("tiny", path)
    assert (cfg.pe_rows, cfg.moving_max) == (4, 8)


def test_override_parsing():
    cfg = config.resolve("tiny", overrides=["clock_hz=2.4e9", "hbm_bytes=0x200000",
                                             "link_bytes_per_s=1e9", "dtypes=int8,bf16"])
    assert cfg.dtypes == ("int8", "bf16") and cfg.in_bits == 16
    assert cfg.clock_hz == 2_400_000_000 and isinstance(cfg.clock_hz, int)
    assert cfg.hbm_bytes == 2 * 2**20
    assert cfg.link_bytes_per_s == 1e9


@pytest.mark.parametrize("override, message", [
    ("pe_rows=6", "pe_rows=6: must be a power of two between 2 and 256"),
    ("pe_cols=512", "pe_cols=512: must be a power of two between 2 and 256"),
    ("pe_rows=1", "pe_rows=1: must be a power of two"),
    ("dtypes=int4", "dtypes=('int4',): must be a non-empty list of int8, bf16, fp8e4m3, "
                    "fp8e5m2, mxfp8e4m3, mxfp8e5m2"),
    ("dtypes=", "dtypes=(): must be a non-empty list of"),
    ("dtypes=bf16,bf16", "dtypes=('bf16', 'bf16'): must not repeat a format"),
    ("dtype=int8", "dtype: unknown configuration key; it is now dtypes"),
    ("pe_multiply_stages=5", "pe_multiply_stages=5: must be between 0 and 4"),
    ("pe_add_stages=5", "pe_add_stages=5: must be between 0 and 4"),
    ("pe_input_stages=3", "pe_input_stages=3: must be 0, 1 or 2"),
    ("sbuf_input_stages=3", "sbuf_input_stages=3: must be 0, 1 or 2"),
    ("activation_add_stages=-1", "activation_add_stages=-1: must be between 0 and 4"),
    ("psum_add_stages=5", "psum_add_stages=5: must be between 0 and 4"),
    ("activation_multiply_stages=3", "activation_multiply_stages=3: must be 0, 1 or 2"),
    ("activation_input_stages=3", "activation_input_stages=3: must be 0, 1 or 2"),
    ("activation_input_stages=-1", "activation_input_stages=-1: must be 0, 1 or 2"),
    ("fast_weight_load=3", "fast_weight_load=3: must be 0, 1 or 2"),
    ("moving_max=0", "moving_max=0: must be between 1 and psum_bank_entries=16"),
    ("moving_max=17", "moving_max=17: must be between 1 and psum_bank_entries=16"),
    ("sbuf_partitions=8", "sbuf_partitions=8: must equal pe_rows=4"),
    ("sbuf_bytes_per_partition=100", "sbuf_bytes_per_partition=100: must be a multiple of 64"),
    ("psum_banks=3", "psum_banks=3: must be a power of two"),
    ("psum_bank_entries=24", "psum_bank_entries=24: must be a power of two"),
    ("dma_bus_bytes=3", "dma_bus_bytes=3: must be a power of two between 4 and 128"),
    ("dma_engines=0", "dma_engines=0: must be between 1 and 64"),
    ("hbm_bytes=1000", "hbm_bytes=1000: must be a multiple of 4096"),
    ("clock_hz=0", "clock_hz=0: must be positive"),
    ("cores_per_chip=0", "cores_per_chip=0: must be at least 1"),
    ("hbm_bytes_per_s=-1", "hbm_bytes_per_s=-1.0: must be positive and finite"),
    ("hbm_bytes_per_s=inf", "hbm_bytes_per_s=inf: must be positive and finite"),
    ("hbm_bytes_per_s=nan", "hbm_bytes_per_s=nan: must be positive and finite"),
    ("link_bytes_per_s=inf", "link_bytes_per_s=inf: must not be negative, and finite"),
    ("chips_per_server=4", "link_bytes_per_s=0.0: must be positive when chips_per_server=4"),
    ("pe_rows=four", "pe_rows='four': must be an integer"),
    ("clock_hz=1.5", "clock_hz='1.5': must be an integer"),
    ("colour=red", "colour: unknown configuration key"),
    ("pe_rows", "'pe_rows': an override must have the form key=value"),
])
def test_errors_name_the_field_value_and_rule(override, message):
    with pytest.raises(ConfigError) as info:
        config.resolve("tiny", overrides=[override])
    assert message in str(info.value)


def test_pe_add_stages_need_one_mac_a_cycle():
    """The adder's cuts pipeline one product's add; a PE of several products a cycle adds
    them in a chain, which is not cut: refused, naming the formats."""
    with pytest.raises(ConfigError, match=r"pe_add_stages=1: needs one MAC per PE per cycle "
                       r"in every format, and mxfp8e4m3, mxfp8e5m2 have more"):
        config.resolve("trn3", overrides=["pe_add_stages=1"])
    with pytest.raises(ConfigError, match=r"and fp8e4m3 has more"):
        config.resolve("tiny", overrides=["pe_add_stages=2", "pe_macs_per_cycle=fp8e4m3:2"])
    assert config.resolve("tiny", overrides=["pe_add_stages=2"]).pe_add_stages == 2


@pytest.mark.parametrize("acc_bits", [12, 33])
def test_integer_accumulators_are_16_to_32_bits(acc_bits):
    with pytest.raises(ConfigError, match=f"acc_bits={acc_bits}: must be between 16"):
        config.resolve("small", overrides=[f"acc_bits={acc_bits}"])


def test_float_dtypes_need_fp32_accumulation():
    with pytest.raises(ConfigError, match="acc_bits=16: must be 32 .FP32 accumulation. "
                                          "when dtypes includes bf16"):
        config.resolve("tiny", overrides=["dtypes=int8,bf16", "acc_bits=16"])
    assert config.resolve("tiny", overrides=["dtypes=int8", "acc_bits=16"]).acc_bits == 16


def test_dtypes_round_trip_through_toml_and_json(tmp_path):
    cfg = config.preset("trn3")
    path = tmp_path / "trn3.toml"
    path.write_text(cfg.to_toml())
    assert 'dtypes = ["bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2"]' in cfg.to_toml()
    assert config.resolve("tiny", path) == cfg
    assert config.Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_bad_types_and_keys_from_python():
    with pytest.raises(ConfigError, match="pe_rows=4.0: must be of type int"):
        config.preset("tiny").replace(pe_rows=4.0)
    with pytest.raises(ConfigError, match="frequency: unknown configuration key"):
        Config.from_dict({**config.preset("tiny").to_dict(), "frequency": 1})
    with pytest.raises(ConfigError, match="pe_cols: missing configuration key"):
        values = config.preset("tiny").to_dict()
        del values["pe_cols"]
        Config.from_dict(values)
    with pytest.raises(ConfigError, match="preset='huge': must be one of tiny, small"):
        config.preset("huge")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file=.*missing.toml': no such file"):
        config.resolve(file=tmp_path / "missing.toml")


@pytest.mark.parametrize("text, message", [
    ("pe_rows = [", "not valid TOML"),
    ("pe_rowz = 4\n", "pe_rowz: unknown configuration key"),
    ("[core]\npe_rows = 4\n", "core: tables are not configuration keys"),
    ('pe_rows = "8"\n', "pe_rows='8': must be of type int"),
])
def test_file_errors(tmp_path, text, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.resolve(file=bad)


def test_digest_tracks_every_field():
    tiny = config.preset("tiny")
    assert tiny.digest() == config.preset("tiny").digest()
    assert tiny.digest() != tiny.replace(dtypes=("int8",)).digest()



@pytest.mark.parametrize("overrides, message, whole", [
    (["dma_bus_bytes=128", "sbuf_bytes_per_partition=192"],
     "sbuf_bytes_per_partition=192: must be a multiple of dma_bus_bytes=128",
     ["dma_bus_bytes=128", "sbuf_bytes_per_partition=256"]),
    (["psum_banks=1", "psum_bank_entries=1", "moving_max=1"],
     "psum_bank_entries=1: psum_banks * psum_bank_entries * 4 = 4 bytes must be a multiple "
     "of dma_bus_bytes=8",
     ["psum_banks=1", "psum_bank_entries=2", "moving_max=1"]),
])
def test_buffers_are_whole_bus_words(overrides, message, whole):
    with pytest.raises(ConfigError) as info:
        config.resolve("tiny", overrides=overrides)
    assert message in str(info.value)
    # Whole bus words are accepted.
    config.resolve("tiny", overrides=whole)


# -- pe_macs_per_cycle --------------------------------------------------------------------------

def test_pe_macs_per_cycle_of_the_presets():
    # The ratios of the published per-core figures (reference file): v3 fp8 158 = 2 x bf16 79,
    # v4 mxfp8 315 = 4 x 79; v4's plain FP8 rate is not published and stays 1.
    assert config.preset("trn2").pe_macs_per_cycle == ("fp8e4m3:2", "fp8e5m2:2")
    assert config.preset("trn3").pe_macs_per_cycle == ("mxfp8e4m3:4", "mxfp8e5m2:4")
    trn3 = config.preset("trn3")
    assert [trn3.macs_per_pe_cycle(fmt) for fmt in trn3.dtypes] == [1, 1, 1, 4, 4]
    for name in ("tiny", "small", "fpga"):
        cfg = config.preset(name)
        assert cfg.pe_macs_per_cycle == ()
        assert {cfg.macs_per_pe_cycle(fmt) for fmt in cfg.dtypes} == {1}


def test_macs_per_pe_cycle_refuses_a_format_outside_dtypes():
    with pytest.raises(ConfigError, match="format='int8': not among this build's formats, "
                                          "dtypes=bf16,fp8e4m3,fp8e5m2"):
        config.preset("trn2").macs_per_pe_cycle("int8")


@pytest.mark.parametrize("value, message", [
    ("int4:2", "pe_macs_per_cycle=('int4:2',): 'int4:2' names a format not in dtypes=int8,"),
    ("int8", "pe_macs_per_cycle=('int8',): 'int8' must have the form format:count"),
    ("bf16:two", "'bf16:two' must have the form format:count with an integer count"),
    ("bf16:3", "pe_macs_per_cycle=('bf16:3',): 'bf16:3' must have a count that is a power of "
               "two from 1 to 16"),
    ("bf16:0", "'bf16:0' must have a count that is a power of two from 1 to 16"),
    ("bf16:32", "'bf16:32' must have a count that is a power of two from 1 to 16"),
    ("bf16:2,bf16:4", "pe_macs_per_cycle=('bf16:2', 'bf16:4'): 'bf16:4' repeats the format "
                      "bf16 (each format at most once)"),
])
def test_pe_macs_per_cycle_rules(value, message):
    with pytest.raises(ConfigError) as info:
        config.resolve("tiny", overrides=[f"pe_macs_per_cycle={value}"])
    assert message in str(info.value)


def test_pe_macs_per_cycle_types_from_python():
    tiny = config.preset("tiny")
    with pytest.raises(ConfigError, match="pe_macs_per_cycle='bf16:2': must be a list of "
                                          "format:count items"):
        tiny.replace(pe_macs_per_cycle="bf16:2")
    with pytest.raises(ConfigError, match=r"pe_macs_per_cycle=\(2,\): 2 must be a string"):
        tiny.replace(pe_macs_per_cycle=(2,))
    # Dropping a format from dtypes that still has a rate is refused.
    with pytest.raises(ConfigError, match="'mxfp8e4m3:4' names a format not in dtypes=bf16"):
        config.resolve("trn3", overrides=["dtypes=bf16"])


def test_pe_macs_per_cycle_round_trips_through_set_toml_and_json(tmp_path):
    cfg = config.resolve("tiny", overrides=["pe_macs_per_cycle=fp8e4m3:2, bf16:1"])
    assert cfg.pe_macs_per_cycle == ("fp8e4m3:2", "bf16:1")
    assert (cfg.macs_per_pe_cycle("fp8e4m3"), cfg.macs_per_pe_cycle("bf16"),
            cfg.macs_per_pe_cycle("int8")) == (2, 1, 1)
    assert 'pe_macs_per_cycle = ["fp8e4m3:2", "bf16:1"]' in cfg.to_toml()
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert config.resolve(file=path) == cfg
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.digest() != config.preset("tiny").digest()
    # An empty value clears the list (what the hardware needs of trn2/trn3).
    assert config.resolve("trn3", overrides=["pe_macs_per_cycle="]).pe_macs_per_cycle == ()


def test_the_hardware_builds_mac_rates_above_one():
    """Every preset builds, its MAC rates included (a PE does ``r`` MACs per cycle on ``r``
    consecutive elements of K); what the hardware cannot build is refused by name."""
    from opentrn.hdl import check
    for name in config.PRESETS:
        check("tensor_engine", config.preset(name))
        check("core", config.preset(name))
    cfg = config.resolve("tiny", overrides=["pe_macs_per_cycle=fp8e4m3:2"])
    assert cfg.in_bits == 16 and check("core", cfg) is None
    with pytest.raises(ConfigError) as info:
        check("core", cfg.replace(pe_macs_per_cycle=("bf16:8",)))
    assert str(info.value) == (
        "pe_macs_per_cycle=bf16:8: a column of bf16 is 8 x 2 = 16 bytes, more than one SBUF "
        "vector word (8 bytes: dma_bus_bytes=8, at most 32): the hardware reads a column "
        "from one")
    # The widest column there is (16 BF16 elements, 32 bytes) fits a 32-byte vector word:
    # a 64-byte bus's.
    assert check("core", cfg.replace(dma_bus_bytes=64, pe_macs_per_cycle=("bf16:16",))) is None


def test_any_file_is_a_configuration_or_a_config_error(tmp_path):
    """Hypothesis: arbitrary bytes, and TOML built from real keys with values of every type,
    given as ``--file`` resolve to a Config or raise ConfigError; never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    path = tmp_path / "fuzz.toml"
    keys = st.sampled_from([*config.Config.__dataclass_fields__, "preset", "wibble"])
    values = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                       st.booleans(), st.text(max_size=12),
                       st.lists(st.text(max_size=8), max_size=3))

    def toml_value(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
        if isinstance(value, str | list):
            return json.dumps(value)
        return str(value)

    @settings(max_examples=250, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(raw=st.binary(max_size=64), table=st.dictionaries(keys, values, max_size=4))
    def check(raw, table):
        for content in (raw, "\n".join(f"{key} = {toml_value(value)}"
                                       for key, value in table.items()).encode()):
            path.write_bytes(content)
            try:
                assert isinstance(config.resolve(None, str(path)), config.Config)
            except config.ConfigError:
                pass

    check()
    # What it found first: `preset = [""]` was a TypeError (unhashable list).
    path.write_text('preset = [""]\n')
    with pytest.raises(ConfigError, match=r"preset=\[''\]: must be one of tiny, small"):
        config.resolve(None, str(path))
