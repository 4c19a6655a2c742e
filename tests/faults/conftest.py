"""The fault-and-fuzz suite: equivci on broken inputs, hostile environments and odd git states.

Every case runs the real CLI (in this process when cheap, in a subprocess when it needs its own
environment or a signal) and checks the contract: exit 0 verified, 1 mismatch or unproven, 2 usage,
manifest or capture error; no traceback outside --debug; the user's files untouched.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # fake_github, shared with tests/
