"""The trace store on object storage: a real S3-compatible server (moto's), s3:// data dir, local WAL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core.servers import free_port, stop_process, wait_http_ok


@pytest.fixture(scope="module")
def s3_endpoint():
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/moto-api/", 30, server, what="moto S3 server")
        env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        import boto3

        boto3.client("s3").create_bucket(Bucket="traces")
        yield env
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    finally:
        stop_process(server)


def test_spans_land_in_s3_and_are_queryable_and_compacted(s3_endpoint, tmp_path):
    import boto3

    with local_collector(
        "s3://traces/prod", wal_dir=str(tmp_path / "wal"), compact_min_files=3, compact_grace_s=0
    ) as collector:
        for batch in range(3):
            body = request_bytes(make_spans(lambda t, b=batch: [t.start_span(f"s3-{b}-{i}").end() for i in range(4)]))
            assert post(collector.http_endpoint + "/v1/traces", body)[0] == 200
            collector.flush()
        assert connect("s3://traces/prod").execute("SELECT count(*) FROM spans").fetchone()[0] == 12
        assert collector.pipeline.compact() == 1
        collector.pipeline.delete_doomed()
    listing = boto3.client("s3").list_objects_v2(Bucket="traces", Prefix="prod/spans/service=")["Contents"]
    keys = sorted(o["Key"] for o in listing if not o["Key"].endswith("/"))  # pyarrow keeps directory markers
    assert len(keys) == 2 and "/compact-" in keys[0] and "/date=" in keys[0]
    assert keys[1] == keys[0].removesuffix(".parquet") + ".rollouts"  # its rollout index (rollout_index.py)
    # the index, read from S3, rules the file out for a rollout it does not hold
    assert connect("s3://traces/prod", rollout_ids="r").execute("SELECT count(*) FROM spans").fetchone() == (0,)
    names = connect("s3://traces/prod").execute("SELECT name FROM spans ORDER BY name").fetchall()
    assert len(names) == 12 and names[0] == ("s3-0-0",)


def test_an_object_store_needs_a_local_wal(s3_endpoint):
    with pytest.raises(ValueError, match="wal-dir"):
        local_collector("s3://traces/other")
