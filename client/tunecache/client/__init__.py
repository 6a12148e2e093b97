"""Pod-side code: detect the environment, fetch a tuning, install it where FlashInfer reads it.

Imports only the standard library, pydantic and httpx (never fastapi/sqlalchemy), so
it can run inside a vLLM pod.
"""
