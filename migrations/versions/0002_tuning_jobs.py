"""tuning jobs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tuning_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('hf_config', sa.JSON(), nullable=True),
    sa.Column('options', sa.JSON(), nullable=True),
    sa.Column('requested_by', sa.String(length=255), nullable=True),
    sa.Column('stage', sa.String(length=64), nullable=True),
    sa.Column('step', sa.Integer(), nullable=True),
    sa.Column('total', sa.Integer(), nullable=True),
    sa.Column('log_tail', sa.Text(), nullable=True),
    sa.Column('worker', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['key_id'], ['tuning_keys.id'], name=op.f('fk_tuning_jobs_key_id_tuning_keys')),
    sa.ForeignKeyConstraint(['run_id'], ['tuning_runs.id'], name=op.f('fk_tuning_jobs_run_id_tuning_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tuning_jobs'))
    )
    with op.batch_alter_table('tuning_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_tuning_jobs_status_created', ['status', 'created_at'], unique=False)
        batch_op.create_index('uq_tuning_jobs_active_key', ['key_id'], unique=True, postgresql_where=sa.text("status IN ('queued', 'running')"), sqlite_where=sa.text("status IN ('queued', 'running')"))



def downgrade() -> None:
    with op.batch_alter_table('tuning_jobs', schema=None) as batch_op:
        batch_op.drop_index('uq_tuning_jobs_active_key', postgresql_where=sa.text("status IN ('queued', 'running')"), sqlite_where=sa.text("status IN ('queued', 'running')"))
        batch_op.drop_index('ix_tuning_jobs_status_created')

    op.drop_table('tuning_jobs')
