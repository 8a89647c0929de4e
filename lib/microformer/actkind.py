# microformer.actkind: the activation kinds, as the kernels take them (one int per kind), and
# math.erf where this build has it. Its own small module, so that the layers and the viper kernels
# know the kinds without loading the portable kernels (kernels.py) on a board that trains in viper.
try:
    from math import erf
except ImportError:          # a MicroPython built without the math special functions
    erf = None

RELU = 0
LEAKY_RELU = 1
GELU = 2                      # exact: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), torch's default
TANH = 3
SIGMOID = 4
GELU_TANH = 5                 # the tanh approximation, torch's approximate='tanh'
LEAKY_SLOPE = 0.01
