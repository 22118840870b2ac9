"""`python -m channel_engine`: the operator tools (see channel_engine.cli)."""
import sys

from channel_engine.cli import main

sys.exit(main())
