"""What the tests share: fixture file paths, payload builders, the `tunecache` command and
live `tunecache serve` processes, JIT tarballs, the stand-in tuner and the stand-in vLLM.

Fixtures (pytest's) stay in tests/conftest.py; test modules import these helpers from here,
never from one another."""
