"""boot attestation in pod reports

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

* ``pod_reports.compiled`` (JSON, nullable): what the reporting worker's boot still
  compiled, by kind (``tunecache.contract.CompiledKind``); ``compiled_total`` (integer,
  nullable): its sum, so the fleet view counts boots at the floor (0) in SQL. Both are
  NULL for reports that carry no attestation (every report before this revision).

Downgrade drops the two columns (the attestations go with them).
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.add_column(sa.Column('compiled', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('compiled_total', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_column('compiled_total')
        batch.drop_column('compiled')
