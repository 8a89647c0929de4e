# microformer.adapterfile: adapter checkpoints (checkpoint.save_adapter, load_adapter, base_id;
# the format: checkpoint.py), imported on first use. load_adapter checks both files whole before
# the model changes: the adapter's tag and base CRC, its 'lora' entries (rank, alpha, targets
# against the model's linear maps) against its tensor table (names and shapes [rank, in] and
# [out, rank]: a forged rank is refused before anything is allocated), every value, then the base
# as checkpoint.load checks it; only then are adapters added and both files read.
# checkpoint.py imports this module on first use and passes itself as `ck` (the file's readers
# and writer): no import goes back to it, so the two form no circle.
import struct
import sys

from .tensor import shape_size


class _Some:
    # a model stand-in holding only some named tensors, for checkpoint.save()
    def __init__(self, named):
        self._n = named

    def named_params(self):
        return self._n


def base_id(ck, base_path):
    """{'crc', 'tag'} of a verified checkpoint: what an adapter file names its base by."""
    base_path = ck._resolve(base_path, "checkpoint.base_id")
    with ck._open_read(base_path) as f:
        size = ck._verify(f, base_path)
        tag = ck._parse(f, base_path, size)[0]
        f.seek(size - 4)
        crc = struct.unpack("<I", ck._readn(f, 4, base_path))[0]
    return {"crc": crc, "tag": tag}


def save_adapter(ck, path, model, base_path, meta=None):
    """Write the trainable tensors of `model` (LoRA adapters, or whatever is unfrozen) to `path`,
    naming the base checkpoint `base_path` they apply to (its CRC and tag). Returns the size."""
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ValueError("checkpoint.save_adapter: meta must be a dict, got %s" % type(meta).__name__)
    base = base_id(ck, base_path)
    want = ck.model_tag(model)
    if base["tag"] != want:
        raise ck.CheckpointError("checkpoint.save_adapter: base %r is a checkpoint of %r, the model is %r"
                              % (base_path, base["tag"], want))
    live = {}
    for p, _ in model.collect_params([]):
        live[id(p)] = 1
    named = [(n, p) for n, p in ck._named(model) if id(p) in live]
    if not named:
        raise ValueError("checkpoint.save_adapter: the model has no trainable tensor to save (add "
                         "adapters with mf.add_lora or unfreeze a part)")
    meta = dict(meta)
    meta["adapter_of"] = base
    if "microformer.lora" in sys.modules:
        groups = sys.modules["microformer.lora"].spec_groups(model)
        if groups:
            meta["lora"] = groups
    return ck.save(path, _Some(named), meta, tag="adapter:" + want, spec=False)


def _check_base(ck, path, ameta, base_path):
    of = ameta.get("adapter_of")
    if not isinstance(of, dict) or not isinstance(of.get("crc"), int):
        raise ck._err(path, "not an adapter file (its metadata has no 'adapter_of' with the base's CRC)")
    base = base_id(ck, base_path)
    if of["crc"] != base["crc"]:
        raise ck._err(path, "adapter for another base: expected base CRC 0x%08x (tag %r), %r has CRC "
                   "0x%08x (tag %r)" % (of["crc"], of.get("tag"), base_path, base["crc"], base["tag"]))
    return base


def _adapter_plan(ck, path, model, groups):
    """The adapters an adapter file's meta['lora'] adds to `model` (which has none), checked
    before anything is made: [(rank, alpha, targets)] and {tensor name: shape} of every adapter
    tensor they would make. CheckpointError naming the file and the entry otherwise (a forged
    rank is caught here, against the file's tensor table, before a float is allocated)."""
    from .lora import chosen
    if not isinstance(groups, list) or not groups:
        raise ck._err(path, "metadata 'lora' must be a non-empty list of {rank, alpha, targets}, got %r"
                   % (groups,))
    plan = []
    shapes = {}
    for k in range(len(groups)):
        g = groups[k]
        where = "metadata 'lora'[%d]" % k
        if not isinstance(g, dict):
            raise ck._err(path, "%s must be an object {rank, alpha, targets}, got %r" % (where, g))
        rank = g.get("rank")
        alpha = g.get("alpha")
        targets = g.get("targets")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ck._err(path, "%s: rank must be an int >= 1, got %r" % (where, rank))
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 3.4e38:
            raise ck._err(path, "%s: alpha must be a finite number > 0, got %r" % (where, alpha))
        if not isinstance(targets, list) or not targets:
            raise ck._err(path, "%s: targets must be a non-empty list of names, got %r" % (where, targets))
        try:
            found = chosen(model, targets)
        except ValueError as e:
            raise ck._err(path, "%s: %s" % (where, e))
        for name, _, layer, slot in found:
            pre = name + "." if name else ""
            if pre + "lora_A" in shapes:
                raise ck._err(path, "%s adapts %s a second time" % (where, name))
            C, O = (layer.in_features, layer.out_features) if slot is None else (layer.embed_dim, layer.embed_dim)
            shapes[pre + "lora_A"] = (rank, C)
            shapes[pre + "lora_B"] = (O, rank)
        plan.append((rank, alpha, targets))
    return plan, shapes


