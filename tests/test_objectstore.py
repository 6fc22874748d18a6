"""comet/objectstore.py: one rule reads where an S3 store is, and boto3, pyarrow and
delta-rs are each configured from that one reading, whatever form the settings came in
(an option, the environment, the AWS profile)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest

from comet.objectstore import (CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, S3Location, boto3_client_for,
                               delta_storage_options_for, pyarrow_filesystem_for, s3_location,
                               split_s3_url)
from consumers.sinks import S3Sink
from spark_jobs.lake.lakefs import Lake

PROFILES = """\
[default]
region = ap-south-1
endpoint_url = http://profile-default:9000

[profile edge]
region = eu-central-1
services = edge-services

[profile bare]

[services edge-services]
s3 =
  endpoint_url = http://profile-services:9000
"""


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """No AWS setting of this machine: no variable, config files of the test's own, and
    boto3's default session (which keeps what it read) made afresh."""
    import os

    import boto3

    aws = monkeypatch
    aws.setattr(boto3, "DEFAULT_SESSION", None)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield monkeypatch


def configure(aws: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], profile: str | None) -> None:
    """These variables, and with a profile the config file of PROFILES naming it."""
    for name, value in env.items():
        aws.setenv(name, value)
    if profile is not None:
        (tmp_path / "config").write_text(PROFILES)
        aws.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
        aws.setenv("AWS_PROFILE", profile)


def pyarrow_options(location: S3Location) -> dict[str, Any]:
    """The options the pyarrow filesystem was built with (what it pickles)."""
    reduced: Any = pyarrow_filesystem_for(location).__reduce__()
    return dict(reduced[1][0])


def credentials_of(client: Any) -> Any:
    """The credentials a boto3 client signs with (botocore keeps them private)."""
    return client._request_signer._credentials


def assert_clients_agree(location: S3Location, endpoint: str | None, region: str) -> None:
    """boto3, pyarrow and delta-rs all talk to ``endpoint`` (None: AWS) in ``region``."""
    assert (location.endpoint_url, location.region) == (endpoint, region)
    client = boto3_client_for(location)
    assert client.meta.region_name == region
    arrow = pyarrow_options(location)
    assert arrow["region"] == region
    delta = delta_storage_options_for(location)
    assert delta["AWS_REGION"] == region
    if endpoint is None:
        assert urlsplit(client.meta.endpoint_url).hostname.endswith(".amazonaws.com")  # type: ignore[union-attr]
        assert arrow["endpoint_override"] == ""
        assert "AWS_ENDPOINT_URL" not in delta and "AWS_ALLOW_HTTP" not in delta
    else:
        parsed = urlsplit(endpoint)
        assert client.meta.endpoint_url == endpoint
        assert (arrow["scheme"], arrow["endpoint_override"]) == (parsed.scheme, parsed.netloc)
        assert delta["AWS_ENDPOINT_URL"] == endpoint
        assert delta.get("AWS_ALLOW_HTTP") == ("true" if parsed.scheme == "http" else None)


