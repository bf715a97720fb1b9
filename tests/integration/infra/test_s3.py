"""The S3-compatible server on loopback behaves like S3 for what the protocol relies on."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import MotoS3

pytestmark = pytest.mark.s3


def test_write_read_list_and_delete_objects(moto_server: MotoS3, s3_bucket: str) -> None:
    fs = moto_server.filesystem()

    fs.pipe_file(f"{s3_bucket}/pipe/a.bin", b"alpha")
    fs.pipe_file(f"{s3_bucket}/pipe/sub/b.bin", b"beta")

    assert fs.cat_file(f"{s3_bucket}/pipe/a.bin") == b"alpha"
    assert fs.size(f"{s3_bucket}/pipe/sub/b.bin") == 4
    assert sorted(fs.find(f"{s3_bucket}/pipe")) == [
        f"{s3_bucket.removeprefix('s3://')}/pipe/a.bin",
        f"{s3_bucket.removeprefix('s3://')}/pipe/sub/b.bin",
    ]

    fs.rm(f"{s3_bucket}/pipe/a.bin")
    assert not fs.exists(f"{s3_bucket}/pipe/a.bin")


def test_each_test_gets_a_fresh_empty_bucket(moto_server: MotoS3, s3_bucket: str) -> None:
    assert moto_server.filesystem().ls(s3_bucket) == []


def test_create_exclusive_refuses_to_overwrite(moto_server: MotoS3, s3_bucket: str) -> None:
    """``pipe_file(mode="create")`` is a conditional put (``If-None-Match: *``)."""
    fs = moto_server.filesystem()
    path = f"{s3_bucket}/_txlog/epoch=1/decision"

    fs.pipe_file(path, b"commit", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"abort", mode="create")

    assert fs.cat_file(path) == b"commit"


def test_create_exclusive_refuses_to_overwrite_a_multipart_upload(
    moto_server: MotoS3, s3_bucket: str
) -> None:
    """Large objects go through multipart upload; the condition is on the completion."""
    fs = moto_server.filesystem()
    path = f"{s3_bucket}/big"
    chunk = 5 * 2**20  # the S3 minimum part size
    first = b"1" * (2 * chunk + 1)

    fs.pipe_file(path, first, mode="create", chunksize=chunk)
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"2" * (2 * chunk + 1), mode="create", chunksize=chunk)

    assert fs.cat_file(path) == first


def test_concurrent_create_exclusive_has_exactly_one_winner(
    moto_server: MotoS3, s3_bucket: str
) -> None:
    path = f"{s3_bucket}/race"
    writers = 8
    start = threading.Barrier(writers)
    winners: list[int] = []
    losers: list[int] = []

    def write(index: int) -> None:
        fs = moto_server.filesystem()  # one client per writer, as separate tasks would have
        start.wait()
        try:
            fs.pipe_file(path, str(index).encode(), mode="create")
            winners.append(index)
        except FileExistsError:
            losers.append(index)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(winners) == 1
    assert len(losers) == writers - 1
    assert moto_server.filesystem().cat_file(path) == str(winners[0]).encode()


def test_fake_credentials_keep_tests_away_from_real_aws() -> None:
    import os

    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "testing"
