"""The tunecache service: HTTP API, storage, and the GPU tuner (runs on GPU nodes)."""
