"""``python -m tiercache.cli``."""

import sys

from tiercache.cli import main

if __name__ == "__main__":
    sys.exit(main())
