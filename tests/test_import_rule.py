"""The engine stays a plain library: importing it pulls in no Django, Celery or PySpark."""
import subprocess
import sys


def test_importing_channel_engine_imports_no_framework() -> None:
    code = (
        "import sys, channel_engine, channel_engine.tools.cli, channel_engine.tools.verify\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'rest_framework', 'celery', 'pyspark'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""
