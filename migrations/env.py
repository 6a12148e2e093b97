"""Alembic environment for tunecache. Run through ``tunecache db upgrade`` (or
:func:`tunecache.service.db.upgrade`), which passes the engine in ``config.attributes``."""

from alembic import context

from tunecache.service.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # plain `alembic` invocation: take the URL from settings
    from tunecache.service.db import create_db_engine
    from tunecache.service.settings import Settings

    engine = create_db_engine(Settings().resolved_database_url())

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
