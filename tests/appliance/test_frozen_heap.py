"""The appliance's long-lived processes freeze the objects of their start
(appliance/frozen_heap.py): a gunicorn worker once appliance.wsgi is loaded, a Celery
pool process at worker_process_init. Each in a fresh Python, as those processes are."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, tmp_path: Path) -> str:
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "DJANGO_SETTINGS_MODULE": "appliance.settings"}
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_loading_the_wsgi_app_freezes_what_it_loaded(tmp_path: Path) -> None:
    out = run("import gc\n"
              "assert gc.get_freeze_count() == 0\n"
              "import appliance.wsgi\n"
              "print(gc.get_freeze_count(), len(gc.get_objects()))", tmp_path)
    frozen, tracked = map(int, out.split())
    assert frozen > 50_000  # Django, DRF and the engine: ~125,000 on this machine
    assert tracked < frozen / 10  # only what was made since


def test_a_celery_worker_freezes_before_it_forks_its_pool(tmp_path: Path) -> None:
    """worker_init (the main process, before the fork) freezes what it loaded; the pool
    process's own start is frozen too (worker_process_init), without visiting again what
    was frozen before the fork."""
    out = run("import gc, os\n"
              "from celery.signals import worker_init, worker_process_init\n"
              "from appliance.celery import app, freeze_pool_process, freeze_worker\n"
              "import django; django.setup()\n"
              "assert freeze_worker in [r() for _, r in worker_init.receivers]\n"
              "assert freeze_pool_process in [r() for _, r in worker_process_init.receivers]\n"
              "assert gc.get_freeze_count() == 0\n"
              "worker_init.send(sender=None)\n"
              "parent = gc.get_freeze_count()\n"
              "made_after = [[i] for i in range(1000)]\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    worker_process_init.send(sender=None)\n"
              "    os._exit(0 if gc.get_freeze_count() >= parent + 1000 else 3)\n"
              "print(parent, os.waitpid(pid, 0)[1])", tmp_path)
    parent, child_status = map(int, out.split())
    assert parent > 50_000 and child_status == 0


def test_garbage_of_the_start_is_collected_not_frozen() -> None:
    code = ("import gc, weakref\n"
            "from appliance.frozen_heap import freeze_startup_objects\n"
            "class Cycle: pass\n"
            "a = Cycle(); a.me = a; gone = weakref.ref(a); del a\n"
            "gc.disable()\n"  # nothing but the freeze's own collection frees it
            "freeze_startup_objects()\n"
            "print(gone() is None, gc.get_freeze_count() > 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "True True", done.stderr


def test_a_real_prefork_workers_pool_process_runs_tasks_frozen(tmp_path: Path) -> None:
    """`celery worker --pool prefork`, as scripts/run.sh starts it: a task run in its pool
    process finds the start's objects frozen (whenever Celery sends its signals)."""
    from test_redis_prefix import HERE, appliance_env

    var = tmp_path / "var"
    var.mkdir()
    env = appliance_env(var)  # a var dir of its own: a Redis prefix and queue of its own
    log = (var / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "whoami_app", "worker", "-n", "frozen@%h",
         "--queues", "weir", "--pool", "prefork", "--concurrency", "1", "--loglevel", "INFO"],
        cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import django; django.setup()\n"
             "from appliance.celery import app\n"
             "print(app.send_task('weir-test.frozen').get(timeout=120))"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert int(done.stdout.strip().splitlines()[-1]) > 50_000
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
