"""The dashboard's fleet page with its pictures against a few thousand pod reports: SQL
statements and time per page, beside the baseline of the same run (the fleet view alone,
what the page read before it drew anything).

    .venv/bin/python bench/dashboard_fleet.py [--database-url URL] [--reports 5000] [--keys 200] [--repeat 20]

The database (default: a new SQLite file in a temporary directory; ``--database-url`` a
PostgreSQL database of its own, whose pod reports are deleted first) is brought to the head
revision and seeded with ``--keys`` keys, one run
each (with stage times) and ``--reports`` pod reports over the last 24 hours: most boots
installed at the floor (warm), some still compiling, some errors, some misses, a few of an
engine variant without warm state. Then:

* ``baseline``: :func:`tunecache.service.reports.fleet_view` in a transaction (the fleet
  page's read before its pictures);
* ``pictures``: the same plus :func:`tunecache.service.dashboard.figures.fleet_figures`;
* ``page``: ``GET /`` through the app (rendering included).

Each is run ``--repeat`` times after one untimed run; the script prints the SQL statements
of one run and the median milliseconds. The statements do not grow with the reports (the
pictures' reads are grouped in the database and bounded by the window, its buckets and
row limits): ``tests/e2e/test_dashboard_pictures.py`` checks that.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import delete, event

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.builders import file_environment, h200_key, run_payload
from tests.support.paths import CUDNN_FILE
from tunecache.contract import PodReportCreate, ReportOutcome, ReportSource, TuningRunCreate
from tunecache.service import db, publishing, reports
from tunecache.service.blobs import store_blob
from tunecache.service.dashboard.figures import fleet_figures
from tunecache.service.models import PodReport


def seed(engine, keys: int, count: int) -> None:
    sessions = db.session_factory(engine)
    data = CUDNN_FILE.read_bytes()
    environment = file_environment(CUDNN_FILE)
    now = dt.datetime.now(dt.timezone.utc)
    with sessions.begin() as session:
        session.execute(delete(PodReport))
        store_blob(session, io.BytesIO(data), hashlib.sha256(data).hexdigest())
        run_ids, tuned = [], [h200_key(model=f"bench/model-{i:04d}") for i in range(keys)]
        for i, key in enumerate(tuned):
            payload = run_payload(CUDNN_FILE, key, trigger="cli")
            payload["summary"]["stages"] = {"gemm": {"status": "done", "seconds": 30.0 + i % 7},
                                            "attention": {"status": "done", "seconds": 5.0}}
            run = publishing.record_run(session, TuningRunCreate.model_validate(payload), trusted=True, recorded_by="bench",
                                        trusted_keys=None, force=True)
            run_ids.append(run.id)
        for n in range(count):
            i = n % keys
            kind = n % 10
            outcome = ReportOutcome.ERROR if kind == 8 else ReportOutcome.MISS if kind == 9 else ReportOutcome.INSTALLED
            fields = {"error_kind": "ServerUnreachable"} if outcome is ReportOutcome.ERROR else {}
            if outcome is ReportOutcome.INSTALLED:
                fields.update(run_id=run_ids[i], compiled={"triton_kernels": 2 if kind == 7 else 0})
            if outcome is ReportOutcome.MISS:
                fields["environment"] = environment
            if kind == 6:
                fields.update(variant=f"{i % 50:016x}", variant_missing=True)
            report = PodReportCreate(key=tuned[i], environment_hash=environment.environment_hash(), outcome=outcome,
                                     install_seconds=1.2, pod=f"pod-{n % 997}", source=ReportSource.PLUGIN,
                                     boot_id=f"{n:016x}", **fields)
            reports.record_report(session, report, received_at=now - dt.timedelta(seconds=(n * 86_000) // count))


def measure(engine, call, repeat: int) -> tuple[int, float]:
    statements = 0

    def counted(*_):
        nonlocal statements
        statements += 1

    call()
    event.listen(engine, "before_cursor_execute", counted)
    call()
    event.remove(engine, "before_cursor_execute", counted)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statements, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("--reports", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory()
    url = args.database_url or f"sqlite:///{scratch.name}/bench.db"
    engine = db.create_db_engine(url)
    db.upgrade(engine)
    seed(engine, args.keys, args.reports)
    sessions = db.session_factory(engine)

    def baseline():
        with sessions.begin() as session:
            reports.fleet_view(session, 24, limit=100, wanted_limit=100)

    def pictures():
        with sessions.begin() as session:
            fleet_figures(session, reports.fleet_view(session, 24, limit=100, wanted_limit=100))

    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    with TestClient(create_app(Settings(database_url=url, worker="off", data_dir=Path(scratch.name) / "data"),
                               engine=engine)) as client:
        def page():
            assert client.get("/").status_code == 200

        print(f"{engine.dialect.name}: {args.keys} keys, {args.reports} pod reports in the last 24 h")
        for name, call in (("baseline (fleet view)", baseline), ("pictures (view + figures)", pictures),
                           ("page (GET /)", page)):
            statements, ms = measure(engine, call, args.repeat)
            print(f"  {name:28s} {statements:3d} SQL statements  {ms:8.1f} ms median of {args.repeat}")
    engine.dispose()


if __name__ == "__main__":
    main()
