"""the runs a pod boot installed from

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-10

* ``pod_reports.installed_from`` (JSON list of run ids, null where the report did not say):
  every run whose artifacts the boot installed (the warm state's, the tactics', an engine
  variant's compile cache's), :attr:`tunecache.contract.PodReportCreate.installed_from`.

Downgrade drops it.
"""
from alembic import op
import sqlalchemy as sa


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both databases (no table rebuild on SQLite)
    op.add_column('pod_reports', sa.Column('installed_from', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_column('installed_from')
