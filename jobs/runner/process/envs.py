"""Job environments: a script folder's own `requirements.txt`, installed on the node.

    requirements = read_requirements(code_dir / "requirements.txt")   # RequirementsError: a line refused
    environment = ensure_environment(requirements, envs_dir, sources=Sources(...), announce=print)
    environment.python   # what the job runs with (torchrun too: <env>/bin/python -m torch.distributed.run)

An environment is a virtualenv layered on the node's Python: its own site-packages first,
then every site folder the node's Python sees (a `.pth` file that calls site.addsitedir,
since the node's Python is often a virtualenv itself, whose packages `--system-site-packages`
alone would not reach), so torch, numpy and the SDK's dependencies come from the node.
torch, numpy and nvidia-* are the node's and never installed: a line naming one is refused,
uv is told to leave them out of the resolution (`--excludes`: uv does not look at layered
site folders, and would otherwise install a second torch into the environment), pip is held
to the node's versions with a constraints file, and a package installed for the script
that needs another version of one of them fails the build, naming both.

Environments are cached under `envs_dir/<key>`: the key hashes the normalised requirement
lines, the node's Python (version and executable) and its torch and numpy versions, and the
index settings given to the studio. One is built in `envs_dir/.build-<key>-<pid>` under an
exclusive lock (`envs_dir/<key>.lock`: two jobs on one node, or simulated nodes sharing a data
directory, never build the same one twice), and renamed into place with its marker file inside:
a folder at `envs_dir/<key>` is complete, a half-built one never has that name.

Pure filesystem and subprocess work (no database), so it runs in the node agent and in tests.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from jobs.runner.process.jobdir import PASSED_THROUGH, PASSED_THROUGH_PREFIXES

REQUIREMENTS_FILE = "requirements.txt"
MARKER_FILE = "trainyard-env.json"
LAYER_FILE = "_trainyard_node.pth"
KEY_VERSION = "1"  # part of every key: a change to how environments are built starts new ones
NO_INDEX = "none"  # STUDIO_PIP_INDEX_URL=none: no index at all, only the find-links folders
INSTALL_TIMEOUT_SECONDS = 1800.0
LOCK_TIMEOUT_SECONDS = INSTALL_TIMEOUT_SECONDS + 120.0  # another job's build of the same environment
MESSAGE_LINES = 12  # of the installer's output kept in a failure reason
# The node's own packages, and why a script may not bring another version of them.
NODE_PACKAGES = {"torch": "the SDK and CUDA are paired with it", "numpy": "torch and the SDK are built against it"}
NODE_PACKAGE_PREFIXES = ("nvidia-",)  # CUDA's libraries, paired with the node's torch
INSTALLER_PASSED_THROUGH_PREFIXES = ("PIP_", "UV_")
INSTALLER_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


class RequirementsError(Exception):
    """A requirements.txt that cannot become an environment; str() is the job's failure
    reason, starting "requirements.txt: "."""


@dataclass(frozen=True)
class Requirements:
    """The file's requirement lines, normalised (canonical names, no comments) and sorted:
    two files that ask for the same packages share one environment."""

    lines: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.lines)

    def describe(self) -> str:
        return f"{self.count} requirement{'' if self.count == 1 else 's'}"


@dataclass(frozen=True)
class Sources:
    """Where packages come from. Empty: wherever the node's pip is configured to look
    (`pip config list`: index-url, extra-index-url, find-links, no-index, constraint).
    `index_url` (STUDIO_PIP_INDEX_URL) replaces the node's indexes, "none" meaning no index;
    `find_links` (STUDIO_PIP_FIND_LINKS) replaces its find-links folders."""

    index_url: str = ""
    find_links: tuple[str, ...] = ()

    @classmethod
    def of(cls, index_url: str, find_links: str) -> Sources:
        return cls(index_url=index_url.strip(), find_links=tuple(re.split(r"[\s,]+", find_links.strip()))
                   if find_links.strip() else ())


@dataclass(frozen=True)
class JobEnvironment:
    path: Path
    requirements: Requirements
    reused: bool  # True: built by an earlier job, nothing installed now
    seconds: float  # the build's duration (0 when reused)
    installer: str  # "uv" or "pip", whichever built it

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def variables(self, base: Mapping[str, str]) -> dict[str, str]:
        """VIRTUAL_ENV and PATH as an activated environment has them, so a `python` or a
        console script the job starts is the environment's too."""
        bin_dir = str(self.path / "bin")
        path = base.get("PATH", "")
        return {"VIRTUAL_ENV": str(self.path), "PATH": os.pathsep.join(p for p in (bin_dir, path) if p)}


