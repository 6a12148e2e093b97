"""CHECK constraints on run and job statuses and run triggers

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

The values are those of the contract's enums at this revision (``RunStatus``,
``RunTrigger``, ``JobStatus`` in ``tunecache.contract``); a later change to an enum
comes with its own migration. On SQLite the tables are copied (batch mode); the partial
unique index of active jobs is dropped first and made again after, so its ``WHERE``
survives the copy.
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

RUN_STATUSES = ("succeeded", "failed")
RUN_TRIGGERS = ("upload", "cli", "http", "pod")
JOB_STATUSES = ("queued", "running", "succeeded", "failed")
ACTIVE = sa.text("status IN ('queued', 'running')")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.create_check_constraint(op.f('ck_tuning_runs_status'), _in('status', RUN_STATUSES))
        batch.create_check_constraint(op.f('ck_tuning_runs_trigger'), _in('trigger', RUN_TRIGGERS))
    op.drop_index('uq_tuning_jobs_active_key', table_name='tuning_jobs')
    with op.batch_alter_table('tuning_jobs') as batch:
        batch.create_check_constraint(op.f('ck_tuning_jobs_status'), _in('status', JOB_STATUSES))
    op.create_index('uq_tuning_jobs_active_key', 'tuning_jobs', ['key_id'], unique=True,
                    postgresql_where=ACTIVE, sqlite_where=ACTIVE)


def downgrade() -> None:
    op.drop_index('uq_tuning_jobs_active_key', table_name='tuning_jobs')
    with op.batch_alter_table('tuning_jobs') as batch:
        batch.drop_constraint(op.f('ck_tuning_jobs_status'), type_='check')
    op.create_index('uq_tuning_jobs_active_key', 'tuning_jobs', ['key_id'], unique=True,
                    postgresql_where=ACTIVE, sqlite_where=ACTIVE)
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_constraint(op.f('ck_tuning_runs_trigger'), type_='check')
        batch.drop_constraint(op.f('ck_tuning_runs_status'), type_='check')
