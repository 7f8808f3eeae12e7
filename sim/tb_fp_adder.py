"""cocotb testbench of the FP32 adder (:mod:`opentrn.hdl.fp_adder`), and the operand
generator its tests share.

The adder is combinational: every step drives all lanes at once (each port one packed
integer), waits 1 ns and reads the packed sums; the codes are compared with the golden model
(:func:`opentrn.golden.fp_adder.add`) as integers after the run.

The random operands (:func:`random_pairs`) are weighted toward the corners: specials (zeros
of both signs, infinities, NaNs with various payloads, the smallest and largest values),
subnormals, near-cancellation (``b`` close to ``-a``), exponent differences 0..30 and beyond,
deliberate rounding ties, and sums that overflow. :func:`coverage` counts what a run met,
from the operands and the results alone (not from the model's internals).

Run it through :mod:`opentrn.sim.runner`, which passes (as environment variables):

``OPENTRN_VECTORS``   random operand pairs of ``test_random`` (default 10**6);
``OPENTRN_SEED``      seed of the operand generator;
``OPENTRN_REPORT``    a JSON file the tests append their statistics to.
"""

import zlib

import cocotb
import numpy as np
from cocotb.triggers import Timer

from opentrn.golden import fp_adder as golden
from opentrn.hdl.fp_adder import TEST_LANES
from opentrn.numerics import CANONICAL_NAN32, FP32

from . import harness

__all__ = ["SPECIAL_CODES", "KINDS", "random_pairs", "directed_pairs", "reference",
           "coverage", "COVERAGE_CLASSES"]

_MAN = FP32.man_bits
_MAN_MASK = (1 << _MAN) - 1
_EXP_TOP = FP32.exp_max_field
_SIGN = 1 << (FP32.bits - 1)
_MAX_FINITE = FP32.max_finite_bits
_INF = _EXP_TOP << _MAN

#: Notable positive codes; the generators give them either sign.
SPECIAL_CODES = (
    0x00000000,                  # zero
    0x00000001,                  # smallest subnormal
    0x00000002,
    0x007FFFFF,                  # largest subnormal
    0x00800000,                  # smallest normal
    0x00800001,
    0x3F800000,                  # 1.0
    0x3F7FFFFF,                  # 1.0 less one ulp
    0x7F7FFFFF,                  # largest finite
    0x7F7FFFFE,
    0x7F000000,                  # 2**127
    _INF,
    CANONICAL_NAN32,             # quiet NaNs and signalling NaNs with various payloads
    0x7FC00001,
    0x7FFFFFFF,
    0x7F800001,
    0x7FBFFFFF,
    0x7FA5A5A5,
)

#: The kinds of random operand pairs and their weights.
KINDS = {
    "uniform": 0.08,             # any 32-bit codes
    "special": 0.10,             # a notable code with a notable or random code
    "subnormal": 0.12,           # subnormals with subnormals and the smallest normals
    "near_cancellation": 0.15,   # b close to -a: exact and massive cancellation
    "exponent_difference": 0.20,  # exponent differences 0..30
    "tie": 0.20,                 # a half ulp exactly below the result's last bit
    "overflow": 0.08,            # large operands of the same sign
    "wide": 0.07,                # independent random finite operands
}


def _codes(sign, exp, frac):
    return ((sign.astype(np.int64) << 31) | (exp.astype(np.int64) << _MAN)
            | frac.astype(np.int64)).astype(np.uint32)


def _frac(rng, n):
    return rng.integers(0, 1 << _MAN, n)


def _signs(rng, n):
    return rng.integers(0, 2, n)


def _finite(rng, n):
    """Random finite codes: exponents uniform (subnormals included), either sign."""
    return _codes(_signs(rng, n), rng.integers(0, _EXP_TOP, n), _frac(rng, n))


def _special(rng, n):
    """Notable codes, and NaNs with random payloads, either sign."""
    codes = rng.choice(np.array(SPECIAL_CODES, dtype=np.uint32), n)
    nan = _codes(np.zeros(n, np.int64), np.full(n, _EXP_TOP), rng.integers(1, 1 << _MAN, n))
    codes = np.where(rng.random(n) < 0.1, nan, codes)
    return codes | (_signs(rng, n) << 31).astype(np.uint32)


def _uniform(rng, n):
    return (rng.integers(0, 1 << 32, (2, n), dtype=np.uint64).astype(np.uint32))


def _special_pairs(rng, n):
    b = np.where(rng.random(n) < 0.5, _special(rng, n), _finite(rng, n))
    return _special(rng, n), b


