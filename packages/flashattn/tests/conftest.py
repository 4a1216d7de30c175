"""Puts the tests' helper modules (the independent attention oracle) on the path (importlib import mode)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
