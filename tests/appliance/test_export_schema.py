"""The export's schema version (appliance/export_schema.py, migration 0009): exports that
exist at the upgrade keep version 1, new ones get 2; the job is told the row's version
and each run keeps what it was told; a change of version under an export path that holds
committed files is refused naming the field, unless the path changes too."""
from __future__ import annotations

import importlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_helpers import channel_row, problem, token_client
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from appliance import channels, exports
from appliance.exports import command
from appliance.models import Channel, ExportRun
from channel_engine.spark.commit_records import commit_record

pytestmark = pytest.mark.django_db
BEFORE = ("appliance", "0008_operator_help_texts")
AFTER = ("appliance", "0009_export_schema_version")


def committed(name: str, path: str, version: int, outcome: str = ExportRun.OK,
              rows: int = 10, stage: str = "") -> ExportRun:
    """An export run of channel `name` that committed `rows` events under `path` (`stage`:
    the outcome its last commit line gave, "" for none)."""
    partitions = [{"partition": 0, "ranges": [[0, 10]], "files": ["f"], "outcome": stage}]
    return ExportRun.objects.create(channel=name, started_at=timezone.now(), outcome=outcome,
                                    rows=rows, path=path, schema_version=version,
                                    partitions=partitions if stage else [])


def change(client: APIClient, **settings: object) -> object:
    return client.patch("/api/v1/channels/orders", settings, format="json")


@pytest.fixture
def migrator() -> Iterator[MigrationExecutor]:
    """A migration executor; the database goes back to the latest migrations after the
    test, whatever it did, so that later tests see every column."""
    executor = MigrationExecutor(connection)
    try:
        yield executor
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_it_keeps_version_1_for_the_exports_that_exist_at_the_upgrade(
        tmp_path: Path, migrator: MigrationExecutor) -> None:
    executor = migrator
    executor.migrate([BEFORE])
    old = executor.loader.project_state([BEFORE]).apps
    for name in ("ran", "recorded", "fresh", "failed"):
        old.get_model("appliance", "Channel").objects.create(
            name=name, data_dirs=[str(tmp_path / "d")], checkpoint_dir=str(tmp_path / name),
            export_path="%Y/%m/")
    for name, outcome in (("ran", "ok"), ("failed", "failed")):
        old.get_model("appliance", "ExportRun").objects.create(
            channel=name, started_at=timezone.now(), outcome=outcome, rows=5)
    commits = tmp_path / "out" / "recorded" / "_weir" / "commits"  # no run row kept
    commits.mkdir(parents=True)
    (commits / "1795788300000-1a2b3c4d.json").write_text(json.dumps(
        {"run_id": "1795788300000-1a2b3c4d", "moves": [], "ranges": {"0": [[0, 5]]}}))
    with override_settings(WEIR_EXPORT_URI=(tmp_path / "out").as_uri()):
        executor = MigrationExecutor(connection)
        executor.migrate([AFTER])
    versions = dict(Channel.objects.values_list("name", "export_schema_version"))
    assert versions == {"ran": 1, "recorded": 1, "fresh": 2, "failed": 1}
    run = ExportRun.objects.get(channel="ran")
    assert (run.schema_version, run.path) == (1, "%Y/%m")  # the path as it stands
    assert Channel(name="new").export_schema_version == 2


GOLDEN = Path(__file__).resolve().parents[1] / "spark" / "golden" / "export-files"


