"""tokens, audit log, run signatures

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

* ``api_tokens``: bearer tokens with a scope (read, push, tune, admin), stored as the
  sha256 of their secret only.
* ``audit_events``: every write with the name and scope of its token.
* ``tuning_runs.signing_key_id`` / ``signature``: the tuner node's Ed25519 signature over
  the run's manifest; ``recorded_by``: the name of the token that recorded it.
"""
from alembic import op
import sqlalchemy as sa



revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

SCOPES = "scope IN ('read', 'push', 'tune', 'admin')"


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('token_id', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('secret_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=64), nullable=True),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(SCOPES, name=op.f('ck_api_tokens_scope')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('name', name=op.f('uq_api_tokens_name')),
    sa.UniqueConstraint('token_id', name=op.f('uq_api_tokens_token_id'))
    )
    op.create_table('audit_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('token_name', sa.String(length=64), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('method', sa.String(length=8), nullable=False),
    sa.Column('path', sa.String(length=512), nullable=False),
    sa.Column('detail', sa.String(length=1024), nullable=True),
    sa.CheckConstraint(SCOPES, name=op.f('ck_audit_events_scope')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    op.create_index(op.f('ix_audit_events_token_name'), 'audit_events', ['token_name'], unique=False)
    with op.batch_alter_table('tuning_runs') as batch:
        batch.add_column(sa.Column('signing_key_id', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('signature', sa.String(length=128), nullable=True))
        batch.add_column(sa.Column('recorded_by', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tuning_runs') as batch:
        batch.drop_column('recorded_by')
        batch.drop_column('signature')
        batch.drop_column('signing_key_id')
    op.drop_index(op.f('ix_audit_events_token_name'), table_name='audit_events')
    op.drop_table('audit_events')
    op.drop_table('api_tokens')
