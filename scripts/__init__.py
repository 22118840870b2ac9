"""Operator scripts of the repository; supervisor.py is the process supervisor behind
scripts/run.sh (`python -m scripts.supervisor`). A package so that nothing installed under
the same name shadows it."""