def _subnormal(rng, n):
    a = _codes(_signs(rng, n), np.zeros(n, np.int64), _frac(rng, n))
    b = _codes(_signs(rng, n), rng.choice([0, 0, 1, 2], n), _frac(rng, n))
    return a, b


def _near_cancellation(rng, n):
    """``b = -(a + delta)`` with ``delta`` a small random step in code space (zero in one
    case of eight): equal or adjacent exponents, cancelling up to every bit."""
    magnitude = np.where(rng.random(n) < 0.8, rng.integers(1, _EXP_TOP, n) << _MAN, 0) \
        | _frac(rng, n)
    step = rng.integers(-(1 << 24), (1 << 24) + 1, n) >> rng.integers(0, 25, n)
    step = np.where(rng.random(n) < 0.125, 0, step)
    other = np.clip(magnitude + step, 0, _MAX_FINITE)
    sign = _signs(rng, n).astype(np.int64)
    return ((sign << 31) | magnitude).astype(np.uint32), \
        (((1 - sign) << 31) | other).astype(np.uint32)


def _exponent_difference(rng, n):
    exp_a = rng.integers(1, _EXP_TOP, n)
    exp_b = np.maximum(exp_a - rng.integers(0, 31, n), 0)
    return (_codes(_signs(rng, n), exp_a, _frac(rng, n)),
            _codes(_signs(rng, n), exp_b, _frac(rng, n)))


def _tie(rng, n):
    """Exponent difference ``d`` (0..26) and the low bits of ``b``'s significand set to
    ``1 << k`` (``k`` = ``d - 2``, ``d - 1`` or ``d``): the part of ``b`` below ``a``'s last
    bit is exactly a half ulp of the result, whether the sum is normalized as it is, after
    a carry out, or after a one-bit cancellation. The parity of ``a`` is random: ties that
    round down and up."""
    d = rng.integers(0, 27, n)
    exp_a = rng.integers(d + 1, _EXP_TOP)
    exp_b = exp_a - d
    k = np.clip(d - 1 + rng.integers(-1, 2, n), 0, _MAN)
    significand = (1 << _MAN) | _frac(rng, n)
    significand = (significand & ~((2 << k) - 1)) | (1 << k)
    return (_codes(_signs(rng, n), exp_a, _frac(rng, n)),
            _codes(_signs(rng, n), exp_b, significand & _MAN_MASK))


def _overflow(rng, n):
    sign = _signs(rng, n)
    sign_b = np.where(rng.random(n) < 0.9, sign, 1 - sign)
    high = (_MAN_MASK >> 2) + 1      # large fractions: most sums overflow
    frac_a = _MAN_MASK - rng.integers(0, high, n)
    frac_b = np.where(rng.random(n) < 0.5, _MAN_MASK - rng.integers(0, high, n), _frac(rng, n))
    return (_codes(sign, rng.integers(_EXP_TOP - 5, _EXP_TOP, n), frac_a),
            _codes(sign_b, rng.integers(_EXP_TOP - 5, _EXP_TOP, n), frac_b))


_GENERATORS = {
    "uniform": lambda rng, n: tuple(_uniform(rng, n)),
    "special": _special_pairs,
    "subnormal": _subnormal,
    "near_cancellation": _near_cancellation,
    "exponent_difference": _exponent_difference,
    "tie": _tie,
    "overflow": _overflow,
    "wide": lambda rng, n: (_finite(rng, n), _finite(rng, n)),
}
assert set(_GENERATORS) == set(KINDS)


def random_pairs(rng, n):
    """``n`` random operand pairs ``(a, b)`` (uint32 code arrays) of the :data:`KINDS`,
    mixed, each pair in a random order."""
    weights = np.array(list(KINDS.values()))
    kind = rng.choice(len(KINDS), n, p=weights / weights.sum())
    a, b = np.zeros(n, np.uint32), np.zeros(n, np.uint32)
    for index, name in enumerate(KINDS):
        where = np.nonzero(kind == index)[0]
        a[where], b[where] = _GENERATORS[name](rng, len(where))
    swap = rng.random(n) < 0.5
    return np.where(swap, b, a), np.where(swap, a, b)


