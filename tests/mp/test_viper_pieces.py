"""The block-float GEMM holds a large operand's quantized rows in pieces of bounded scratch:
bit for bit the product computed whole, on both ports (tests/mp/viper_pieces_mp.py)."""
import helpers


def test_gemm_pieces_bit_identical_and_bounded(micropython):
    out = helpers.run_micropython(helpers.script("viper_pieces_mp.py"), heap="16M", exe=micropython)
    assert "PIECES ok 6" in out, out
