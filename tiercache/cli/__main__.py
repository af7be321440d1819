"""``python -m tiercache.cli``."""

import sys

from tiercache.cli import main

if (
    __name__ == "__main__"
):  # importing the module (the docstring test walks every module) runs nothing
    sys.exit(main())
