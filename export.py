"""`python export.py ...` from a checkout: the same command as the installed `kt-export`."""

import sys

from keras_transformer.cli.export import main

if __name__ == "__main__":
    sys.exit(main(prog="export.py"))
