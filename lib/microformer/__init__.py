# microformer: train and fine-tune small attention models on a microcontroller.
# Forward and backward passes on array('f') buffers; the same code under CPython and MicroPython.
__version__ = "0.1.0"

from .tensor import Tensor, Rng, seed, xavier_uniform
from .backend import set_backend, get_backend, available as available_backends
from .dense import Dense
from .attention import Attention
from .pool import GlobalAvgPool
from .activation import ActivationLayer
from .reshape import Reshape
from .model import Sequential
from .finite import NonFiniteError
from .loss import CrossEntropyLoss, MSELoss, NonFiniteLossError, softmax_cross_entropy, mse
from .optim import SGD, Adam, clip_grad_norm
from . import checkpoint
from .checkpoint import save as save_checkpoint, load as load_checkpoint, CheckpointError
from .norm import LayerNorm
from .feedforward import FeedForward
from .embedding import Embedding
from .posenc import PositionalEncoding
from .posembed import LearnedPositionalEmbedding
from .conv import Conv1D
from .pool1d import MaxPool1D, AvgPool1D
from .block import EncoderBlock, prefill, decode_step, kv_bytes_per_token
from .decoder import DecoderBlock, Transformer
from .dropout import Dropout
from .show import show


# Imported on first use (a board without PSRAM has a small heap): mf.data, mf.train, mf.spec,
# mf.to_spec, mf.from_spec, mf.load_model, mf.StreamingEncoder.
_LAZY = {"data": "data", "train": "train", "spec": "spec", "to_spec": "spec", "from_spec": "spec",
         "load_model": "spec", "StreamingEncoder": "stream"}


def __getattr__(name):
    # a lazy name, or any submodule (`from microformer import golden` comes here on MicroPython)
    import sys
    mod = _LAZY.get(name, name)
    try:
        __import__("microformer." + mod)
    except ImportError:
        raise AttributeError("module 'microformer' has no attribute '%s'" % name)
    m = sys.modules["microformer." + mod]
    return m if name == mod else getattr(m, name)
