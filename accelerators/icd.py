"""Makes the OpenCL runtimes that pip installed into this environment visible to the ICD loader:
Intel's FPGA Emulation Platform (`hetserve[fpga-emulator]`) and the CPU runtime it comes with.
Their wheels put the libraries in `<prefix>/lib` but name a placeholder path in their own `.icd`
files, and the loader reads only one folder of `.icd` files (`/etc/OpenCL/vendors`, or
`$OCL_ICD_VENDORS`). So before the first platform query, hetserve writes a folder holding the
system's `.icd` files plus one per installed library, and points `OCL_ICD_VENDORS` at it: no
change to /etc, nothing for the user to set, and real boards keep their system ICDs. A loader
folder chosen by the user (`OCL_ICD_VENDORS`, `OPENCL_VENDOR_PATH`: Oclgrind, a test rig) wins:
hetserve then adds nothing."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import tempfile
from pathlib import Path

from accelerators import safe_files

log = logging.getLogger(__name__)

SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")
# The libraries of the pip-installed runtimes, and the platform each announces.
EMULATOR_LIBRARY = "libintelocl_emu.so"
BUNDLED = {EMULATOR_LIBRARY: "Intel(R) FPGA Emulation Platform for OpenCL(TM)",
           "libintelocl.so": "Intel(R) OpenCL"}
_USER_CHOICE = ("OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH")
# The emulator's worker threads: 32 by default, which oversubscribe a small node (measured on
# 2 cores: MNIST at batch 64 ran 1.5x faster with 4); at least 8: the FPGA pipeline runs 4
# kernels at once, each on a thread of its own, and with 4 the emulator deadlocked them (seen on
# 2 cores). A value the user set wins.
EMULATOR_THREADS = "CL_CONFIG_CPU_TBB_NUM_WORKERS"
_MADE_BY_US = "HETSERVE_ICD_VENDORS"  # the folder this process tree points the loader at


def _installed(prefix: Path | None = None) -> list[Path]:
    """The pip-installed runtimes present in this environment, emulator first."""
    lib = (prefix or Path(sys.prefix)) / "lib"
    return [lib / name for name in BUNDLED if (lib / name).is_file()]


def register(prefix: Path | None = None, state_dir: Path | None = None) -> Path | None:
    """Points the ICD loader at the system's ICDs plus this environment's runtimes, before the
    first platform query of the process (the loader reads its folder once). Returns the folder,
    or None where there is nothing to add or the user chose the loader's folder."""
    made = os.environ.get(_MADE_BY_US)
    if made and os.environ.get("OCL_ICD_VENDORS") == made:
        return Path(made)  # a parent process made it: children inherit it as they are
    if any(os.environ.get(v) for v in _USER_CHOICE):
        return None
    libraries = _installed(prefix)
    if not libraries:
        return None
    lines = {f"system-{p.name}": p.read_text() for p in _system_icds()}
    if any(name in text for text in lines.values() for name in BUNDLED):
        return None  # installed system-wide: its own ICD already names it
    lines |= {f"zz-hetserve-{lib.name}.icd": f"{lib}\n" for lib in libraries}
    try:
        folder = _write(lines, state_dir or _state_dir())
    except OSError as e:  # a read-only home, a planted folder: the system's devices still serve
        log.warning("the OpenCL runtimes installed in %s stay hidden: %s", sys.prefix, e)
        return None
    os.environ["OCL_ICD_VENDORS"] = os.environ[_MADE_BY_US] = str(folder)
    os.environ.setdefault(EMULATOR_THREADS, str(max(8, len(os.sched_getaffinity(0)))))
    log.debug("OpenCL ICD folder %s: %s", folder, sorted(lines))
    return folder


def check_trusted() -> None:
    """Raises safe_files.UnsafeFolderError unless the folder of `.icd` files the loader reads
    (the user's $OCL_ICD_VENDORS, hetserve's, or /etc/OpenCL/vendors) and the folder of every
    library they name by path are the daemon's user's or root's, and no other user may write
    in them: a planted `.icd` file, or a library swapped beside a named one, would run its code
    in the daemon."""
    register()
    chosen = next((v for v in _USER_CHOICE if os.environ.get(v)), None)
    vendors = Path(os.environ[chosen]) if chosen else SYSTEM_VENDORS
    what = f"the OpenCL ICD folder (${chosen})" if chosen else "the OpenCL ICD folder"
    if not vendors.exists():
        return
    safe_files.check_trusted(vendors if vendors.is_dir() else vendors.parent, what)
    for icd in sorted(vendors.glob("*.icd")) if vendors.is_dir() else [vendors]:
        try:
            library = Path(icd.read_text().strip())
        except OSError:
            continue  # unreadable: the loader skips it too
        if library.is_absolute():
            safe_files.check_trusted(library.parent, f"the OpenCL library that {icd} names")


def _system_icds() -> list[Path]:
    try:
        return sorted(p for p in SYSTEM_VENDORS.iterdir() if p.suffix == ".icd" and p.is_file())
    except OSError:
        return []


def _state_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hetserve" / "icd"


def _write(files: dict[str, str], parent: Path) -> Path:
    """A folder named after its contents under `parent`, written once: into a fresh private
    folder renamed into place, so that no process reads a half-written one and no link that
    someone else planted is followed."""
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]
    folder = parent / digest
    if _is_ours(folder):
        return folder
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=".staging-"))
    for name, text in files.items():
        safe_files.write_file(staging / name, text, flag=None)
    try:
        staging.rename(folder)
    except OSError:  # another process won the race: its folder holds the same files
        for p in staging.iterdir():
            p.unlink()
        staging.rmdir()
    if not _is_ours(folder):
        raise PermissionError(f"{folder} is not a folder of this user's: remove it")
    return folder


def _is_ours(folder: Path) -> bool:
    try:
        st = folder.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