def unversioned_record(out: Path, name: str, golden: str) -> None:
    """A commit record of channel `name` without schema_version (as every Weir before the
    versions wrote it), its one file a copy of golden file `golden`."""
    final = out / name / "2026" / f"{name}+0+00000000000000000000+00000000000000000001{golden[2:]}"
    final.parent.mkdir(parents=True)
    shutil.copyfile(GOLDEN / golden, final)
    commits = out / name / "_weir" / "commits"
    commits.mkdir(parents=True)
    (commits / "1795788300000-1a2b3c4d.json").write_text(json.dumps(
        {"format": "weir-export-commit", "version": 1, "run_id": "1795788300000-1a2b3c4d",
         "channel_id": "c", "moves": [[f"file://{out}/tmp/x", f"file://{final}"]],
         "ranges": {"0": [[0, 2]]}}))
    # a compaction's summary names no file and sorts after its run's record
    (commits / "1795788300000-1a2b3c4d.summary.json").write_text(json.dumps(
        {"run_id": "1795788300000-1a2b3c4d", "channel_id": "c", "moves": [],
         "ranges": {"0": [[0, 2]]}}))


@pytest.mark.django_db(transaction=True)
def test_an_export_of_readable_files_without_versions_in_its_records_keeps_version_2(
        tmp_path: Path, migrator: MigrationExecutor) -> None:
    # Weir wrote version 2's columns from the readable exports on, in records of version
    # 1's shape: the files tell (Parquet footer, Avro header, first JSON line)
    migrator.migrate([BEFORE])
    old = migrator.loader.project_state([BEFORE]).apps
    shapes = {"bytes": "v1.parquet", "readable": "v2.parquet", "avro": "v2.avro",
              "lines": "v2.json", "old-lines": "v1.json"}
    for name, golden in shapes.items():
        old.get_model("appliance", "Channel").objects.create(
            name=name, data_dirs=[str(tmp_path / "d")], checkpoint_dir=str(tmp_path / name),
            export_path="%Y/")
        old.get_model("appliance", "ExportRun").objects.create(
            channel=name, started_at=timezone.now(), outcome="ok", rows=2)
        unversioned_record(tmp_path / "out", name, golden)
    with override_settings(WEIR_EXPORT_URI=(tmp_path / "out").as_uri()):
        executor = MigrationExecutor(connection)
        executor.migrate([AFTER])
    versions = dict(Channel.objects.values_list("name", "export_schema_version"))
    assert versions == {"bytes": 1, "readable": 2, "avro": 2, "lines": 2, "old-lines": 1}
    runs = dict(ExportRun.objects.values_list("channel", "schema_version"))
    assert runs == versions  # what paths_held counts


