# mf_owner.py: whose examples a user-data file holds, for the session's error when the file
# does not fit the model it was named for (loaded only then). The file is never offered for
# deletion: the error names the checkpoint on the board it belongs to and how to open that one.
import gc
import os



def header_of(meta):
    """The header line a checkpoint's user-data file has (checked metadata, microformer.meta)."""
    shape = meta["input_shape"]
    if len(shape) == 2:
        cols = ["t%d_%s" % (t, f) for t in range(shape[0]) for f in meta["features"]]
    else:
        cols = list(meta["features"])
    if meta["task"] == "regress":
        return ",".join(cols + meta["targets"])
    return ",".join(cols + ["label"])


def owners(head, folder, skip):
    """The checkpoints in `folder` (.mfck, and .mfck.bak copies a deploy kept) whose user-data
    header is `head`, except `skip`; a file that cannot be read is passed over."""
    from microformer import checkpoint
    from microformer.meta import check
    out = []
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return out
    for n in names:
        path = (folder + "/" + n) if folder else n
        if not (n.endswith(".mfck") or n.endswith(".mfck.bak")) or path == skip:
            continue
        try:
            if header_of(check(checkpoint.read_header(path)["meta"])[0]) == head:
                out.append(path)
        except Exception:          # damaged or foreign: not the owner we are looking for
            pass
        gc.collect()
    return out


def foreign(path, head, meta, checkpoint_path, root_path, user_data_for):
    """The error for a user-data file at `path` whose header `head` does not fit the model
    (checked metadata `meta`): which checkpoint its examples belong to and how to open that one;
    the file is never offered for deletion. root_path(p): a session path as the user types it;
    user_data_for(name): the user-data file of checkpoint `name` (mf_examples, passed in: no
    import circle)."""
    want = header_of(meta)
    folder = checkpoint_path.rsplit("/", 1)[0] if "/" in checkpoint_path else ""
    mine = checkpoint_path.rsplit("/", 1)[-1]
    own = owners(head, folder, checkpoint_path)
    if own:
        name = own[0].rsplit("/", 1)[-1]
        whose = ("they belong to %s: open it with finetune.Session(%r), which reads them from %s"
                 % (", ".join(o.rsplit("/", 1)[-1] for o in own), name, root_path(user_data_for(name))))
    else:
        whose = "no checkpoint on this board has that header (kept as it is)"
    return ValueError("Session: %s holds another model's examples (its header has %d fields: %s...; "
                      "%s needs %d: %s...): %s. This model's examples go to another file: "
                      "finetune.Session(%r, user_data='data/%s.user.csv'). The file is not "
                      "changed" % (path, len(head.split(",")), head[:60], mine, len(want.split(",")),
                                   want[:60], whose, mine, mine.rsplit(".", 1)[0]))
