"""job cancellation and GPU worker heartbeats

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

* ``tuning_jobs``: the ``cancelled`` status (the status CHECK is extended, as 0004 made
  it), ``cancel_requested_at`` (a running job its worker is to stop) and ``cancelled_by``
  (the token's name). On SQLite the table is copied (batch mode): the partial unique index
  of active jobs is dropped first and made again after, so its ``WHERE`` survives the copy.
* ``workers``: one row per GPU job worker, upserted by its heartbeat.

Downgrade keeps every job: a ``cancelled`` job becomes ``failed`` with the error
``cancelled`` (the old schema has no other finished state that frees its key), and a
pending cancellation of a running job is dropped with its column.
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

OLD_JOB_STATUSES = ("queued", "running", "succeeded", "failed")
JOB_STATUSES = OLD_JOB_STATUSES + ("cancelled",)
ACTIVE = sa.text("status IN ('queued', 'running')")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _job_status_check(statuses: tuple[str, ...], add_columns: bool) -> None:
    op.drop_index('uq_tuning_jobs_active_key', table_name='tuning_jobs')
    with op.batch_alter_table('tuning_jobs') as batch:
        batch.drop_constraint(op.f('ck_tuning_jobs_status'), type_='check')
        if add_columns:
            batch.add_column(sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True))
            batch.add_column(sa.Column('cancelled_by', sa.String(length=64), nullable=True))
        else:
            batch.drop_column('cancelled_by')
            batch.drop_column('cancel_requested_at')
        batch.create_check_constraint(op.f('ck_tuning_jobs_status'), _in('status', statuses))
    op.create_index('uq_tuning_jobs_active_key', 'tuning_jobs', ['key_id'], unique=True,
                    postgresql_where=ACTIVE, sqlite_where=ACTIVE)


def upgrade() -> None:
    _job_status_check(JOB_STATUSES, add_columns=True)
    op.create_table('workers',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('gpu_name', sa.String(length=128), nullable=False),
    sa.Column('arch', sa.String(length=16), nullable=False),
    sa.Column('model_config_dir', sa.Boolean(), nullable=False),
    sa.Column('heartbeat_s', sa.Float(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_workers'))
    )
    op.create_index(op.f('ix_workers_last_seen'), 'workers', ['last_seen'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_workers_last_seen'), table_name='workers')
    op.drop_table('workers')
    op.execute("UPDATE tuning_jobs SET status = 'failed', error = COALESCE(error, 'cancelled') WHERE status = 'cancelled'")
    _job_status_check(OLD_JOB_STATUSES, add_columns=False)