def directed_pairs():
    """Every pair of :data:`SPECIAL_CODES` with both signs, and hand-picked roundings:
    ties to even down and up (also after a one-bit cancellation and at the largest finite,
    which rounds to infinity), just above and below a half ulp, the subnormal/normal
    boundary both ways, cancellations to ``+0`` and to a single bit, and large exponent
    differences."""
    codes = np.array(SPECIAL_CODES, dtype=np.uint32)
    codes = np.concatenate([codes, codes | np.uint32(_SIGN)])
    a, b = np.meshgrid(codes, codes)
    picked = [
        (0x3F800000, 0x33800000),    # 1 + 2**-24: tie, rounds down to 1 (even)
        (0x3F800001, 0x33800000),    # (1 + 2**-23) + 2**-24: tie, rounds up
        (0x3F800000, 0x33800001),    # just above the half: up
        (0x3F800001, 0x337FFFFF),    # just below the half: down
        (0x3F800000, 0xB3000000),    # 1 - 2**-25: tie after a one-bit cancellation, to 1
        (0x3F800000, 0xB3400000),    # 1 - 1.5 * 2**-25: above the half, down to 1 - 2**-24
        (0x7F7FFFFF, 0x73000000),    # largest + half ulp: tie, odd, rounds to infinity
        (0x7F7FFFFF, 0x72FFFFFF),    # largest + just under half ulp: largest
        (0x7F7FFFFF, 0x7F7FFFFF),    # overflow
        (0xFF7FFFFF, 0xFF000000),    # negative overflow
        (0x00800000, 0x80000001),    # smallest normal - smallest subnormal: subnormal
        (0x007FFFFF, 0x00000001),    # largest subnormal + smallest subnormal: normal
        (0x00400000, 0x00400000),    # two subnormals make the smallest normal
        (0x00800001, 0x80800000),    # normal - normal: smallest subnormal
        (0x3F800000, 0xBF7FFFFF),    # 1 - (1 - 2**-24): 24 bits cancel
        (0x3F800000, 0xBF800000),    # 1 - 1 = +0
        (0xBF800000, 0x3F800000),    # -1 + 1 = +0
        (0x00000001, 0x80000001),    # +0 from subnormals
        (0x3F800000, 0x0D800000),    # 1 + 2**-100: 1
        (0x3F800000, 0x8D800000),    # 1 - 2**-100: 1
        (0x4B800000, 0x3F800000),    # 2**24 + 1: tie, down
        (0x4B800001, 0x3F800000),    # (2**24 + 2) + 1: tie, up
        (0x4B7FFFFF, 0x3F800000),    # (2**24 - 1) + 1 = 2**24 exactly, carry out
        (0x3FFFFFFF, 0x3F800000),    # (2 - 2**-23) + 1: carry out, tie, up to 3
        (0x4B7FFFFF, 0x3F000000),    # (2**24 - 1) + 0.5: tie, up to 2**24 (next binade)
    ]
    a = np.concatenate([a.ravel(), np.array([p[0] for p in picked], np.uint32)])
    b = np.concatenate([b.ravel(), np.array([p[1] for p in picked], np.uint32)])
    # Both orders, and the picked ones negated.
    a, b = np.concatenate([a, b]), np.concatenate([b, a])
    return np.concatenate([a, a ^ np.uint32(_SIGN)]), np.concatenate([b, b ^ np.uint32(_SIGN)])


