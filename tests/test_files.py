import os

from keras_transformer import files


def test_write_atomic_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    """A node crash right after a write must find the old file or the new one, whole: the
    data reaches the disk before the name points to it, and the rename reaches it too."""
    calls = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd):
        calls.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def record_replace(src, dst):
        calls.append(("replace", str(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    path = tmp_path / "config.json"
    files.write_atomic(str(path), "{}")
    assert path.read_text() == "{}"
    assert [kind for kind, _ in calls] == ["fsync", "replace", "fsync"]
    temporary = calls[0][1]
    assert os.path.dirname(temporary) == str(tmp_path) and temporary.endswith(".tmp")
    assert calls[1][1] == str(path) and calls[2][1] == str(tmp_path)
