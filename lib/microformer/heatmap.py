# microformer.heatmap: attention weights as a text heat map on the REPL (mf.show).
RAMP = " .:-=+*#%@"


def heatmap(rows, ramp=RAMP):
    """[S][Sk] weights in [0, 1] -> list of strings, one character per weight."""
    top = len(ramp) - 1
    out = []
    for row in rows:
        line = ""
        for w in row:
            i = int(w * top + 0.5)
            line += ramp[0 if i < 0 else (top if i > top else i)]
        out.append(line)
    return out


def show(attn, b=0, h=0, labels=None, out=None):
    """Print head h of batch item b of an Attention's last forward: rows are queries, columns keys.

    ' ' is weight 0 (masked keys), '@' is weight 1. Works on an EncoderBlock too (its attention).
    Returns the lines.
    """
    attn = getattr(attn, "attn", attn)
    if not hasattr(attn, "weights"):
        raise ValueError("show: expected an Attention or EncoderBlock, got %s" % type(attn).__name__)
    rows = attn.weights(b, h)
    lines = heatmap(rows)
    Sk = len(rows[0]) if rows else 0
    pr = out or print
    pr("attention b=%d h=%d  (rows: queries, columns: keys 0..%d; ' '=0 '@'=1)" % (b, h, Sk - 1))
    pr("    +" + "-" * Sk + "+")
    for i, line in enumerate(lines):
        tag = (str(labels[i]) if labels else str(i))[:3]
        pr("%3s |%s|" % (tag, line))
    pr("    +" + "-" * Sk + "+")
    return lines
