"""retired runs

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05

* ``tuning_runs.retired_at`` (timestamp, null: in use): when an admin retired the run
  (``POST /v1/tunings/{id}/retire``, ``tunecache retire RUN``): it is never current again and
  never served, and stays in the history (:mod:`tunecache.service.retiring`).

Downgrade drops the column (retired runs then read as runs that are merely not current).
"""
from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both databases (as 0014: no table rebuild on SQLite)
    op.add_column('tuning_runs', sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('retired_at')
