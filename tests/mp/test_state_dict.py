"""state_dict names and load_state_dict inside MicroPython (both interpreters) and CPython."""
import json

import helpers

SCRIPT = helpers.script("state_dict_mp.py")
KEYS = ["0.weight",
        "1.self_attn.in_proj_weight", "1.self_attn.in_proj_bias",
        "1.self_attn.out_proj.weight", "1.self_attn.out_proj.bias",
        "1.linear1.weight", "1.linear1.bias", "1.linear2.weight", "1.linear2.bias",
        "1.norm1.weight", "1.norm1.bias", "1.norm2.weight", "1.norm2.bias",
        "2.weight", "2.bias", "3.weight", "3.bias"]


def _check(out):
    assert out["keys"] == KEYS                 # nn.Sequential(nn.Embedding, nn.TransformerEncoderLayer, ...)
    assert out["shapes"][1] == [12, 4] and out["shapes"][2] == [12]
    assert "'3.bias'" in out["bad"] and "[6]" in out["bad"] and "[7]" in out["bad"]
    assert out["untouched"] and out["equal"] and out["same_output"]


def test_state_dict_cpython():
    _check(json.loads(helpers.run_cpython(SCRIPT)))


def test_state_dict_micropython(micropython):
    _check(json.loads(helpers.run_micropython(SCRIPT, exe=micropython)))
