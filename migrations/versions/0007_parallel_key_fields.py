"""data and expert parallel sizes in the tuning key

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

``tuning_keys.data_parallel_size`` and ``expert_parallel_size`` (both default 1: every key
stored before is a deployment without them, which is what it was tuned for), and the
key's unique constraint over all key fields.
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

OLD_KEY = ['gpu_name', 'arch', 'model', 'max_num_batched_tokens', 'dtype', 'quantization', 'tensor_parallel_size']
NEW_KEY = OLD_KEY + ['data_parallel_size', 'expert_parallel_size']


def upgrade() -> None:
    with op.batch_alter_table('tuning_keys') as batch:
        batch.add_column(sa.Column('data_parallel_size', sa.Integer(), nullable=False, server_default='1'))
        batch.add_column(sa.Column('expert_parallel_size', sa.Integer(), nullable=False, server_default='1'))
        batch.drop_constraint('uq_tuning_keys_identity', type_='unique')
        batch.create_unique_constraint('uq_tuning_keys_identity', NEW_KEY)


def downgrade() -> None:
    # keys that differ only in these fields would collide: refuse rather than merge tunings
    bind = op.get_bind()
    extra = bind.execute(sa.text(
        "SELECT count(*) FROM tuning_keys WHERE data_parallel_size <> 1 OR expert_parallel_size <> 1")).scalar()
    if extra:
        raise RuntimeError(f"{extra} tuning keys have data_parallel_size or expert_parallel_size other than 1; "
                           "downgrading would lose what tells them apart")
    with op.batch_alter_table('tuning_keys') as batch:
        batch.drop_constraint('uq_tuning_keys_identity', type_='unique')
        batch.create_unique_constraint('uq_tuning_keys_identity', OLD_KEY)
        batch.drop_column('expert_parallel_size')
        batch.drop_column('data_parallel_size')
