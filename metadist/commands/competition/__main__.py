"""`python -m metadist.commands.competition`: the same as `metadist competition`."""

import sys

from metadist.commands.competition.cli import main

if __name__ == "__main__":
    sys.exit(main())
