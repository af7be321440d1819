"""``python -m tiercache.cli``."""

import sys

from tiercache.cli import main

if __name__ == "__main__":  # importing the module (pkgutil.walk_packages) must not run the CLI
    sys.exit(main())
