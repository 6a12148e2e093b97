"""auto-tune by tokens: the token a pod report came with, and the automatic tunings refused

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04

* ``pod_reports.token_name`` (string of at most 64, null: no token): the token a report was
  sent with; only reports sent with a token count towards an automatic tuning of an engine
  variant, once per distinct token (``tunecache.service.variant_autotune``); indexed, for
  those reports only, by key hash, variant and time;
* ``auto_tune_refusals``: automatic tunings refused, counted per hour, key hash, variant and
  reason (``tunecache.service.auto_tune_refusals``; the fleet view shows them).

Reports stored before have no token: none of them counts. Downgrade drops both.
"""
from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both databases (no table rebuild on SQLite)
    op.add_column('pod_reports', sa.Column('token_name', sa.String(64), nullable=True))
    op.create_index('ix_pod_reports_token_variant', 'pod_reports', ['key_hash', 'variant', 'received_at'],
                    postgresql_where=sa.text('token_name IS NOT NULL'), sqlite_where=sa.text('token_name IS NOT NULL'))
    op.create_table(
        'auto_tune_refusals',
        sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
        sa.Column('key_hash', sa.String(64), nullable=False),
        sa.Column('variant', sa.String(16), nullable=False),
        sa.Column('reason', sa.String(16), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.Column('last_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('hour', 'key_hash', 'variant', 'reason', name=op.f('pk_auto_tune_refusals')),
    )


def downgrade() -> None:
    op.drop_table('auto_tune_refusals')
    op.drop_index('ix_pod_reports_token_variant', table_name='pod_reports',
                  postgresql_where=sa.text('token_name IS NOT NULL'), sqlite_where=sa.text('token_name IS NOT NULL'))
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_column('token_name')
