"""verification boots of runs

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

* ``tuning_runs.verification`` (JSON, nullable): the run's verification boot
  (:class:`tunecache.contract.RunVerification`: what a new vLLM process that installed the
  stored run still compiled, how long it took to be ready, or why it did not boot).

Downgrade drops the column.
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.add_column(sa.Column('verification', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('verification')
