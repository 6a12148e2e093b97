"""Alembic environment for tunecache. Run through ``tunecache db upgrade`` (or
:func:`tunecache.service.db.upgrade`), which passes the engine in ``config.attributes``.

On SQLite, ALTERs are done by copying tables ("batch" mode), which drops the old table:
foreign keys are switched off for the migration and checked once it is done.
"""

from alembic import context

from tunecache.service.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # plain `alembic` invocation: take the URL from settings
    from tunecache.service.db import create_db_engine
    from tunecache.service.settings import Settings

    engine = create_db_engine(Settings().resolved_database_url())

with engine.connect() as connection:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")  # no effect inside a transaction
        connection.commit()
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=sqlite,
        compare_type=True,
    )
    with connection.begin():
        context.run_migrations()
        if sqlite:
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migration left rows with dangling foreign keys: {broken[:5]}")
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()