def _adapter_table(ck, path, model, recs, shapes, ids):
    # every tensor of an adapter file is an adapter it declares (shapes) or a tensor of the model
    # (ids: the adapters the model has), float32, of the same shape; every declared one is there
    mine = {}
    for n, p in ck._named(model):
        mine[n] = p
    seen = {}
    for name, shape, off, dtype in recs:
        if name in seen:
            raise ck._err(path, "malformed (tensor %r twice)" % name)
        seen[name] = 1
        if name in shapes:
            want = shapes[name]
        elif name in mine:
            want = tuple(mine[name].shape)
        else:
            raise ck._err(path, "wrong model: the adapter holds tensor %r the model lacks" % name)
        if tuple(shape) != want:
            what = " (the rank its metadata 'lora' declares)" if name in shapes else ""
            raise ck._err(path, "wrong shape: %s: expected %r%s, got %r" % (name, want, what, tuple(shape)))
        if dtype != ck._F32:
            raise ck._err(path, "tensor %r is int8: an adapter holds trained (float32) tensors only" % name)
    for name in shapes:
        if name not in seen:
            raise ck._err(path, "its metadata 'lora' declares tensor %r, which the file does not hold" % name)


def load_adapter(ck, path, model, base_path):
    """Load base + adapter: refuse (CheckpointError) unless `path` is an adapter file for the
    checkpoint `base_path` (same CRC); load the base's weights into `model` (whose architecture
    is the base's), add the adapters the file describes (meta['lora']) unless the model has them,
    then its tensors. Both files are checked whole first (tags, CRCs, the adapters' ranks and
    targets against the model, every name, shape and value): a refusal leaves the model as it
    was. Returns the adapter's metadata."""
    ck._check_byteorder()
    path = ck._resolve(path, "checkpoint.load_adapter")
    tag = ck.model_tag(model)
    with ck._open_read(path) as f:
        size = ck._verify(f, path)
        atag, ameta, recs = ck._parse(f, path, size)
        if atag != "adapter:" + tag:
            raise ck._err(path, "wrong model: %s %r, this model is %r" % (
                "the adapter is for" if atag.startswith("adapter:") else "not an adapter file: its tag is",
                atag[8:] if atag.startswith("adapter:") else atag, tag))
        _check_base(ck, path, ameta, base_path)
        groups = ameta.get("lora")
        lora = sys.modules.get("microformer.lora")
        have = lora.spec_groups(model) if lora is not None else []
        if groups is not None and have:
            from .spec import difference
            d = difference(groups, have, ("the adapter file", "the model"))
            if d:
                raise ck._err(path, "the model's adapters differ from the file's (%s)" % d.replace("spec", "lora", 1))
        plan, shapes = ([], {}) if groups is None or have else _adapter_plan(ck, path, model, groups)
        ids = {}
        if have:
            for _, a in lora.adapters(model):
                ids[id(a.A)] = 1
                ids[id(a.B)] = 1
        _adapter_table(ck, path, model, recs, shapes, ids)
        ck._check_values(f, path, recs)
    # the base, into the model's base tensors (the adapters are not in the base file): checked
    # whole before anything changes
    bpath = ck._resolve(base_path, "checkpoint.load_adapter")
    base = [(n, p) for n, p in ck._named(model) if id(p) not in ids]
    with ck._open_read(bpath) as bf:
        have_b, named_b, swaps = ck._checked(bf, bpath, base, tag, model, bool(have))[1:]
        if plan:
            from . import lora
            try:
                for rank, alpha, targets in plan:
                    lora.add_lora(model, rank, alpha, targets)
            except MemoryError:
                lora.remove_lora(model)
                n = 0
                for shape in shapes.values():
                    n += shape_size(shape)
                raise MemoryError("checkpoint.load_adapter: %r: out of memory adding its adapters (%d "
                                  "floats with their grads); the model has no adapters, as before" % (path, 2 * n))
        ck._read_all(bf, bpath, named_b, have_b, swaps)
    mine = {}
    for n, p in ck._named(model):
        mine[n] = p
    with ck._open_read(path) as f:
        for name, shape, off, dtype in recs:
            ck._read_floats(f, mine[name].data, off, path)
    return ameta
