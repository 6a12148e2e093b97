"""pod report boots and sources

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

* ``pod_reports.boot_id`` (nullable): the pod boot a report belongs to (reports of one boot
  count once in the fleet view; ``NULL``: a client before it, each report a boot of its own);
* ``pod_reports.sender`` (nullable): the source that sent it (client address, or the
  token's name), so the wanted list counts distinct sources;
* the index ``(received_at, key_hash, outcome)`` gains ``boot_id``: the hit rates count
  distinct boots from the index alone, as they counted rows.

Downgrade drops the columns and restores the index.
"""
from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.add_column(sa.Column('boot_id', sa.String(64), nullable=True))
        batch.add_column(sa.Column('sender', sa.String(128), nullable=True))
        batch.drop_index('ix_pod_reports_received_key')
        batch.create_index('ix_pod_reports_received_key', ['received_at', 'key_hash', 'outcome', 'boot_id'])


def downgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_index('ix_pod_reports_received_key')
        batch.create_index('ix_pod_reports_received_key', ['received_at', 'key_hash', 'outcome'])
        batch.drop_column('sender')
        batch.drop_column('boot_id')
