"""python -m harness.bench tasks|grade|compare|solutions|split: see harness/bench/__init__.py."""

import sys

from harness.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
