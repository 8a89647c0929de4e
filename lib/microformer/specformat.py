# microformer.specformat: the name of the model spec format and the limits every reader of a
# spec applies (spec.py builds, specplan.py plans; both import this, so neither imports the other).
FORMAT = "microformer-spec/1"    # the format every spec carries (to_spec writes it)

# A checkpoint's spec is data from a file: a forged 200-byte file may say Dense(8192, 8192) or
# Transformer(num_encoder_layers=10**6). specplan reads the parameters and fixed tables a spec
# would allocate off its arguments (plan, named_shapes) before anything is built, within
# MAX_PARAMS; checkpoint.check_tensors compares them with a file's tensor table.

MAX_PARAMS = 1 << 24    # floats a spec may make the constructors allocate (parameters + fixed
#                         tables): 64 MB of float32, 8x the PSRAM of an ESP32-S3 board
MAX_DEPTH = 8           # Sequentials nested in Sequentials


def _short(v):
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
