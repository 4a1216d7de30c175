"""Training-step benchmark of the reference model: ``uv run apps/leaderboard/train.py --help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

from leaderboard.cli import main

if __name__ == "__main__":
    sys.exit(main())
