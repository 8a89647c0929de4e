"""What a torch forward does that microformer has no layer for is refused in one line naming the
node, its op and the line of the user's source; the command line says it as one `torch_io:` line
and writes nothing. The same for weights that are not finite float32 numbers and an --out that
cannot be written (a missing folder, a folder)."""
import os
import subprocess
import sys

import pytest

import helpers
from torch_compare import torch
import torch_io  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")

# each forward line the refusal must point at carries a marker comment
BAD_PY = '''
import torch
from torch import nn


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)


class Exp(Base):
    def forward(self, x):
        h = torch.exp(self.a(x))          # MARK-exp
        return self.c(h)


class Scale(Base):
    def forward(self, x):
        h = self.a(x) * 2.0               # MARK-mul
        return self.c(h)


class TwoBranches(Base):
    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h) + torch.relu(h) - h)       # MARK-branches


class Branchy(Base):
    def forward(self, x):
        if x.sum() > 0:                   # MARK-trace
            return self.c(self.a(x))
        return self.c(self.b(self.a(x)))


class MeanOverFeatures(Base):
    def forward(self, x):
        return self.c(self.b(self.a(x)).mean(dim=-1, keepdim=True).expand(-1, -1, 8).mean(1))  # MARK-keepdim


class SoftmaxInside(Base):
    def forward(self, x):
        return self.c(torch.softmax(self.a(x), dim=-1))     # MARK-softmax


class TwoInputs(Base):
    def forward(self, x, y):              # MARK-inputs
        return self.c(self.a(x) + self.a(y))


class Good(Base):
    def forward(self, x):
        return self.c(torch.relu(self.b(self.a(x))).mean(1))


class Unused(Base):
    def forward(self, x):
        return self.c(torch.relu(self.a(x)).mean(1))
'''

CASES = {
    "Exp": ("exp", "call_function exp", "MARK-exp"),
    "Scale": ("mul", "call_function mul", "MARK-mul"),
    "TwoBranches": ("sub", "call_function sub", "MARK-branches"),
    "MeanOverFeatures": ("mean", "call_method mean", "MARK-keepdim"),
    "SoftmaxInside": ("softmax", "call_function softmax", "MARK-softmax"),
}


@pytest.fixture
def bad(tmp_path):
    return helpers.user_module(tmp_path, "bad_models", BAD_PY)


@pytest.mark.parametrize("cls", sorted(CASES))
def test_a_node_without_a_layer_is_named_with_its_source_line(bad, cls):
    path, mod = bad
    node, op, mark = CASES[cls]
    with pytest.raises(ValueError) as e:
        torch_io.from_torch(getattr(mod, cls)())
    msg = str(e.value)
    assert "\n" not in msg
    assert "node %r (%s)" % (node, op) in msg, msg
    line = [i + 1 for i, t in enumerate(BAD_PY.splitlines()) if mark in t][0]
    assert "bad_models.py:%d" % line in msg, msg


def test_what_fx_cannot_trace_and_second_inputs(bad):
    _, mod = bad
    with pytest.raises(ValueError, match="torch.fx cannot trace its forward"):
        torch_io.from_torch(mod.Branchy())
    with pytest.raises(ValueError, match="second input"):
        torch_io.from_torch(mod.TwoInputs())


def test_modules_the_forward_never_uses_are_named(bad):
    _, mod = bad
    with pytest.raises(ValueError, match=r"holds b\.bias, b\.weight, which its forward never uses"):
        torch_io.from_torch(mod.Unused())


def test_load_into_refuses_a_checkpoint_of_another_architecture(bad, tmp_path):
    _, mod = bad
    import microformer as mf
    model = torch_io.from_torch(mod.Good())
    ck = tmp_path / "good.mfck"
    mf.checkpoint.save(str(ck), model, {"spec": mf.to_spec(model)})
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch_io.GlobalAvgPool(), torch.nn.Linear(8, 3))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="does not fit the torch module"):
        torch_io.load_into(other, str(ck))
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, TORCH_IO] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def _one_line(r):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torch_io: "), r.stderr
    return lines[0]


def test_the_cli_refuses_in_one_line_and_writes_nothing(bad, tmp_path):
    path, mod = bad
    pt = tmp_path / "exp.pt"
    torch.save(mod.Exp().state_dict(), pt)
    out = tmp_path / "exp.mfck"
    line = _one_line(_cli(pt, "--model", "%s:Exp" % path, "--out", out))
    assert "node 'exp' (call_function exp) at bad_models.py:" in line, line
    assert not out.exists() and sorted(os.listdir(tmp_path)) == sorted(["bad_models.py", "exp.pt", "__pycache__"]
                                                                        if (tmp_path / "__pycache__").exists()
                                                                        else ["bad_models.py", "exp.pt"])


