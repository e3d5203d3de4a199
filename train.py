"""`python train.py ...` from a checkout: the same command as the installed `kt-train`."""

import sys

from keras_transformer.cli.train import console

if __name__ == "__main__":
    sys.exit(console(prog="train.py"))
