"""tuning generation: a counter moved with every change of a current tuning

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

One row. The service caches lookup answers in memory per generation: a process reads the
counter (one indexed row) and answers from its cache only when the counter has not moved,
so every process and replica sees a new current run as soon as it is committed.
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table('tuning_generation',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('value', sa.BigInteger(), nullable=False),
    sa.CheckConstraint('id = 1', name=op.f('ck_tuning_generation_one_row')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tuning_generation'))
    )
    op.bulk_insert(table, [{"id": 1, "value": 0}])


def downgrade() -> None:
    op.drop_table('tuning_generation')
