"""common/files.py: the streamed SHA-256 shared by ExampleGen and replay."""


def test_file_sha256_streams_any_bytes(tmp_path, chinese_poems):
    import hashlib

    from common.files import file_sha256

    data = ("\n\n".join(chinese_poems[:50]).encode("utf-8") + b"\xff\x00") * 200  # > 1 MiB
    path = tmp_path / "诗.txt"
    path.write_bytes(data)
    assert len(data) > 1 << 20
    assert file_sha256(str(path)) == hashlib.sha256(data).hexdigest()
