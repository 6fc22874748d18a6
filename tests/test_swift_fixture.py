"""The Swift S3 fixture (tests/swift_server.py) against the two clients the project
uses: boto3 and pyarrow's S3 filesystem."""

from __future__ import annotations

import uuid

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.config import Config as BotoConfig
from pyarrow import fs

from .swift_server import SwiftS3Server


def bucket_name() -> str:
    return f"comet-{uuid.uuid4().hex[:12]}"


def test_boto3(s3env: SwiftS3Server) -> None:
    s3 = boto3.client("s3", config=BotoConfig(retries={"max_attempts": 1}))  # all from env()
    assert s3.meta.endpoint_url == s3env.endpoint_url
    bucket = bucket_name()
    s3.create_bucket(Bucket=bucket)
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]

    body = b"comet " * 1000
    s3.put_object(Bucket=bucket, Key="a/one.bin", Body=body, ContentType="application/octet-stream")
    got = s3.get_object(Bucket=bucket, Key="a/one.bin")
    assert got["Body"].read() == body
    assert got["ContentLength"] == len(body)

    s3.copy_object(Bucket=bucket, Key="b/two.bin", CopySource={"Bucket": bucket, "Key": "a/one.bin"})
    assert s3.get_object(Bucket=bucket, Key="b/two.bin")["Body"].read() == body

    listed = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["a/one.bin", "b/two.bin"]
    assert [o["Size"] for o in listed["Contents"]] == [len(body)] * 2
    under_a = s3.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [o["Key"] for o in under_a["Contents"]] == ["a/one.bin"]
    dirs = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in dirs["CommonPrefixes"]] == ["a/", "b/"]

    s3.delete_object(Bucket=bucket, Key="a/one.bin")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["b/two.bin"]
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="a/one.bin")

    s3.delete_object(Bucket=bucket, Key="b/two.bin")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    s3.delete_bucket(Bucket=bucket)


def test_boto3_multipart_upload(s3env: SwiftS3Server) -> None:
    """What upload_file does above its threshold (s3api needs slo for it)."""
    s3 = boto3.client("s3")
    bucket = bucket_name()
    s3.create_bucket(Bucket=bucket)
    part = 5 * 1024 * 1024  # S3's (and s3api's) minimum part size
    data = bytes(range(256)) * (part * 2 // 256) + b"tail"
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big.bin")["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(data), part), start=1):
        etag = s3.upload_part(Bucket=bucket, Key="big.bin", UploadId=upload, PartNumber=number,
                              Body=data[start:start + part])["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    s3.complete_multipart_upload(Bucket=bucket, Key="big.bin", UploadId=upload,
                                 MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket=bucket, Key="big.bin")["Body"].read() == data


def test_pyarrow_s3_filesystem(s3env: SwiftS3Server) -> None:
    bucket = bucket_name()
    boto3.client("s3").create_bucket(Bucket=bucket)
    s3 = fs.S3FileSystem(access_key=s3env.access_key, secret_key=s3env.secret_key,
                         endpoint_override=s3env.endpoint_url, scheme="http", region=s3env.region)

    table = pa.table({"id": pa.array(range(1000), pa.int64()),
                      "name": pa.array([f"event-{i}" for i in range(1000)])})
    path = f"{bucket}/prefix/x.parquet"
    pq.write_table(table, path, filesystem=s3)
    assert pq.read_table(path, filesystem=s3).equals(table)

    s3.copy_file(path, f"{bucket}/prefix/y.parquet")
    infos = s3.get_file_info(fs.FileSelector(f"{bucket}/prefix", recursive=True))
    files = sorted((i.path, i.size) for i in infos if i.type == fs.FileType.File)
    size = s3.get_file_info(path).size
    assert files == [(path, size), (f"{bucket}/prefix/y.parquet", size)]
    assert pq.read_table(f"{bucket}/prefix/y.parquet", filesystem=s3).equals(table)

    s3.delete_file(path)
    assert s3.get_file_info(path).type == fs.FileType.NotFound
    remaining = s3.get_file_info(fs.FileSelector(f"{bucket}/prefix", recursive=True))
    assert [i.path for i in remaining if i.type == fs.FileType.File] == [f"{bucket}/prefix/y.parquet"]

    pq.write_table(table, f"{bucket}/prefix/sub/z.parquet", filesystem=s3)
    s3.delete_file(f"{bucket}/prefix/sub/z.parquet")
    s3.delete_file(f"{bucket}/prefix/y.parquet")
    left = s3.get_file_info(fs.FileSelector(bucket, recursive=True))
    assert [i.path for i in left if i.type == fs.FileType.File] == []


def test_pyarrow_options_helper(s3env: SwiftS3Server) -> None:
    """pyarrow_options(): host:port endpoint, bucket created through pyarrow itself."""
    bucket = bucket_name()
    s3 = fs.S3FileSystem(**s3env.pyarrow_options(), allow_bucket_creation=True)
    s3.create_dir(bucket)
    with s3.open_output_stream(f"{bucket}/k/v.txt") as out:
        out.write(b"hello swift")
    with s3.open_input_stream(f"{bucket}/k/v.txt") as f:
        assert f.read() == b"hello swift"
