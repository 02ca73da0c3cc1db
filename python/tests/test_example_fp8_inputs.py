"""examples/fp8_inputs.py runs and its FP8-input calls are as accurate as recipe fp8 on bf16.

The example quantizes bf16 inputs to float8_e4m3fn with a descale per head (per sequence when
packed) and calls flash_attn_func and flash_attn_varlen_func; each output is compared with
fp64 attention of the bf16 inputs. A descale applied to the wrong head or sequence would put
the error far past recipe fp8's own (about 4-5 % here).
"""

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "fp8_inputs.py"


def test_example_runs_and_matches_the_recipe():
    spec = importlib.util.spec_from_file_location("fp8_inputs_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    errors = example.main(["--device", "cpu", "--small"])
    recipe = errors["flash_attn_func, bf16 inputs"]
    assert recipe < 0.08
    assert errors["flash_attn_func, FP8 inputs"] < 1.5 * recipe
    assert errors["flash_attn_varlen_func, FP8 inputs"] < 1.5 * recipe
