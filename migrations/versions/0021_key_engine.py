"""the key names its engine

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

* ``tuning_keys.engine`` (``vllm`` for every key stored before: vLLM is the engine they were
  tuned for) and the key's unique constraint over all key fields, ``engine`` included
  (:data:`tunecache.contract.KEY_FIELDS`);
* ``pod_reports.engine`` (``vllm`` for every report received before), the key field reports
  copy.

Downgrade refuses while a key or report names another engine (dropping the column would
merge keys of two engines), then drops both.
"""
from alembic import op
import sqlalchemy as sa


revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

OLD_KEY = ['gpu_name', 'arch', 'model', 'max_num_batched_tokens', 'dtype', 'quantization', 'tensor_parallel_size',
           'data_parallel_size', 'expert_parallel_size']
NEW_KEY = OLD_KEY + ['engine']


def upgrade() -> None:
    with op.batch_alter_table('tuning_keys') as batch:
        batch.add_column(sa.Column('engine', sa.String(32), nullable=False, server_default='vllm'))
        batch.drop_constraint('uq_tuning_keys_identity', type_='unique')
        batch.create_unique_constraint('uq_tuning_keys_identity', NEW_KEY)
    # ALTER TABLE ADD COLUMN on both databases (no table rebuild of the largest table on SQLite)
    op.add_column('pod_reports', sa.Column('engine', sa.String(32), nullable=False, server_default='vllm'))


def downgrade() -> None:
    bind = op.get_bind()
    other = sum(bind.execute(sa.text(f"SELECT count(*) FROM {table} WHERE engine <> 'vllm'")).scalar()
                for table in ('tuning_keys', 'pod_reports'))
    if other:
        raise RuntimeError(f"{other} tuning keys or pod reports name an engine other than vllm; "
                           "downgrading would lose what tells them apart")
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_column('engine')
    with op.batch_alter_table('tuning_keys') as batch:
        batch.drop_constraint('uq_tuning_keys_identity', type_='unique')
        batch.create_unique_constraint('uq_tuning_keys_identity', OLD_KEY)
        batch.drop_column('engine')
