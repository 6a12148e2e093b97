"""artifact bytes in chunks (stream large JIT modules)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Moves ``artifact_blobs.content`` into ``artifact_chunks`` rows of 4 MiB, and back on
downgrade, so stored artifacts survive both directions.
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

CHUNK_BYTES = 4 * 1024 * 1024

blobs = sa.table("artifact_blobs", sa.column("sha256", sa.String), sa.column("content", sa.LargeBinary))
chunks = sa.table(
    "artifact_chunks", sa.column("sha256", sa.String), sa.column("seq", sa.Integer), sa.column("data", sa.LargeBinary)
)


def upgrade() -> None:
    op.create_table('artifact_chunks',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['sha256'], ['artifact_blobs.sha256'], name=op.f('fk_artifact_chunks_sha256_artifact_blobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('sha256', 'seq', name=op.f('pk_artifact_chunks'))
    )
    connection = op.get_bind()
    for sha256 in connection.execute(sa.select(blobs.c.sha256)).scalars().all():
        content = connection.execute(sa.select(blobs.c.content).where(blobs.c.sha256 == sha256)).scalar_one()
        parts = [content[i:i + CHUNK_BYTES] for i in range(0, len(content), CHUNK_BYTES)]
        for seq, part in enumerate(parts):
            connection.execute(chunks.insert().values(sha256=sha256, seq=seq, data=part))
    with op.batch_alter_table('artifact_blobs', schema=None) as batch_op:
        batch_op.drop_column('content')


def downgrade() -> None:
    with op.batch_alter_table('artifact_blobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('content', sa.LargeBinary(), nullable=True))
    connection = op.get_bind()
    for sha256 in connection.execute(sa.select(blobs.c.sha256)).scalars().all():
        parts = connection.execute(
            sa.select(chunks.c.data).where(chunks.c.sha256 == sha256).order_by(chunks.c.seq)
        ).scalars().all()
        connection.execute(blobs.update().where(blobs.c.sha256 == sha256).values(content=b"".join(parts)))
    with op.batch_alter_table('artifact_blobs', schema=None) as batch_op:
        batch_op.alter_column('content', existing_type=sa.LargeBinary(), nullable=False)
    op.drop_table('artifact_chunks')
