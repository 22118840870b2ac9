"""python -m channel_engine.kafka_sink: the sink's job (job.py)."""
import sys

from channel_engine.kafka_sink.job import main

sys.exit(main())
