"""`python -m leakdoctor ...`: the same command line as `leakdoctor ...` (demo, report, run)."""

import sys

from leakdoctor.cli import main

if __name__ == "__main__":
    sys.exit(main())
