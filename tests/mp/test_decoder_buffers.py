"""DecoderBlock and Transformer: freezing parts (frozen grads stay 0, the others equal an unfrozen
model's, flags unchanged) and buffer reuse incl. cached decoding; CPython and MicroPython."""
import pytest

import helpers

SCRIPT = helpers.script("decoder_buffers_mp.py")


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_decoder_buffers_cpython(backend):
    out = helpers.run_cpython(SCRIPT, backend)
    assert "freeze ok" in out and "block buffers ok" in out and "DECODER OK" in out


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_decoder_buffers_micropython(micropython, backend):
    out = helpers.run_micropython(SCRIPT, backend, exe=micropython, heap="8M")
    assert "freeze ok" in out and "block buffers ok" in out and "DECODER OK" in out