def test_an_unreadable_export_output_keeps_version_1_and_the_upgrade_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    migration = importlib.import_module("appliance.migrations.0009_export_schema_version")
    unversioned_record(tmp_path, "orders", "v2.parquet")

    def denied(self: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    with override_settings(WEIR_EXPORT_URI=tmp_path.as_uri()):
        assert migration._output_version("orders") == 2
        monkeypatch.setattr(Path, "is_dir", denied)
        assert migration._output_version("orders") == 1  # unknown: keep 1


def test_the_settings_page_explains_the_version_and_open_files_plainly(root: Path) -> None:
    channel_row(root)
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get("/channels/orders/").content.decode().replace("&#x27;", "'")
    assert "Channels exported before this upgrade keep 1" in page
    assert "hdfs.maxOpenFiles" not in page  # Flume closes its oldest file; Spark sorts
    assert "up to its cores x this x 128 MiB per executor" in page


@pytest.mark.django_db(transaction=True)
def test_the_migration_tests_leave_the_database_at_the_latest_migrations() -> None:
    # runs after the test above (file order): a later test needs 0010's columns
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []


def test_the_job_is_told_the_rows_version_and_the_run_keeps_it(root: Path) -> None:
    row = channel_row(root, export_schema_version=1, export_path="v1/%Y/")
    argv = exports.command(row)
    assert argv[argv.index("--schema-version") + 1] == "1"
    row.export_schema_version = 2
    assert exports.command(row)[argv.index("--schema-version") + 1] == "2"


def test_a_change_of_version_under_a_path_holding_files_is_refused(root: Path) -> None:
    client = token_client("admin")
    channel_row(root, export_schema_version=1)
    committed("orders", "%Y/%m/%d/%H", 1)
    body = problem(change(client, export_schema_version=2), 400, "invalid-setting",
                   field="export_schema_version")
    [message] = body["errors"]["export_schema_version"]
    assert "'%Y/%m/%d/%H' holds files of schema version 1" in message
    assert "change export_path with it (say to 'v2/%Y/%m/%d/%H')" in message
    assert Channel.objects.get(name="orders").export_schema_version == 1  # nothing written
    # with the path: the new folders hold no file of another version
    changed = change(client, export_schema_version=2, export_path="v2/%Y/%m/%d/%H")
    assert changed.status_code == 200, changed.content
    row = Channel.objects.get(name="orders")
    assert (row.export_schema_version, row.export_path) == (2, "v2/%Y/%m/%d/%H")
    committed("orders", "v2/%Y/%m/%d/%H", 2)  # the new folders now hold version 2
    body = problem(change(client, export_schema_version=1), 400, "invalid-setting",
                   field="export_schema_version")
    [message] = body["errors"]["export_schema_version"]  # never 'v1/v2/...'
    assert "change export_path with it (say to 'v1/%Y/%m/%d/%H')" in message, message
    committed("orders", "v1/%Y", 2)  # so the path it would suggest holds version 2 too
    body = problem(change(client, export_schema_version=1), 400, "invalid-setting",
                   field="export_schema_version")
    [message] = body["errors"]["export_schema_version"]
    assert message.endswith("change export_path with it to folders apart from those"), message
    settings = client.get("/api/v1/channels/orders").json()["settings"]
    assert settings["export_schema_version"] == 2


def test_a_path_back_into_a_folder_of_another_version_is_refused(root: Path) -> None:
    client = token_client("admin")
    channel_row(root, export_schema_version=2, export_path="v2/%Y")
    committed("orders", "%Y/%m/%d/%H", 1)  # before the upgrade, under the old path
    committed("orders", "v2/%Y", 2)
    problem(change(client, export_path="%Y/%m/%d/%H/"), 400, "invalid-setting",
            field="export_path")
    assert change(client, export_path="%Y/%m/%d/%H/", export_schema_version=1) \
        .status_code == 200
    # a run going on (it may be at its commit point) holds its folder too
    committed("orders", "%Y/%m/%d/%H", 1, outcome=ExportRun.RUNNING, rows=0)
    problem(change(client, export_schema_version=2), 400, "invalid-setting",
            field="export_schema_version")


@pytest.mark.parametrize("path", ["%Y/%m/%d/%H/v2", "%Y/%m/%d", "%Y/%m/%d/%H/%M", "2026",
                                  "%Y/11/%d/%H", "%Y/%m/%d/%H/"])
def test_a_path_whose_folders_are_inside_or_above_those_of_another_version_is_refused(
        root: Path, path: str) -> None:
    client = token_client("admin")
    channel_row(root, export_schema_version=1)
    committed("orders", "%Y/%m/%d/%H", 1)
    body = problem(change(client, export_schema_version=2, export_path=path), 400,
                   "invalid-setting", field="export_schema_version")
    assert "in folders above or below them" in body["errors"]["export_schema_version"][0]
    assert Channel.objects.get(name="orders").export_path == "%Y/%m/%d/%H"  # nothing written


@pytest.mark.parametrize("path", ["v2/%Y/%m/%d/%H", "%Y/%m/%d/%H%M", "%Y-%m/%d/%H",
                                  "%Y/%m/%d/x%H", "%Y/%j/%H", "1999x/%m"])
def test_a_path_of_folders_apart_from_another_versions_is_allowed(
        root: Path, path: str) -> None:
    client = token_client("admin")
    channel_row(root, export_schema_version=1)
    committed("orders", "%Y/%m/%d/%H", 1)
    changed = change(client, export_schema_version=2, export_path=path)
    assert changed.status_code == 200, changed.content


def test_a_version_or_path_change_while_an_export_runs_is_refused_409(root: Path) -> None:
    client = token_client("admin")
    row = channel_row(root, export_schema_version=1)
    channels.open_channel(row)  # its home, where the export-run lock lives
    with exports.held(Path(row.checkpoint_dir) / exports.LOCK_FILE, RuntimeError()):
        for setting in ({"export_schema_version": 2}, {"export_path": "v2/%Y"}):
            field = next(iter(setting))
            [message] = problem(change(client, **setting), 409, "channel-conflict",
                                field=field)["errors"][field]
            assert "an export of channel 'orders' is running: change" in message
        assert change(client, export_roll_rows=5000).status_code == 200  # not the layout
        assert change(client, export_path="%Y/%m/%d/%H/").status_code == 200  # same folder
    row.refresh_from_db()
    assert (row.export_schema_version, row.export_roll_rows) == (1, 5000)
    assert change(client, export_schema_version=2).status_code == 200  # the run ended


def test_a_run_exports_with_the_settings_under_its_lock_not_a_stale_row(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root, export_schema_version=1, export_path="v1/%Y/")
    stale = Channel.objects.get(pk=row.pk)
    change(token_client("admin"), export_schema_version=2, export_path="v2/%Y")
    told: list[list[str]] = []
    monkeypatch.setattr(exports, "command", lambda row: told.append(
        command(row)) or [sys.executable, "-c", REPORTS])
    run = exports.run_export(stale)  # read before the change, started after it
    assert (run.schema_version, run.path) == (2, "v2/%Y")
    assert told[0][told[0].index("--schema-version") + 1] == "2"


def test_files_of_no_committed_run_hold_nothing_back(root: Path) -> None:
    client = token_client("admin")
    channel_row(root, export_schema_version=1)
    committed("orders", "%Y/%m/%d/%H", 1, outcome=ExportRun.FAILED, rows=0)
    committed("orders", "%Y/%m/%d/%H", 1, rows=0)  # ok, nothing new
    assert change(client, export_schema_version=2).status_code == 200


@pytest.mark.parametrize("stage", ["committing", "committed"])
def test_a_run_killed_after_a_commit_line_holds_its_folder(root: Path, stage: str) -> None:
    client = token_client("admin")
    channel_row(root, export_schema_version=1)
    # killed in its commit: failed, 0 events, until the next run tells whether it committed
    committed("orders", "%Y/%m/%d/%H", 1, outcome=ExportRun.FAILED, rows=0, stage=stage)
    problem(change(client, export_schema_version=2), 400, "invalid-setting",
            field="export_schema_version")
    assert Channel.objects.get(name="orders").export_schema_version == 1


def test_a_channel_made_again_under_its_name_is_checked_against_its_old_files(
        root: Path) -> None:
    committed("orders", "%Y/%m/%d/%H", 1)  # a deleted channel's, its files still there
    client = token_client("admin")
    body = {"name": "orders", "data_dirs": [str(root / "data")],
            "checkpoint_dir": str(root / "orders"), "minimum_required_space": 0}
    refused = client.post("/api/v1/channels", body, format="json")
    [message] = problem(refused, 400, "invalid-setting",
                        field="export_schema_version")["errors"]["export_schema_version"]
    assert "set export_schema_version to 1, or another export_path" in message
    assert not Channel.objects.exists() and not (root / "orders").exists()
    made = client.post("/api/v1/channels", {**body, "export_schema_version": 1}, format="json")
    assert made.status_code == 201, made.content


def test_runs_of_a_channel_deleted_before_the_upgrade_hold_every_path(root: Path) -> None:
    committed("orders", "", 1)  # migration 0009 knew no export path for it
    client = token_client("admin")
    body = {"name": "orders", "data_dirs": [str(root / "data")],
            "checkpoint_dir": str(root / "orders"), "minimum_required_space": 0,
            "export_path": "anywhere/%Y"}
    problem(client.post("/api/v1/channels", body, format="json"), 400, "invalid-setting",
            field="export_schema_version")
    assert not Channel.objects.exists()
    made = client.post("/api/v1/channels", {**body, "export_schema_version": 1}, format="json")
    assert made.status_code == 201, made.content


def test_an_unknown_version_is_refused_naming_the_field(root: Path) -> None:
    client = token_client("admin")
    channel_row(root)
    for value in (3, 0, "2", None):
        problem(change(client, export_schema_version=value), 400, "invalid-setting",
                field="export_schema_version")


# A job that reports at once (the real one needs Spark: tests/spark/test_export.py)
REPORTS = ("import json; print(json.dumps({'report': {'run_id': 'r', 'output': 'file:///o', "
           "'rows': 0, 'bytes': 0, 'partitions': []}}))")


def test_a_run_keeps_the_version_and_the_path_it_was_told(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root, export_schema_version=1, export_path="v1/%Y/")
    monkeypatch.setattr(exports, "command", lambda row: [sys.executable, "-c", REPORTS])
    run = exports.run_export(row)
    assert (run.outcome, run.schema_version, run.path) == (ExportRun.OK, 1, "v1/%Y")
    shown = token_client("admin").get("/api/v1/channels/orders").json()["recent_exports"]
    assert (shown[0]["schema_version"], shown[0]["path"]) == (1, "v1/%Y")
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get("/channels/orders/status").content.decode()
    assert '<span class="muted layout" title="the layout of its files\' columns">schema version 1' \
        in page.replace("&#x27;", "'")


def test_the_settings_page_shows_the_version_and_its_refusal(root: Path) -> None:
    channel_row(root, export_schema_version=1)
    committed("orders", "%Y/%m/%d/%H", 1)
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get("/channels/orders/").content.decode()
    field = page[page.index('id="field-export_schema_version"'):]
    field = field[:field.index("</div>")]
    assert '<option value="1" selected>1: bytes' in field and "2: readable" in field
    # in the table of settings changed from their defaults, by their labels
    assert 'export_schema_version</a></td><td>1: bytes' in page
    assert '<td class="muted">2: readable' in page


def test_a_run_the_job_refuses_says_why_in_its_row(root: Path) -> None:
    # the output's commit records hold version 1 under the path, which no ExportRun row
    # tells (a job run by hand): the real job refuses in its step 1; the row says why
    row = channel_row(root, export_schema_version=2, export_path="%Y/%m/%d/%H")
    commits = root / "out" / "orders" / "_weir" / "commits"
    commits.mkdir(parents=True)
    held = commit_record("1795788300000-1a2b3c4d", "", [], {}, 1, incarnations={},
                         path="%Y/%m/%d/%H")
    (commits / "1795788300000-1a2b3c4d.json").write_text(json.dumps(held))
    with override_settings(WEIR_EXPORT_URI=(root / "out").as_uri(),
                           WEIR_SPARK_MASTER="local[1]", WEIR_EXPORT_READ_URL=""):
        run = exports.run_export(row)
    assert (run.outcome, run.rows) == (ExportRun.FAILED, 0), run.error
    # an engine error reads as its sentence alone, without the class's name
    assert run.error.startswith("export of channel 'orders': the folders of "
                                "export path '%Y/%m/%d/%H' under file:"), run.error
    assert "(version 1 under '%Y/%m/%d/%H': the commit records in" in run.error
    assert "told to write version 2" in run.error and "Traceback" not in run.error
    assert "change the export path to one of its own (say 'v2/%Y/%m/%d/%H'), or the " \
        "schema version to 1; nothing was taken or written" in run.error
    assert [p.name for p in commits.glob("*.json")] == ["1795788300000-1a2b3c4d.json"]
    shown = token_client("admin").get("/api/v1/channels/orders").json()["recent_exports"]
    assert shown[0]["error"] == run.error
