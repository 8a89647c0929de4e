# budget_fakequant_mp.py: board/budget.py with a stand-in microformer.quant whose int8(model)
# converts nothing and says what it was given (the frozen weight matrices of an adapted model), so
# the int8 row's path runs before the package has the real module.
#   micropython budget_fakequant_mp.py ACTION MODEL MODE CHECKPOINT [N] [DATA_DIR] [ADAPTER]
import sys

import microformer
from microformer import lora


class _FakeQuant:
    calls = 0

    @staticmethod
    def int8(model):
        _FakeQuant.calls += 1
        frozen = 0
        for p, g in model.params():
            if g.data is None and len(p.shape) == 2:
                frozen += p.size
        print("FAKEQUANT call %d adapters %d frozen_matrix_floats %d" % (
            _FakeQuant.calls, len(lora.adapters(model)), frozen))


microformer.quant = _FakeQuant
import budget  # noqa: E402

budget.main(sys.argv[1:])
