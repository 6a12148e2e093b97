"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('artifact_blobs',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('content', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_artifact_blobs'))
    )
    op.create_table('environments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('env_hash', sa.String(length=64), nullable=False),
    sa.Column('flashinfer_version', sa.String(length=64), nullable=False),
    sa.Column('cuda_version', sa.String(length=64), nullable=False),
    sa.Column('cublas_version', sa.String(length=64), nullable=False),
    sa.Column('cudnn_version', sa.String(length=64), nullable=False),
    sa.Column('cudnn_frontend_version', sa.String(length=64), nullable=False),
    sa.Column('cutlass_dsl_version', sa.Text(), nullable=False),
    sa.Column('gpu', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_environments')),
    sa.UniqueConstraint('env_hash', name=op.f('uq_environments_env_hash'))
    )
    op.create_table('tuning_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_name', sa.String(length=128), nullable=False),
    sa.Column('arch', sa.String(length=16), nullable=False),
    sa.Column('model', sa.String(length=512), nullable=False),
    sa.Column('max_num_batched_tokens', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=32), nullable=False),
    sa.Column('quantization', sa.String(length=32), nullable=False),
    sa.Column('tensor_parallel_size', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tuning_keys')),
    sa.UniqueConstraint('gpu_name', 'arch', 'model', 'max_num_batched_tokens', 'dtype', 'quantization', 'tensor_parallel_size', name='uq_tuning_keys_identity')
    )
    with op.batch_alter_table('tuning_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuning_keys_model'), ['model'], unique=False)

    op.create_table('tuning_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key_id', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('verified', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_tuning_runs_environment_id_environments')),
    sa.ForeignKeyConstraint(['key_id'], ['tuning_keys.id'], name=op.f('fk_tuning_runs_key_id_tuning_keys')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tuning_runs'))
    )
    with op.batch_alter_table('tuning_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuning_runs_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuning_runs_environment_id'), ['environment_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuning_runs_key_id'), ['key_id'], unique=False)

    op.create_table('current_tunings',
    sa.Column('key_id', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_current_tunings_environment_id_environments')),
    sa.ForeignKeyConstraint(['key_id'], ['tuning_keys.id'], name=op.f('fk_current_tunings_key_id_tuning_keys')),
    sa.ForeignKeyConstraint(['run_id'], ['tuning_runs.id'], name=op.f('fk_current_tunings_run_id_tuning_runs')),
    sa.PrimaryKeyConstraint('key_id', 'environment_id', name=op.f('pk_current_tunings'))
    )
    op.create_table('run_artifacts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('media_type', sa.String(length=128), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['tuning_runs.id'], name=op.f('fk_run_artifacts_run_id_tuning_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['sha256'], ['artifact_blobs.sha256'], name=op.f('fk_run_artifacts_sha256_artifact_blobs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_run_artifacts')),
    sa.UniqueConstraint('run_id', 'name', name='uq_run_artifacts_run_name')
    )
    with op.batch_alter_table('run_artifacts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_run_artifacts_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_run_artifacts_sha256'), ['sha256'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('run_artifacts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_run_artifacts_sha256'))
        batch_op.drop_index(batch_op.f('ix_run_artifacts_run_id'))

    op.drop_table('run_artifacts')
    op.drop_table('current_tunings')
    with op.batch_alter_table('tuning_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuning_runs_key_id'))
        batch_op.drop_index(batch_op.f('ix_tuning_runs_environment_id'))
        batch_op.drop_index(batch_op.f('ix_tuning_runs_created_at'))

    op.drop_table('tuning_runs')
    with op.batch_alter_table('tuning_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuning_keys_model'))

    op.drop_table('tuning_keys')
    op.drop_table('environments')
    op.drop_table('artifact_blobs')
