"""`python -m dartree {generate,bench,train}`: see `python -m dartree COMMAND --help`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
