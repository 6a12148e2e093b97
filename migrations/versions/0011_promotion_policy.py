"""promotion policy: held runs and server-verified signatures

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

* ``tuning_runs.held`` (text, nullable): why a succeeded, verified run did not become
  current when it was recorded (not signed by a key the service trusts, emptier than the
  current run, a flagged regression); cleared by a promotion.
* ``tuning_runs.signature_verified`` (boolean, nullable): whether the service checked the
  run's signature against its own trusted keys (``TUNECACHE_TRUSTED_KEYS``).
* ``tuning_runs.signature_manifest`` (integer, nullable): the manifest format the signature
  is over (NULL: format 1, every signature before this revision), and its
  ``signature_signed_at`` / ``signature_expires_at`` (seconds since the epoch, format 2).

Downgrade drops the five columns.
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.add_column(sa.Column('held', sa.Text(), nullable=True))
        batch.add_column(sa.Column('signature_verified', sa.Boolean(), nullable=True))
        batch.add_column(sa.Column('signature_manifest', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('signature_signed_at', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('signature_expires_at', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('signature_expires_at')
        batch.drop_column('signature_signed_at')
        batch.drop_column('signature_manifest')
        batch.drop_column('signature_verified')
        batch.drop_column('held')
