"""Eight torch models written as torch users write them, each with its own forward (what
host/tools/torch_fx.py converts), in one source text: the tests write it to a file and import it, as
`torch_io.py --model FILE.py:FACTORY` imports a user's file.

CASES: name -> (class, the torch input for a batch from a generator, how microformer takes it,
input_shape, softmax out)."""

MODELS_PY = '''
import math

import torch
from torch import nn
from torch.nn import functional as F


class GestureNet(nn.Module):                 # [B, 3, 50] channels first -> 5 classes
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 16, 5, padding=2)
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=True)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x)).transpose(1, 2)
        return self.head(self.enc(h).mean(dim=1))


class ConvFlatNet(nn.Module):                # [B, 4, 24] channels first, a conv stack, flatten, MLP
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2))
        self.conv2 = nn.Conv1d(8, 6, 3, stride=2, padding=1)
        self.fc = nn.Linear(6 * 6, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = F.relu(self.conv2(self.features(x)))
        h = torch.flatten(h, 1)
        h = F.dropout(F.gelu(self.fc(h)), 0.2, self.training)
        return self.out(h)


class ResidualStack(nn.Module):              # [B, 10, 6] sequence, learned positions, post-norm encoders, a residual
    def __init__(self, E=16):
        super().__init__()
        self.embed = nn.Linear(6, E)
        self.pos = nn.Parameter(torch.zeros(1, 16, E))     # learned positions, up to 16
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(E, 4, 2 * E, dropout=0.0, batch_first=True,
                                                                activation="gelu") for _ in range(2)])
        self.norm = nn.LayerNorm(E)
        self.ff = nn.Sequential(nn.Linear(E, 2 * E), nn.GELU(), nn.Linear(2 * E, E))
        self.head = nn.Linear(E, 4)

    def forward(self, x):
        h = self.embed(x) + self.pos[:, :x.size(1)]
        for layer in self.layers:
            h = layer(h)
        h = h + self.ff(self.norm(h))
        return self.head(h.mean(1))


class ClsPoolNet(nn.Module):                 # [B, 7, 5], an nn.TransformerEncoder, the first position's vector
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 12)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(12, 3, 24, dropout=0.1, batch_first=True, norm_first=True), 2,
            norm=nn.LayerNorm(12), enable_nested_tensor=False)
        self.cls_head = nn.Linear(12, 3)

    def forward(self, x):
        h = self.encoder(torch.tanh(self.proj(x)))
        return self.cls_head(h[:, 0])


class ConvRegressor(nn.Module):              # [B, 2, 30] channels first -> 2 values (a regression head)
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv1d(2, 8, 7, padding=3)
        self.conv_b = nn.Conv1d(8, 8, 3, padding=2, dilation=2)
        self.hidden = nn.Linear(8, 8)
        self.reg = nn.Linear(8, 2)

    def forward(self, x):
        h = F.gelu(self.conv_a(x))
        h = h + torch.relu(self.conv_b(h))            # a residual on [B, C, L]
        h = h.amax(dim=-1)
        return self.reg(torch.tanh(self.hidden(h)))


class TinyLM(nn.Module):                     # token ids [B, 12] -> next-token logits [B, 12, 20], causal
    def __init__(self, vocab=20, E=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, E)
        self.block = nn.TransformerEncoderLayer(E, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
        self.ln_f = nn.LayerNorm(E)
        self.lm_head = nn.Linear(E, vocab)

    def forward(self, ids):
        h = self.tok(ids)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.size(1))
        h = self.block(h, src_mask=mask, is_causal=True)
        return self.lm_head(self.ln_f(h))


class ClsTokenNet(nn.Module):                # [B, 6, 4] + a learned CLS token (torch.cat) and positions, ViT style
    def __init__(self, E=8):
        super().__init__()
        self.patch = nn.Linear(4, E)
        self.cls = nn.Parameter(torch.zeros(1, 1, E))
        self.pos_embedding = nn.Parameter(torch.zeros(1, 7, E))
        self.enc = nn.TransformerEncoderLayer(E, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(E)
        self.head = nn.Linear(E, 3)

    def forward(self, x):
        h = self.patch(x)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1)
        h = self.enc(h + self.pos_embedding)
        return self.head(self.norm(h[:, 0]))


class AttnSumNet(nn.Module):                 # [B, 9, 3], a MultiheadAttention residual, a sum pool, softmax out
    def __init__(self, E=8):
        super().__init__()
        self.inp = nn.Linear(3, E)
        self.ln = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, 2, batch_first=True)
        self.out = nn.Linear(E, 4)

    def forward(self, x):
        h = F.leaky_relu(self.inp(x))
        a = self.ln(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = torch.sigmoid(h).sum(dim=1)
        return self.out(h).softmax(dim=-1)
'''

# name -> (class, torch input from a generator, microformer's input from torch's, input_shape, softmax out)
CASES = {
    "gesture": ("GestureNet", lambda t, g: t.randn(3, 3, 50, generator=g), lambda x: x.transpose(1, 2), [50, 3],
                False),
    "conv-flatten": ("ConvFlatNet", lambda t, g: t.randn(3, 4, 24, generator=g), lambda x: x.transpose(1, 2),
                     [24, 4], False),
    "residual-stack": ("ResidualStack", lambda t, g: t.randn(3, 10, 6, generator=g), lambda x: x, [10, 6], False),
    "cls-position": ("ClsPoolNet", lambda t, g: t.randn(3, 7, 5, generator=g), lambda x: x, [7, 5], False),
    "conv-regressor": ("ConvRegressor", lambda t, g: t.randn(3, 2, 30, generator=g), lambda x: x.transpose(1, 2),
                       [30, 2], False),
    "token-lm": ("TinyLM", lambda t, g: t.randint(0, 20, (3, 12), generator=g), lambda x: x, None, False),
    "cls-token": ("ClsTokenNet", lambda t, g: t.randn(3, 6, 4, generator=g), lambda x: x, [6, 4], False),
    "attention-sum": ("AttnSumNet", lambda t, g: t.randn(3, 9, 3, generator=g), lambda x: x, [9, 3], True),
}


def randomize(torch, module, seed):
    """Parameters moved off their initial values (LayerNorm off 1 / 0, the CLS token off zeros),
    eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.rand(p.shape, generator=g) * 0.4 - 0.2)
    return module.eval()

