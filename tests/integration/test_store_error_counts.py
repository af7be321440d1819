"""``S3Store.error_counts``: failed store requests counted by operation, answers (404) not."""

from __future__ import annotations

from typing import Any

import pytest
from support.proxy import FaultProxy

from tiercache.store.retry import RetryPolicy
from tiercache.store.s3 import S3Options, S3Store


def test_failed_attempts_are_counted_and_a_missing_object_is_not(
    s3: Any, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"abc")
    options = S3Options.from_storage_options({**s3.target_options(), "endpoint_url": proxy.url})
    store = S3Store(options, retry=RetryPolicy(attempts=4))
    proxy.fail_next(2, 503, "SlowDown", method="HEAD")
    assert store.head(bucket, "k").size == 3  # the third attempt answers
    with pytest.raises(FileNotFoundError):
        store.head(bucket, "missing")
    assert store.error_counts() == {"HeadObject": 2}
    assert store.request_counts()["HeadObject"] == 4