@pytest.mark.parametrize("value, dtype, words", [
    (float("nan"), torch.float32, "nan at flat index 5"),
    (float("inf"), torch.float32, "inf at flat index 5"),
    (-float("inf"), torch.float32, "-inf at flat index 5"),
    (1e39, torch.float64, "1e+39 at flat index 5"),
])
def test_weights_that_are_not_float32_numbers_are_refused(bad, tmp_path, value, dtype, words):
    path, mod = bad
    sd = mod.Good().state_dict()
    w = sd["b.weight"].to(dtype).clone()
    w.view(-1)[5] = value
    sd["b.weight"] = w
    pt = tmp_path / "w.pt"
    torch.save(sd, pt)
    out = tmp_path / "w.mfck"
    line = _one_line(_cli(pt, "--model", "%s:Good" % path, "--out", out))
    assert "'b.weight' holds " + words in line, line
    assert not out.exists()


def test_out_in_a_missing_folder_or_naming_a_folder(bad, tmp_path):
    path, mod = bad
    pt = tmp_path / "g.pt"
    torch.save(mod.Good().state_dict(), pt)
    line = _one_line(_cli(pt, "--model", "%s:Good" % path, "--out", tmp_path / "nope" / "g.mfck"))
    assert "does not exist" in line and "nope" in line, line
    assert not (tmp_path / "nope").exists()
    (tmp_path / "dir.mfck").mkdir()
    for force in ([], ["--force"]):
        line = _one_line(_cli(pt, "--model", "%s:Good" % path, "--out", tmp_path / "dir.mfck", *force))
        assert "is a folder" in line, line
        assert os.listdir(tmp_path / "dir.mfck") == []
    # the way back too
    good = tmp_path / "g.mfck"
    r = _cli(pt, "--model", "%s:Good" % path, "--out", good)
    assert r.returncode == 0, r.stderr
    line = _one_line(_cli(good, "--model", "%s:Good" % path, "--out", tmp_path / "nope" / "g.pt"))
    assert "does not exist" in line, line
    line = _one_line(_cli(good, "--out", tmp_path / "dir.mfck"))
    assert "is a folder" in line, line


def test_a_sequential_conv1d_before_an_encoder_says_what_works():
    seq = torch.nn.Sequential(torch.nn.Conv1d(3, 16, 5, padding=2),
                              torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True))
    with pytest.raises(ValueError) as e:
        torch_io.from_torch(seq)
    assert "x.transpose(1, 2)" in str(e.value) and "ChannelsLastConv1d" in str(e.value), str(e.value)


def test_the_way_back_without_the_module_says_to_name_it(bad, tmp_path):
    path, mod = bad
    pt = tmp_path / "g.pt"
    torch.save(mod.Good().state_dict(), pt)
    ck = tmp_path / "g.mfck"
    r = _cli(pt, "--model", "%s:Good" % path, "--out", ck)
    assert r.returncode == 0, r.stderr
    line = _one_line(_cli(ck, "--out", tmp_path / "back.pt"))
    assert "own forward" in line and "--model FILE.py:FACTORY" in line, line
    assert not (tmp_path / "back.pt").exists()


def test_torch_ios_own_modules_inside_a_forward():
    # the helper modules (channels-last convolution, SelfAttention, GlobalAvgPool) stay whole
    import microformer as mf
    from torch_compare import close

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch_io.ChannelsLastConv1d(3, 8, 3, padding=1)
            self.attn = torch_io.SelfAttention(8, 2, causal=True)
            self.pool = torch_io.GlobalAvgPool()
            self.head = torch.nn.Linear(8, 2)

        def forward(self, x):
            h = torch.relu(self.conv(x))
            return self.head(self.pool(h + self.attn(h)))

    torch.manual_seed(0)
    tm = Net().eval()
    model = torch_io.from_torch(tm)
    assert [type(l).__name__ for l in model.layers] == ["Conv1D", "ActivationLayer", "Residual", "GlobalAvgPool",
                                                         "Dense"]
    x = torch.randn(2, 6, 3)
    close(model(mf.Tensor.from_list(x.tolist())), tm(x), "helpers in a forward")


def test_functional_pooling_and_an_unknown_module():
    # F.adaptive_avg_pool1d(x, 1).squeeze(-1) maps; a module without a layer (BatchNorm1d) is named as
    # such, not blamed on its layout
    import microformer as mf
    from torch_compare import close

    class CNN(torch.nn.Module):
        def __init__(self, bn=False):
            super().__init__()
            self.c1 = torch.nn.Conv1d(6, 8, 5)
            self.bn = torch.nn.BatchNorm1d(8) if bn else torch.nn.Identity()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            x = torch.relu(self.bn(self.c1(x)))
            return self.fc(torch.nn.functional.adaptive_avg_pool1d(x, 1).squeeze(-1))

    torch.manual_seed(1)
    tm = CNN().eval()
    x = torch.randn(2, 6, 12)
    close(torch_io.from_torch(tm)(mf.Tensor.from_list(x.transpose(1, 2).tolist())), tm(x), "pooled CNN")
    with pytest.raises(ValueError, match=r"node 'bn' \(call_module bn\) at .*: BatchNorm1d: no microformer layer"):
        torch_io.from_torch(CNN(bn=True))