@dataclass(frozen=True)
class NodePython:
    """The interpreter an environment is layered on: the node worker's own, which the
    agent's cold launches run with too (jobs.runner.process.jobdir.python_executable)."""

    executable: str = sys.executable
    version: str = field(default_factory=lambda: ".".join(map(str, sys.version_info[:3])))

    def site_folders(self) -> list[str]:
        return list(site.getsitepackages())

    def package_version(self, name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def owned_packages(self) -> dict[str, str]:
        """The node's torch, numpy and nvidia-* distributions: canonical name → version."""
        owned: dict[str, str] = {}
        for dist in importlib.metadata.distributions():
            name = canonicalize_name(dist.metadata["Name"] or "")
            if is_node_package(name):
                owned.setdefault(name, dist.version)
        return owned


def is_node_package(name: str) -> bool:
    name = canonicalize_name(name)
    return name in NODE_PACKAGES or name.startswith(NODE_PACKAGE_PREFIXES)


# --- 1. reading the file -------------------------------------------------------------------------
def read_requirements(path: Path, node: NodePython | None = None) -> Requirements:
    """The file's requirements, or RequirementsError naming the first line refused: an
    option (-r, -e, --index-url, -f ...: the node's sources are the studio's to set), a line
    that is not a requirement, or one naming torch, numpy or nvidia-* (the node's)."""
    node = node or NodePython()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequirementsError(f"{REQUIREMENTS_FILE}: could not read it: {exc}") from exc
    lines: set[str] = set()
    for number, line in _logical_lines(text):
        if line.startswith("-"):
            option = line.split()[0].split("=")[0]
            raise RequirementsError(f"{REQUIREMENTS_FILE} line {number}: options such as {option} are not accepted "
                                    "here; list one package per line (the node's package index is the studio's "
                                    "STUDIO_PIP_INDEX_URL / STUDIO_PIP_FIND_LINKS)")
        if " --" in line or "\t--" in line:
            option = line[line.index("--"):].split()[0].split("=")[0]
            raise RequirementsError(f"{REQUIREMENTS_FILE} line {number}: per-line options such as {option} are not "
                                    f"accepted; write the requirement alone ({line.split()[0]})")
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            detail = str(exc).splitlines()[0] if str(exc) else "not a requirement"
            raise RequirementsError(f"{REQUIREMENTS_FILE} line {number}: {line!r} is not a requirement "
                                    f"({detail})") from exc
        name = canonicalize_name(requirement.name)
        if is_node_package(name):
            raise RequirementsError(_replaces_node_package(line, name, node))
        requirement.name = name
        lines.add(str(requirement))
    return Requirements(tuple(sorted(lines)))


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line that says something: comments (a `#` at the start
    or after whitespace) and blanks dropped, `\\` continuations joined."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if line.endswith("\\"):
            pending, start = pending + line[:-1] + " ", start or number
            continue
        line, first = (pending + line).strip(), start or number
        pending, start = "", 0
        if line:
            yield first, line
    if pending.strip():
        yield start, pending.strip()


def _replaces_node_package(line: str, name: str, node: NodePython) -> str:
    installed = node.package_version(name)
    if name in NODE_PACKAGES:
        why, have = NODE_PACKAGES[name], f"the node's {name} {installed}" if installed else f"the node's {name}"
    else:
        torch = node.package_version("torch")
        why = f"they are paired with its torch{f' {torch}' if torch else ''}"
        have = f"the node's {name} {installed}" if installed else "the node's CUDA libraries"
    return f"{REQUIREMENTS_FILE}: {line} would replace {have} ({why}); remove the line"


# --- 2. the cache key ------------------------------------------------------------------------------
def environment_key(requirements: Requirements, node: NodePython, sources: Sources) -> str:
    facts = {"v": KEY_VERSION, "requirements": list(requirements.lines), "python": node.executable,
             "python_version": node.version, "torch": node.package_version("torch"),
             "numpy": node.package_version("numpy"), "index_url": sources.index_url,
             "find_links": list(sources.find_links)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


# --- 3. the environment ----------------------------------------------------------------------------
def ensure_environment(requirements: Requirements, envs_dir: Path, *, sources: Sources = Sources(),
                       node: NodePython | None = None, announce: Callable[[str], None] = lambda message: None,
                       base_env: Mapping[str, str] | None = None) -> JobEnvironment:
    """The environment for `requirements`, built unless an earlier job built it.
    1. A complete one at envs_dir/<key>: use it. 2. Else take the key's lock (waiting for a
    build in progress) and look again. 3. Build it in a temporary folder: the virtualenv,
    the layer onto the node's site folders, the install (`announce` says so first), the
    check of the node's packages, the marker. 4. Rename it into place.
    RequirementsError (the installer's own message) when the install fails."""
    node = node or NodePython()
    key = environment_key(requirements, node, sources)
    final = envs_dir / key
    if (final / MARKER_FILE).is_file():
        return _existing(final, requirements)
    envs_dir.mkdir(parents=True, exist_ok=True)
    with _locked(envs_dir / f"{key}.lock"):
        if (final / MARKER_FILE).is_file():
            return _existing(final, requirements)
        for leftover in envs_dir.glob(f".build-{key}-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a build whose worker died; we hold the lock
        if final.exists():
            shutil.rmtree(final)  # no marker: never complete (only a rename gives the folder its name)
        scratch = envs_dir / f".build-{key}-{os.getpid()}"
        announce(f"installing {requirements.describe()} from {REQUIREMENTS_FILE}")
        started = time.monotonic()
        try:
            installer = _build(scratch, requirements, node, sources, base_env=os.environ if base_env is None else base_env,
                               cache_dir=envs_dir.parent / "cache" / "uv")
            seconds = time.monotonic() - started
            (scratch / MARKER_FILE).write_text(json.dumps({
                "key": key, "requirements": list(requirements.lines), "python": node.executable,
                "python_version": node.version, "installer": installer, "seconds": round(seconds, 3),
                "built_at": time.time()}, indent=1))
            _relocate_scripts(scratch / "bin", scratch, final)
            os.rename(scratch, final)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return JobEnvironment(path=final, requirements=requirements, reused=False, seconds=seconds, installer=installer)


def _existing(path: Path, requirements: Requirements) -> JobEnvironment:
    try:
        installer = str(json.loads((path / MARKER_FILE).read_text()).get("installer", ""))
    except (OSError, ValueError):
        installer = ""
    return JobEnvironment(path=path, requirements=requirements, reused=True, seconds=0.0, installer=installer)


@contextlib.contextmanager
def _locked(path: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RequirementsError(f"{REQUIREMENTS_FILE}: another job has been building the same environment "
                                            f"for over {timeout:.0f} s; try again later") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(scratch: Path, requirements: Requirements, node: NodePython, sources: Sources, *,
           base_env: Mapping[str, str], cache_dir: Path) -> str:
    """The virtualenv in `scratch`, layered and installed; returns the installer's name."""
    node_sites = node.site_folders()
    # The base interpreter's own site folder when the node sees it (a plain Python, or a
    # virtualenv made with --system-site-packages); the node's folders through the layer file.
    system_site = any(folder.startswith(sys.base_prefix) for folder in node_sites)
    venv.EnvBuilder(system_site_packages=system_site, with_pip=False, symlinks=True).create(scratch)
    own_site = next(scratch.glob("lib/python*/site-packages"))
    (own_site / LAYER_FILE).write_text(
        "import site; " + "; ".join(f"site.addsitedir({folder!r})" for folder in node_sites) + "\n")
    requirements_file = scratch / REQUIREMENTS_FILE
    requirements_file.write_text("".join(f"{line}\n" for line in requirements.lines))
    owned = node.owned_packages()
    constraints_file = scratch / "node-constraints.txt"
    constraints_file.write_text("".join(f"{name}=={_public(version)}\n" for name, version in sorted(owned.items())))
    python = str(scratch / "bin" / "python")
    env = installer_environment(base_env)
    uv = find_uv()
    if uv:
        excludes_file = scratch / "node-packages.txt"
        excludes_file.write_text("".join(f"{name}\n" for name in sorted({*NODE_PACKAGES, *owned})))
        command = [uv, "pip", "install", "--python", python, "-r", str(requirements_file), "--excludes",
                   str(excludes_file), "--cache-dir", str(cache_dir), *uv_source_options(sources, node, env)]
        installer = "uv"
    else:
        command = [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-r",
                   str(requirements_file), "-c", str(constraints_file), *pip_source_options(sources)]
        installer = "pip"
    try:
        result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                errors="replace", timeout=INSTALL_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise RequirementsError(f"{REQUIREMENTS_FILE}: {installer} did not finish installing "
                                f"{requirements.describe()} within {INSTALL_TIMEOUT_SECONDS:.0f} s") from None
    except OSError as exc:
        raise RequirementsError(f"{REQUIREMENTS_FILE}: could not run {installer}: {exc}") from exc
    if result.returncode != 0:
        # The installer read the build folder's copy of the file: name the user's.
        output = (result.stdout + result.stderr).replace(f"-r {requirements_file}", REQUIREMENTS_FILE)
        raise RequirementsError(f"{REQUIREMENTS_FILE}: {installer_message(output.replace(str(scratch), '<env>'))}")
    check_node_packages(own_site, node)
    return installer


def _public(version: str) -> str:
    """2.13.0+cpu → 2.13.0: a constraint with a local label matches only that build's name."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def _relocate_scripts(bin_dir: Path, old: Path, new: Path) -> None:
    """Console scripts name their interpreter by absolute path (the build folder's):
    point them at the folder's final name before it takes it."""
    old_bytes, new_bytes = os.fsencode(old), os.fsencode(new)
    for script in bin_dir.iterdir():
        if script.is_symlink() or not script.is_file() or script.stat().st_size > 1024 * 1024:
            continue
        content = script.read_bytes()
        if old_bytes in content:
            temporary = script.with_name(f".{script.name}.relocating")
            temporary.write_bytes(content.replace(old_bytes, new_bytes))
            temporary.chmod(script.stat().st_mode)
            os.replace(temporary, script)


def find_uv() -> str:
    """uv's executable: the `uv` package's, else one on PATH, else "" (pip installs instead)."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or ""


def installer_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment as far as an installer needs it (PATH, locale, proxies,
    certificates, PIP_* and UV_*): a package's build script never sees the database URL or
    the secret key."""
    env = {name: value for name, value in base.items()
           if name in PASSED_THROUGH or name in INSTALLER_PROXIES
           or name.startswith((*PASSED_THROUGH_PREFIXES, *INSTALLER_PASSED_THROUGH_PREFIXES))}
    env.pop("VIRTUAL_ENV", None)
    env.update({"NO_COLOR": "1", "UV_NO_PROGRESS": "1", "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PYTHONNOUSERSITE": "1"})
    return env


def pip_configuration(node: NodePython, env: Mapping[str, str]) -> dict[str, str]:
    """The node pip's settings (`pip config list`: files and PIP_* variables), option →
    value, the most specific section winning (PIP_* variables, then [install], then [global])."""
    try:
        output = subprocess.run([node.executable, "-m", "pip", "config", "list"], env=dict(env), capture_output=True,
                                text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    ranked: dict[str, tuple[int, str]] = {}
    rank = {":env:": 3, "install": 2, "global": 1}
    for line in output.splitlines():
        name, _, raw = line.partition("=")
        section, _, option = name.rpartition(".")
        if not option or section not in rank:
            continue
        try:
            value = str(ast.literal_eval(raw))
        except (ValueError, SyntaxError):
            value = raw.strip("'\"")
        if option not in ranked or rank[section] >= ranked[option][0]:
            ranked[option] = (rank[section], value)
    return {option: value for option, (_, value) in ranked.items()}


def uv_source_options(sources: Sources, node: NodePython, env: Mapping[str, str]) -> list[str]:
    """uv reads no pip configuration: hand it the node pip's indexes, find-links and
    constraints, as the studio's settings amend them."""
    config = pip_configuration(node, env)
    options: list[str] = []
    if sources.index_url:
        options += ["--no-index"] if sources.index_url == NO_INDEX else ["--index-url", sources.index_url]
    elif config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options += ["--no-index"]
    else:
        if config.get("index-url"):
            options += ["--index-url", config["index-url"]]
        extra = config.get("extra-index-url", "").split()
        for url in extra:
            options += ["--extra-index-url", url]
        if extra:
            options += ["--index-strategy", "unsafe-best-match"]  # pip's: the best version across every index
    for folder in sources.find_links or tuple(config.get("find-links", "").split()):
        options += ["--find-links", folder]
    for constraint in config.get("constraint", "").split():
        options += ["--constraints", constraint]
    return options


def pip_source_options(sources: Sources) -> list[str]:
    """pip reads its own configuration; only the studio's settings are added."""
    options: list[str] = []
    if sources.index_url:
        options += ["--no-index"] if sources.index_url == NO_INDEX else ["--index-url", sources.index_url]
    for folder in sources.find_links:
        options += ["--find-links", folder]
    return options


def installer_message(output: str) -> str:
    """What the installer said went wrong, without its noise: uv's "error:" line with its
    causes and hints, or pip's ERROR lines; else its last lines."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Using Python ", "Resolved ", "Prepared ", "Audited "))]
    start = next((i for i, line in enumerate(lines) if line.startswith("error: ")), None)
    if start is not None:
        said = [re.sub(r"^\s*(error|cause|Caused by|hint):\s*", "", line).strip() for line in lines[start:]]
        said = [line for line in said if line][:MESSAGE_LINES]
        if len(said) > 1:
            said[:2] = [f"{said[0]}: {said[1]}"]
        return "\n".join(said)
    start = next((i for i, line in enumerate(lines) if line.startswith("ERROR: ")), None)
    if start is not None:
        said = []
        for line in lines[start:]:
            if line.startswith("To fix this"):
                break  # pip's generic advice
            if "for help visit" not in line:
                said.append(line.removeprefix("ERROR: ").strip())
        return "\n".join(said[:MESSAGE_LINES])
    return "\n".join(lines[-MESSAGE_LINES:]) or "the installer failed without saying why"


def check_node_packages(own_site: Path, node: NodePython) -> None:
    """Every package installed for the script that needs torch, numpy or nvidia-* must be
    content with the node's: uv left them out of the resolution, so a mismatch shows here,
    not at the script's first import."""
    owned = node.owned_packages()
    for dist in importlib.metadata.distributions(path=[str(own_site)]):
        name = canonicalize_name(dist.metadata["Name"] or "")
        if is_node_package(name):
            raise RequirementsError(f"{REQUIREMENTS_FILE}: installing it put {name} {dist.version} into the job "
                                    f"environment, over {_have(name, owned)}; pin versions made for the node's")
        for text in dist.requires or []:
            try:
                needed = Requirement(text)
            except InvalidRequirement:
                continue
            needed_name = canonicalize_name(needed.name)
            if not is_node_package(needed_name):
                continue
            if needed.marker is not None and not needed.marker.evaluate({"extra": ""}):
                continue  # only with an extra, or not on this platform
            version = owned.get(needed_name)
            if version is None:
                if needed_name in NODE_PACKAGES:
                    raise RequirementsError(f"{REQUIREMENTS_FILE}: {name} {dist.version} needs {needed}, which the "
                                            "node does not have")
                continue  # nvidia-* wheels that a CPU node's torch does without
            if needed.specifier and not needed.specifier.contains(_public(version), prereleases=True):
                raise RequirementsError(f"{REQUIREMENTS_FILE}: {name} {dist.version} needs {needed}, but the node has "
                                        f"{needed_name} {version}; pin a release of {name} made for it")


def _have(name: str, owned: Mapping[str, str]) -> str:
    return f"the node's {name} {owned[name]}" if name in owned else "the node's packages"
