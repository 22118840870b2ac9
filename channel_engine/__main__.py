"""`python -m channel_engine`: the operator tools (see channel_engine.tools.cli)."""
import sys

from channel_engine.tools.cli import main

sys.exit(main())
