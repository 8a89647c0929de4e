"""A UEA/UCR archive .ts file (equal-length series, class labels) -> CSV that
microformer.data.read_csv reads: one row per series, the values time-major
(t0_d0, t0_d1, ..., t0_d{D-1}, t1_d0, ...: [B, L*D] reshapes to channels-last [B, L, D]), the
label last. Values are copied as written in the .ts file (no rounding).

    python host/tools/ts_to_csv.py BasicMotions_TRAIN.ts datasets/basicmotions_train.csv
"""
import argparse
import os
import sys


def read_ts(path):
    """(class labels as declared, [(label, [[values of dimension d] for d in dims])])."""
    classes = None
    rows = []
    in_data = False
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                low = line.lower()
                if low.startswith("@classlabel"):
                    parts = line.split()
                    if len(parts) < 3 or parts[1].lower() != "true":
                        raise ValueError("%s line %d: expected '@classLabel true <labels>'" % (path, lineno))
                    classes = parts[2:]
                elif low == "@data":
                    in_data = True
                continue
            fields = line.split(":")
            label = fields[-1].strip()
            dims = [d.split(",") for d in fields[:-1]]
            if len({len(d) for d in dims}) != 1:
                raise ValueError("%s line %d: dimensions of unequal length %s" % (path, lineno, [len(d) for d in dims]))
            if any(v.strip() in ("", "?", "NaN") for d in dims for v in d):
                raise ValueError("%s line %d: missing values are not supported" % (path, lineno))
            if classes is not None and label not in classes:
                raise ValueError("%s line %d: label %r not among %s" % (path, lineno, label, classes))
            rows.append((label, [[v.strip() for v in d] for d in dims]))
    if not rows:
        raise ValueError("%s: no @data rows" % path)
    shapes = {(len(r[1]), len(r[1][0])) for r in rows}
    if len(shapes) != 1:
        raise ValueError("%s: series of different shapes %s" % (path, sorted(shapes)))
    return classes, rows


def write_csv(rows, path):
    D, L = len(rows[0][1]), len(rows[0][1][0])
    with open(path, "w") as f:
        f.write(",".join("t%d_d%d" % (t, d) for t in range(L) for d in range(D)) + ",label\n")
        for label, dims in rows:
            f.write(",".join(dims[d][t] for t in range(L) for d in range(D)) + "," + label + "\n")
    return L, D


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ts")
    ap.add_argument("csv")
    ap.add_argument("--force", action="store_true", help="overwrite an existing CSV")
    a = ap.parse_args(argv)
    if os.path.exists(a.csv) and not a.force:
        sys.exit("ts_to_csv: %s exists (--force overwrites it)" % a.csv)
    classes, rows = read_ts(a.ts)
    L, D = write_csv(rows, a.csv)
    print("%s: %d series, %d steps x %d dimensions, classes %s" % (a.csv, len(rows), L, D, classes))


if __name__ == "__main__":
    main()