ENDPOINT_FORMS: dict[str, tuple[dict[str, str], str | None, str | None, str | None]] = {
    # name: (environment, profile, the caller's endpoint, the endpoint used)
    "nothing: AWS": ({}, None, None, None),
    "the option": ({}, None, "http://option:9000", "http://option:9000"),
    "AWS_ENDPOINT_URL": ({"AWS_ENDPOINT_URL": "http://global:9000"}, None, None, "http://global:9000"),
    "AWS_ENDPOINT_URL_S3": ({"AWS_ENDPOINT_URL_S3": "https://s3only:9000"}, None, None,
                            "https://s3only:9000"),
    "AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL": (
        {"AWS_ENDPOINT_URL": "http://global:9000", "AWS_ENDPOINT_URL_S3": "http://s3only:9000"},
        None, None, "http://s3only:9000"),
    "the option before the environment": (
        {"AWS_ENDPOINT_URL": "http://global:9000", "AWS_ENDPOINT_URL_S3": "http://s3only:9000"},
        None, "http://option:9000", "http://option:9000"),
    "the default profile's endpoint_url": ({}, "default", None, "http://profile-default:9000"),
    "the profile's services section": ({}, "edge", None, "http://profile-services:9000"),
    "the environment before the profile": ({"AWS_ENDPOINT_URL": "http://global:9000"}, "edge", None,
                                           "http://global:9000"),
    "configured endpoints ignored": ({"AWS_ENDPOINT_URL": "http://global:9000",
                                      "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}, "edge", None, None),
    "ignored, but the option": ({"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}, "edge",
                                "http://option:9000", "http://option:9000"),
}


@pytest.mark.parametrize("form", ENDPOINT_FORMS)
def test_every_endpoint_form_configures_the_three_clients_alike(
        form: str, aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env, profile, option, expected = ENDPOINT_FORMS[form]
    configure(aws, tmp_path, env, profile)
    region = {None: "us-east-1", "default": "ap-south-1", "edge": "eu-central-1"}[profile]
    assert_clients_agree(s3_location("s3://edge/lake", endpoint_url=option), expected, region)


REGION_FORMS: dict[str, tuple[dict[str, str], str | None, str | None, str]] = {
    # name: (environment, profile, the caller's region, the region used)
    "nothing: us-east-1": ({}, None, None, "us-east-1"),
    "the option": ({"AWS_REGION": "eu-west-1"}, "edge", "sa-east-1", "sa-east-1"),
    "AWS_REGION": ({"AWS_REGION": "eu-west-1"}, None, None, "eu-west-1"),
    "AWS_DEFAULT_REGION": ({"AWS_DEFAULT_REGION": "eu-west-2"}, None, None, "eu-west-2"),
    "AWS_REGION before AWS_DEFAULT_REGION": ({"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-2"},
                                             None, None, "eu-west-1"),
    "the environment before the profile": ({"AWS_DEFAULT_REGION": "eu-west-2"}, "edge", None, "eu-west-2"),
    "the profile's region": ({}, "edge", None, "eu-central-1"),
    "a profile without one: us-east-1": ({}, "bare", None, "us-east-1"),
    "a profile that does not exist: us-east-1": ({}, "missing", None, "us-east-1"),
}


@pytest.mark.parametrize("form", REGION_FORMS)
def test_every_region_form_configures_the_three_clients_alike(
        form: str, aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env, profile, option, expected = REGION_FORMS[form]
    # One endpoint for every form, whatever endpoint the profile names.
    configure(aws, tmp_path, {**env, "AWS_ENDPOINT_URL": "http://store:9000"}, profile)
    location = s3_location("s3://edge/lake", region=option)
    if profile == "missing":
        assert (location.endpoint_url, location.region) == ("http://store:9000", expected)
        return  # boto3 itself refuses the missing profile (consumers/errors.py names it)
    assert_clients_agree(location, "http://store:9000", expected)


def test_given_credentials_reach_every_client_and_none_means_each_default_chain(
        aws: pytest.MonkeyPatch) -> None:
    given = s3_location("s3://edge", endpoint_url="http://store:9000", access_key="AKID",
                        secret_key="secret", session_token="token")
    assert "secret" not in repr(given) and "token" not in repr(given)
    credentials = credentials_of(boto3_client_for(given))
    assert (credentials.access_key, credentials.secret_key, credentials.token) == ("AKID", "secret", "token")
    arrow = pyarrow_options(given)
    assert (arrow["access_key"], arrow["secret_key"], arrow["session_token"]) == ("AKID", "secret", "token")
    delta = delta_storage_options_for(given)
    assert (delta["AWS_ACCESS_KEY_ID"], delta["AWS_SECRET_ACCESS_KEY"], delta["AWS_SESSION_TOKEN"]) == \
        ("AKID", "secret", "token")

    aws.setenv("AWS_ACCESS_KEY_ID", "from-env")
    aws.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    chain = s3_location("s3://edge", endpoint_url="http://store:9000")
    assert chain.access_key is None and chain.secret_key is None and chain.session_token is None
    assert credentials_of(boto3_client_for(chain)).access_key == "from-env"
    assert not pyarrow_options(chain)["access_key"]  # pyarrow's own chain
    assert not {k for k in delta_storage_options_for(chain) if "KEY" in k or "TOKEN" in k}


@pytest.mark.parametrize("variable, attempts", [(None, 3), ("1", 1), ("7", 7), ("0", 1), ("many", 3)])
def test_one_client_configuration_timeouts_and_attempts(
        aws: pytest.MonkeyPatch, variable: str | None, attempts: int) -> None:
    if variable is not None:
        aws.setenv("AWS_MAX_ATTEMPTS", variable)
    location = s3_location("s3://edge", endpoint_url="http://store:9000")
    assert location.attempts == attempts
    config: Any = boto3_client_for(location).meta.config  # its stubs name no attribute
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S)
    assert config.retries["total_max_attempts"] == attempts
    arrow = pyarrow_options(location)
    assert (arrow["connect_timeout"], arrow["request_timeout"]) == (CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S)
    delta = delta_storage_options_for(location)
    assert (delta["connect_timeout"], delta["timeout"]) == (f"{CONNECT_TIMEOUT_S}s", f"{REQUEST_TIMEOUT_S}s")
    assert delta["max_retries"] == str(attempts - 1)


@pytest.mark.parametrize("url, bucket, prefix", [("s3://edge", "edge", ""), ("s3://edge/", "edge", ""),
                                                 ("s3://edge/lake/", "edge", "lake"),
                                                 ("s3://edge//a/b", "edge", "a/b")])
def test_an_s3_url_is_a_bucket_and_a_prefix(url: str, bucket: str, prefix: str) -> None:
    assert split_s3_url(url) == (bucket, prefix)


@pytest.mark.parametrize("url", ["s3://", "s3:///lake", "file:///lake", "/lake", "http://edge/lake"])
def test_what_is_not_an_s3_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an s3://bucket/prefix URL"):
        split_s3_url(url)


def test_the_sink_and_the_lake_read_the_same_store(aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    configure(aws, tmp_path, {"AWS_ENDPOINT_URL": "http://global:9000"}, "edge")
    sink = S3Sink("edge", "/shipped", region=None)
    lake = Lake("s3://edge/lake")
    assert (sink.client.meta.endpoint_url, sink.client.meta.region_name) == \
        ("http://global:9000", "eu-central-1")
    assert (lake.store().endpoint_url, lake.store().region) == ("http://global:9000", "eu-central-1")
    explicit = S3Sink("edge", endpoint_url="http://option:9000", region="eu-west-3")
    assert (explicit.client.meta.endpoint_url, explicit.client.meta.region_name) == \
        ("http://option:9000", "eu-west-3")


def test_a_lake_keeps_the_store_of_the_process_that_named_it(aws: pytest.MonkeyPatch) -> None:
    """Spark's tasks get the driver's endpoint and region, whatever their own environment says."""
    aws.setenv("AWS_ENDPOINT_URL_S3", "http://driver:9000")
    aws.setenv("AWS_REGION", "eu-north-1")
    lake = Lake("s3://edge/lake", access_key="AKID", secret_key="secret")
    aws.delenv("AWS_ENDPOINT_URL_S3")
    aws.setenv("AWS_REGION", "us-west-2")
    in_a_task = pickle.loads(pickle.dumps(lake))
    store = in_a_task.store()
    assert (store.bucket, store.prefix, store.endpoint_url, store.region) == \
        ("edge", "lake", "http://driver:9000", "eu-north-1")
    assert (store.access_key, store.secret_key) == ("AKID", "secret")
    assert Lake("s3://edge/lake", endpoint_url="http://given:1", region="r1").store().endpoint_url == \
        "http://given:1"
