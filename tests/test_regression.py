"""The scripts compute what they computed before the rewrite around leanrl/bookkeeping.py: seeded tiny CPU runs of
every script (tests/regression.py lists them) against the numbers recorded at the commit before it."""

import json

import pytest
from regression import CASES, GOLDEN, cpu_golden, golden_numbers, numbers


def same(got, want, path="run"):
    """Equal numbers, floats to float32 rounding: a changed action, update or episode changes far more."""
    if isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), path
    elif isinstance(want, dict):
        assert set(got) == set(want), path
        for key in want:
            same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


# --compile cases compile every twin: minutes on CI's 2 cores, so they run with -m slow
PARAMS = [pytest.param(*case, marks=[pytest.mark.slow] if "--compile" in case[2] else []) for case in CASES]


@pytest.mark.parametrize("case,script,flags", PARAMS, ids=[case for case, _, _ in CASES])
def test_same_numbers_as_before_the_rewrite(case, script, flags, tmp_path):
    want = golden_numbers()[case]
    same(numbers(script, flags, tmp_path), want)


def test_a_cpu_model_with_its_own_numbers_overrides_only_its_cases():
    reference = json.loads(GOLDEN.read_text())
    epyc = golden_numbers("AMD EPYC")
    own = json.loads(cpu_golden("AMD EPYC").read_text())
    assert set(epyc) == set(reference) and own and set(own) < set(reference)
    assert all(epyc[case] == own[case] for case in own)
    assert all(epyc[case] == reference[case] for case in set(reference) - set(own))
    assert golden_numbers("Some Other CPU") == reference
