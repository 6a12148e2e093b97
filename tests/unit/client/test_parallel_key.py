"""Issue 10, row 8: what changes the tuned shapes in vLLM's parallel config is in the key.

A pod with expert parallelism (EP) and one without, same model and tp, tune different MoE
shapes (vLLM splits the experts over tp x dp ranks instead of each expert's
intermediate), and a MoE layer without EP is split over tp x dp ranks: so
``data_parallel_size`` and ``expert_parallel_size`` are key fields, a pod gets only a
tuning made for its own, and keys stored before the fields existed keep meaning "1".
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from tests.support.paths import CUDNN_FILE
from tests.support.builders import run_payload, store_file
from tunecache.contract import TuningKey, TuningRunCreate, expert_parallel_size
from tunecache.service import db, publishing
from tunecache.service.tuner.model_config import moe_shape
from tests.support.paths import FIXTURES

QWEN3_MOE = json.loads((FIXTURES / "models" / "qwen3-30b-a3b" / "config.json").read_text())


def test_expert_parallel_size_is_vllms_ep_size():
    assert expert_parallel_size(4) == 1
    assert expert_parallel_size(4, enable_expert_parallel=True) == 4
    assert expert_parallel_size(2, 4, enable_expert_parallel=True) == 8
    assert expert_parallel_size(2, 2, True, prefill_context_parallel_size=2) == 8


def test_a_key_with_an_ep_size_vllm_cannot_make_is_refused():
    base = dict(gpu_name="NVIDIA H200", arch="sm90", model="m", max_num_batched_tokens=8192, tensor_parallel_size=2)
    assert TuningKey(**base, data_parallel_size=2, expert_parallel_size=4).expert_parallel_size == 4
    with pytest.raises(ValidationError, match="must be 1 or a multiple of tensor_parallel_size x data_parallel_size"):
        TuningKey(**base, expert_parallel_size=3)


def test_moe_shapes_follow_vllms_split():
    plain = moe_shape(QWEN3_MOE, tensor_parallel_size=2)
    flattened = moe_shape(QWEN3_MOE, tensor_parallel_size=2, data_parallel_size=2)  # tp x dp = 4 ranks
    experts = moe_shape(QWEN3_MOE, tensor_parallel_size=2, expert_parallel_size=4, data_parallel_size=2)
    assert plain.intermediate == 2 * flattened.intermediate and plain.local_experts == flattened.local_experts
    assert experts.local_experts == plain.experts // 4 and experts.intermediate == plain.intermediate * 2


def test_keys_stored_before_0007_mean_one_and_a_downgrade_keeps_them_apart(database_url):
    engine = db.create_db_engine(database_url)
    db.upgrade(engine, "0006")
    with db.session_factory(engine)() as session:
        store_file(session, CUDNN_FILE)
        session.commit()
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO tuning_keys (gpu_name, arch, model, max_num_batched_tokens, dtype, quantization, "
            "tensor_parallel_size, created_at) VALUES ('NVIDIA H200', 'sm90', 'm', 8192, 'auto', 'auto', 2, :t)"),
            {"t": "2026-11-01 00:00:00"})
    db.upgrade(engine)
    with engine.connect() as connection:
        row = connection.execute(text("SELECT data_parallel_size, expert_parallel_size FROM tuning_keys")).one()
    assert tuple(row) == (1, 1)
    with db.session_factory(engine)() as session:  # a key with EP now lives beside it
        payload = run_payload(CUDNN_FILE)
        payload["key"] |= {"model": "m", "tensor_parallel_size": 2, "expert_parallel_size": 2}
        publishing.record_run(session, TuningRunCreate.model_validate(payload))
        session.commit()
    with pytest.raises(RuntimeError, match="1 tuning keys have data_parallel_size or expert_parallel_size other than 1"):
        db.downgrade(engine, "0006")
    with engine.connect() as connection:  # nothing was lost by the refused downgrade
        assert connection.execute(text("SELECT count(*) FROM tuning_keys")).scalar_one() == 2
    engine.dispose()