def reference(a, b):
    """The independent reference: numpy ``float32`` addition (no flush to zero), a NaN
    result made the canonical NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = a.view(np.float32) + b.view(np.float32)
    codes = total.view(np.uint32).copy()
    codes[np.isnan(total)] = CANONICAL_NAN32
    return codes


#: What :func:`coverage` counts, besides ``pairs``.
COVERAGE_CLASSES = ("subnormal_results", "infinite_results", "nan_results", "zero_results",
                    "exact_cancellations", "massive_cancellations", "ties_up", "ties_down",
                    "overflows")


def coverage(a, b, result):
    """What the operand pairs ``(a, b)`` with results ``result`` (codes) exercise:

    * results that are subnormal, infinite, NaN, zero;
    * ``exact_cancellations``: finite nonzero operands whose sum is zero;
    * ``massive_cancellations``: operands of opposite signs whose nonzero finite sum has
      its leading bit 8 or more binades below the larger operand's (8 or more bits lost);
    * ``ties_up``/``ties_down``: the exact sum (float64 with the TwoSum error zero) lies
      exactly halfway between two FP32 neighbours and rounds away from or toward zero;
    * ``overflows``: finite operands with an infinite sum.
    """
    with np.errstate(invalid="ignore"):        # casting signalling NaNs
        x = a.view(np.float32).astype(np.float64)
        y = b.view(np.float32).astype(np.float64)
        r = result.view(np.float32).astype(np.float64)
    exponent_field = (result >> _MAN) & _EXP_TOP
    finite = np.isfinite(x) & np.isfinite(y)
    nonzero = finite & (x != 0) & (y != 0)

    with np.errstate(invalid="ignore", over="ignore"):
        exact = x + y
        # TwoSum: the rounding error of the float64 sum, exactly.
        virtual = exact - x
        error = (x - (exact - virtual)) + (y - virtual)
    representable = finite & (error == 0) & (exact != 0)
    safe = np.where(representable, exact, 1.0)
    _, lead = np.frexp(safe)
    # Scale the last FP32 bit (2**(lead - 24), 2**-149 for subnormals) to 2: a tie is an odd
    # multiple of half of it.
    scaled = np.ldexp(safe, np.minimum(25 - lead, 150))
    tie = representable & (np.abs(np.fmod(scaled, 2)) == 1)
    away = np.abs(r) > np.abs(safe)

    _, lead_x = np.frexp(np.where(nonzero, x, 1.0))
    _, lead_y = np.frexp(np.where(nonzero, y, 1.0))
    _, lead_r = np.frexp(np.where(np.isfinite(r), r, 1.0))
    cancelling = nonzero & (np.signbit(x) != np.signbit(y)) & np.isfinite(r) & (r != 0)
    return {
        "pairs": int(a.size),
        "subnormal_results": int(np.sum((exponent_field == 0) & ((result & _MAN_MASK) != 0))),
        "infinite_results": int(np.sum(np.isinf(r))),
        "nan_results": int(np.sum(result == CANONICAL_NAN32)),
        "zero_results": int(np.sum(r == 0)),
        "exact_cancellations": int(np.sum(nonzero & (r == 0))),
        "massive_cancellations": int(np.sum(
            cancelling & (np.maximum(lead_x, lead_y) - lead_r >= 8))),
        "ties_up": int(np.sum(tie & away)),
        "ties_down": int(np.sum(tie & ~away)),
        "overflows": int(np.sum(finite & np.isinf(r))),
    }


# -- the bench --------------------------------------------------------------------------------

def _pack(codes):
    return int.from_bytes(codes.astype("<u4").tobytes(), "little")


def _unpack(value, lanes):
    return np.frombuffer(value.to_bytes(4 * lanes, "little"), dtype="<u4").astype(np.uint32)


async def _apply(dut, a, b):
    """Drive the pairs through the adder, ``TEST_LANES`` per step; return the sums."""
    lanes = TEST_LANES
    assert len(dut.a) == 32 * lanes, f"the adder has {len(dut.a) // 32} lanes, not {lanes}"
    pad = -len(a) % lanes
    a = np.concatenate([a, np.zeros(pad, np.uint32)])
    b = np.concatenate([b, np.zeros(pad, np.uint32)])
    out = np.zeros(len(a), np.uint32)
    for start in range(0, len(a), lanes):
        dut.a.value = _pack(a[start:start + lanes])
        dut.b.value = _pack(b[start:start + lanes])
        await Timer(1, "ns")
        out[start:start + lanes] = _unpack(dut.sum.value.to_unsigned(), lanes)
    return out[:len(out) - pad]


async def _run(dut, name, a, b):
    got = await _apply(dut, a, b)
    want = golden.add(a, b)
    wrong = np.nonzero(got != want)[0]
    for index in wrong[:5]:
        dut._log.error("pair %d: %08x + %08x = %08x, expected %08x", index, a[index],
                       b[index], got[index], want[index])
    record = {"test": name, "vectors": int(a.size), "mismatches": int(wrong.size),
              # The golden model against the independent reference, on the same pairs.
              "reference_mismatches": int(np.sum(want != reference(a, b))),
              **coverage(a, b, want)}
    harness.report(record)
    assert wrong.size == 0, f"{wrong.size} of {a.size} sums differ from the golden model"
    return record


@cocotb.test()
async def test_directed(dut):
    """Every pair of notable codes, and hand-picked roundings, bit-exact."""
    await _run(dut, "directed", *directed_pairs())


@cocotb.test()
async def test_random(dut):
    """Corner-weighted random pairs (:func:`random_pairs`), bit-exact."""
    seed, vectors = harness.setting("seed", 1), harness.setting("vectors", 10**6)
    rng = np.random.default_rng([seed, zlib.crc32(b"random")])
    await _run(dut, "random", *random_pairs(rng, vectors))
