"""pod reports and the history's indexes

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

* ``pod_reports``: one row per install on a pod (``POST /v1/reports``): the key by value
  and its ``key_hash``, the environment's hash (the environment itself on a miss), the
  outcome, the run, the closest run's differing fields, the error's kind, seconds, JIT
  modules, pod name, rank and source. Indexes ``(received_at, key_hash, outcome)`` (hit
  rates over a window, the retention delete) and ``(outcome, received_at, key_hash,
  environment_hash)`` (a window's misses by key and environment: the wanted list).
* ``tuning_runs``: ``(created_at, id)``, ``(key_id, created_at, id)`` and
  ``(environment_id, created_at, id)``: the history's order and cursor (newest first),
  overall, within a key and within an environment.

Downgrade drops the table (the reports go with it) and the three indexes.
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pod_reports',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('gpu_name', sa.String(length=128), nullable=False),
    sa.Column('arch', sa.String(length=16), nullable=False),
    sa.Column('model', sa.String(length=512), nullable=False),
    sa.Column('max_num_batched_tokens', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=32), nullable=False),
    sa.Column('quantization', sa.String(length=32), nullable=False),
    sa.Column('tensor_parallel_size', sa.Integer(), nullable=False),
    sa.Column('data_parallel_size', sa.Integer(), nullable=False),
    sa.Column('expert_parallel_size', sa.Integer(), nullable=False),
    sa.Column('environment_hash', sa.String(length=64), nullable=False),
    sa.Column('environment', sa.JSON(), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('differences', sa.JSON(), nullable=True),
    sa.Column('error_kind', sa.String(length=64), nullable=True),
    sa.Column('install_seconds', sa.Float(), nullable=False),
    sa.Column('jit_modules', sa.Integer(), nullable=False),
    sa.Column('jit_skipped', sa.Integer(), nullable=False),
    sa.Column('pod', sa.String(length=255), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('looked_up', sa.Boolean(), nullable=False),
    sa.CheckConstraint("outcome IN ('installed', 'miss', 'error')", name=op.f('ck_pod_reports_outcome')),
    sa.CheckConstraint("source IN ('cli', 'api', 'plugin')", name=op.f('ck_pod_reports_source')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pod_reports'))
    )
    op.create_index('ix_pod_reports_received_key', 'pod_reports', ['received_at', 'key_hash', 'outcome'], unique=False)
    op.create_index('ix_pod_reports_outcome_received', 'pod_reports',
                    ['outcome', 'received_at', 'key_hash', 'environment_hash'], unique=False)
    op.create_index('ix_tuning_runs_created_id', 'tuning_runs', ['created_at', 'id'], unique=False)
    op.create_index('ix_tuning_runs_key_created', 'tuning_runs', ['key_id', 'created_at', 'id'], unique=False)
    op.create_index('ix_tuning_runs_environment_created', 'tuning_runs', ['environment_id', 'created_at', 'id'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_tuning_runs_environment_created', table_name='tuning_runs')
    op.drop_index('ix_tuning_runs_key_created', table_name='tuning_runs')
    op.drop_index('ix_tuning_runs_created_id', table_name='tuning_runs')
    op.drop_index('ix_pod_reports_outcome_received', table_name='pod_reports')
    op.drop_index('ix_pod_reports_received_key', table_name='pod_reports')
    op.drop_table('pod_reports')
