"""The model repository on disk, in Triton's layout: `<root>/<name>/config.pbtxt`,
`<root>/<name>/<version>/model.onnx`.

Every file a model names (its config, labels, warm-up data, model files) is a plain file in the
model's folders, read as its owner would allow: never through a symbolic link, which a user who
may write in a model's folder could point at a file only the daemon's user may read (the daemon
often runs as root), whose lines would then come back in any caller's replies or errors."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service.errors import ConfigError, ModelNotFoundError, shown

log = logging.getLogger(__name__)

# A model name is one plain path component: it can never climb out of the repository.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class RepositoryEntry:
    name: str
    config: model_config_pb2.ModelConfig
    versions: dict[int, Path]  # version -> model file
    stamps: dict[int, tuple]  # version -> what it is loaded from, as stamp() sees it
    labels: dict[str, tuple[str, ...]]  # output -> its label_filename's lines


def check_model_name(name: str) -> str:
    if not _SAFE_NAME.match(name) or ".." in name:
        raise ModelNotFoundError(
            f"model_name {shown(name)} is not a valid model name: expected letters, digits, "
            "'_', '.' or '-', not starting with '.' or '-'")
    return name


class ModelRepository:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def names(self) -> list[str]:
        if not self.root.is_dir():
            raise ConfigError(f"model repository {str(self.root)!r} is not a directory")
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and _SAFE_NAME.match(p.name))

    def load(self, name: str) -> RepositoryEntry:
        """Reads one model's config and versions; ConfigError says what is wrong."""
        folder = self.root / check_model_name(name)
        config_path = folder / "config.pbtxt"
        shared, folders = stamp(folder)  # before reading: a change meanwhile shows next time
        if not os.path.lexists(config_path):
            raise ConfigError(f"model {name!r}: {config_path} is missing")
        text = read_model_file(config_path, f"model {name!r}:").decode(errors="replace")
        try:
            config = text_format.Parse(text, model_config_pb2.ModelConfig())
        except text_format.ParseError as e:
            raise ConfigError(f"model {name!r}: {config_path}: {e}") from e
        if config.name and config.name != name:
            raise ConfigError(f"model {name!r}: config.pbtxt names it {config.name!r}; "
                              "the folder name and the config name must agree")
        config.name = name
        filename = file_name(config.default_model_filename or "model.onnx", name,
                             "default_model_filename", "each version folder")
        found = {int(p.name): p / filename for p in folder.iterdir()
                 if p.is_dir() and p.name.isdigit() and os.path.lexists(p / filename)}
        for path in found.values():
            if path.is_symlink() or not path.is_file():
                raise ConfigError(f"model {name!r}: {path} is a symbolic link or not a file; "
                                  "the daemon reads only plain files of the model's folders")
        versions = {v: found[v] for v in _policy_versions(config.version_policy, sorted(found))}
        if not versions:
            raise ConfigError(f"model {name!r}: no version folder holds {shown(filename)} "
                              f"(looked in {folder}/<version>/)")
        return RepositoryEntry(name, config, versions,
                               {v: (shared, folders.get(v)) for v in versions},
                               _labels(folder, config))

    def stamp(self, name: str) -> object:
        """What model `name`'s folder holds now, cheaply (stamp()); None once it is gone."""
        folder = self.root / check_model_name(name)
        return stamp(folder) if folder.is_dir() else None


def stamp(folder: Path) -> tuple[tuple, dict[int, tuple]]:
    """A model folder's files as (files outside version folders, files of each version folder):
    each by relative path, size and modification time, config.pbtxt also by its content (an
    edit within the clock's resolution keeps size and time). A version whose part and the shared
    part are unchanged need not be loaded again."""
    shared: list[tuple | str] = []  # files, and config.pbtxt's digest
    versions: dict[int, list[tuple]] = {}
    for top, _, files in os.walk(folder):
        relative = Path(top).relative_to(folder)
        top_part = relative.parts[0] if relative.parts else ""
        into = versions.setdefault(int(top_part), []) if top_part.isdigit() else shared
        for name in files:
            try:
                s = os.stat(Path(top) / name)
            except OSError:  # removed meanwhile: the next look sees it
                continue
            into.append((str(relative / name), s.st_size, s.st_mtime_ns))
    try:
        shared.append(hashlib.sha256(read_model_file(folder / "config.pbtxt",
                                                     "")).hexdigest())
    except ConfigError:  # missing or refused: the load says why
        pass
    return tuple(sorted(shared, key=str)), {v: tuple(sorted(f)) for v, f in versions.items()}


def read_model_file(path: Path, where: str) -> bytes:
    """A file of a model's folder, never read through a link and only if it is a plain file (a
    FIFO would hang the load); ConfigError starts with `where` (the model and the field) and
    never quotes the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        reason = (" is a symbolic link, which the daemon does not follow: put the file itself "
                  "in the model's folder") if e.errno == errno.ELOOP else f": {e.strerror}"
        raise ConfigError(f"{where} {path}{reason}") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{where} {path} is not a plain file")
        return file.read()


def file_name(value: str, model: str, field: str, where: str) -> str:
    """`value` once it is known to be a plain file name: a file that a model's config names lies
    in the model's own folders, never elsewhere on the node ('../', absolute paths)."""
    if Path(value).name != value or value in ("", ".", ".."):
        raise ConfigError(f"model {model!r}: {field} {shown(value)} is not a plain file name; "
                          f"expected the name of a file in {where}")
    return value


def _labels(folder: Path, config: model_config_pb2.ModelConfig) -> dict[str, tuple[str, ...]]:
    """Each output's class labels, one a line of its label_filename (in the model's folder)."""
    labels = {}
    for i, output in enumerate(config.output):
        if not output.label_filename:
            continue
        field = f"output[{i}].label_filename"
        path = folder / file_name(output.label_filename, config.name, field,
                                  "the model's folder")
        try:
            text = read_model_file(path, f"model {config.name!r}: {field}").decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"model {config.name!r}: {field} {output.label_filename!r}: "
                              f"not UTF-8 text ({e.reason} at byte {e.start})") from None
        labels[output.name] = tuple(line.rstrip("\r") for line in text.splitlines())
    return labels


def _policy_versions(policy: model_config_pb2.ModelVersionPolicy,
                     available: list[int]) -> list[int]:
    """Triton's version_policy: latest N (default 1), all, or specific versions."""
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        return available
    if kind == "specific":
        return [v for v in available if v in set(policy.specific.versions)]
    count = policy.latest.num_versions if kind == "latest" else 1
    return available[-max(count, 1):]
