"""pinned runs (retention)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

* ``tuning_runs.pinned`` (boolean, not null, default false): an admin pinned the run
  (``PUT /v1/tunings/{id}/pin``); the retention pass (``TUNECACHE_RUN_RETENTION``,
  :mod:`tunecache.service.retention`) never deletes it.

Downgrade drops the column.
"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both databases: a batch operation would rebuild the table on
    # SQLite, and its indexes in another order (the planner's pick among equal indexes moves)
    op.add_column('tuning_runs', sa.Column('pinned', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('pinned')
