# microformer: train and fine-tune small attention models on a microcontroller.
# Forward and backward passes on array('f') buffers; the same code under CPython and MicroPython.
__version__ = "0.5.0"

from .tensor import Tensor, Rng, seed, xavier_uniform, settle_gc, unsettle_gc

# Importing leaves garbage (the files' read buffers, ...) among the code it keeps: on MicroPython
# the GC collects every tensor.SETTLE_GC_BYTES meanwhile, so the code lands together and the free
# heap stays in large blocks (32-bit port, `import finetune` with the modules as .mpy in a 200K
# heap: the largest free block 27.6 KB of 78.8 KB free without it, 76.8 KB of 79.9 KB with it)
_gc = settle_gc()
try:
    from .backend import set_backend, get_backend, available as available_backends
    from .dense import Dense
    from .attention import Attention
    from .pool import GlobalAvgPool
    from .activation import ActivationLayer
    from .reshape import Reshape
    from .model import Sequential
    from .finite import NonFiniteError
    from .loss import CrossEntropyLoss, MSELoss, NonFiniteLossError, softmax_cross_entropy, mse
finally:
    unsettle_gc(_gc)
    del _gc


# Imported on first use (a board without PSRAM has a small heap): the names in _LAZY (modules
# mf.data, mf.train, mf.spec, mf.checkpoint; the optimizers, which a program that only runs a model
# never loads; functions, the checkpoint's save/load and error,
# the sequence layers and decoding, and the rarer layers, Dropout among them), and any other submodule.
_LAZY = {"Dropout": "dropout", "SGD": "optim", "Adam": "optim", "clip_grad_norm": "optim", "data": "data", "train": "train", "spec": "spec", "to_spec": "spec", "from_spec": "spec",
         "load_model": "checkpoint", "StreamingEncoder": "stream", "show": "heatmap",
         "DecoderBlock": "decoder", "Transformer": "decoder", "Conv1D": "conv",
         "MaxPool1D": "pool1d", "AvgPool1D": "pool1d", "LearnedPositionalEmbedding": "posembed",
         "add_lora": "lora", "merge_lora": "lora", "freeze_except": "lora",
         "checkpoint": "checkpoint", "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint",
         "CheckpointError": "checkpoint", "LayerNorm": "norm", "FeedForward": "feedforward",
         "Embedding": "embedding", "PositionalEncoding": "posenc", "EncoderBlock": "block",
         "prefill": "block", "decode_step": "block", "kv_bytes_per_token": "block"}
_ALIAS = {"save_checkpoint": "save", "load_checkpoint": "load"}     # lazy names bound to another name
_MODULES = ("data", "train", "spec", "checkpoint")                  # lazy names that are modules


def __getattr__(name):
    # a lazy name, or any submodule (`from microformer import golden` comes here on MicroPython)
    import sys
    from .lazy import bind, module
    mod = _LAZY.get(name, name)
    full = "microformer." + mod
    try:
        m = module(full)
    except ImportError as e:
        # no such submodule: no such attribute; an import failing inside the module is that
        # module's error, its message kept in the text (MicroPython keeps no chained cause;
        # CPython chains it as the context)
        if full not in sys.modules and full in str(e) and name == mod:
            raise AttributeError("module 'microformer' has no attribute '%s'" % name)
        raise ImportError("microformer.%s (for microformer.%s) failed to import: %s" % (mod, name, e))
    if name not in _LAZY or name in _MODULES:
        globals()[name] = m     # bound here once: later uses skip this function
        return m
    return bind(globals(), name, m, _ALIAS.get(name, name))
