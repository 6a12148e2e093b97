"""engine variants: a current run per variant, and the variant pods report

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03

* ``tuning_runs.variant`` (string of 16 hex digits, null where the run has no compile cache):
  the engine variant the run's compile cache is for
  (:class:`tunecache.engines.vllm.compile_cache.VariantFactors`), indexed with its key;
* ``current_variants``: the current run of each (key, environment, variant), beside
  ``current_tunings`` (the key's current run, which every pod gets its tactics from);
* ``current_tunings.previous_run_id`` (and the same in ``current_variants``): the run that was
  current before the pointer last moved (``updated_at``): retention keeps it for a while, since
  a pod that looked it up just before may still be downloading it;
* ``workers.vllm_version``: the vLLM of a job worker's image (a job that names one, an
  upgrade tuned ahead, is taken only by such a worker);
* ``pod_reports.variant``, ``pod_reports.variant_missing`` (boolean, not null, default
  false: the pod installed the key's run, but no warm state is stored for its variant) and
  ``pod_reports.engine_args`` (JSON: the pod's vLLM engine arguments that name its variant).

Downgrade drops them.
"""
from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both databases (no table rebuild on SQLite)
    op.add_column('tuning_runs', sa.Column('variant', sa.String(16), nullable=True))
    op.create_index('ix_tuning_runs_key_variant', 'tuning_runs', ['key_id', 'variant'])
    op.create_table(
        'current_variants',
        sa.Column('key_id', sa.Integer(), nullable=False),
        sa.Column('environment_id', sa.Integer(), nullable=False),
        sa.Column('variant', sa.String(16), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('previous_run_id', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(['environment_id'], ['environments.id'],
                                name=op.f('fk_current_variants_environment_id_environments')),
        sa.ForeignKeyConstraint(['key_id'], ['tuning_keys.id'], name=op.f('fk_current_variants_key_id_tuning_keys')),
        sa.ForeignKeyConstraint(['run_id'], ['tuning_runs.id'], name=op.f('fk_current_variants_run_id_tuning_runs')),
        sa.PrimaryKeyConstraint('key_id', 'environment_id', 'variant', name=op.f('pk_current_variants')),
    )
    op.create_index('ix_current_variants_run_id', 'current_variants', ['run_id'])
    op.add_column('current_tunings', sa.Column('previous_run_id', sa.Integer(), nullable=True))
    op.add_column('workers', sa.Column('vllm_version', sa.String(64), nullable=True))
    op.add_column('pod_reports', sa.Column('variant', sa.String(16), nullable=True))
    op.add_column('pod_reports', sa.Column('variant_missing', sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column('pod_reports', sa.Column('engine_args', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pod_reports') as batch:
        batch.drop_column('engine_args')
        batch.drop_column('variant_missing')
        batch.drop_column('variant')
    with op.batch_alter_table('workers') as batch:
        batch.drop_column('vllm_version')
    with op.batch_alter_table('current_tunings') as batch:
        batch.drop_column('previous_run_id')
    op.drop_index('ix_current_variants_run_id', table_name='current_variants')
    op.drop_table('current_variants')
    op.drop_index('ix_tuning_runs_key_variant', table_name='tuning_runs')
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('variant')
