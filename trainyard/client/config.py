"""Where the client finds its studio: TRAINYARD_URL and TRAINYARD_TOKEN (and
TRAINYARD_PROJECT) when set, else what `trainyard login` stored in the user's config
folder (platformdirs: ~/.config/trainyard/credentials.json on Linux), readable by the user
only (mode 0600)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from trainyard.client.http import normalise_url

CREDENTIALS_FILE = "credentials.json"


class NotLoggedIn(Exception):
    pass


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    project: str | None = None


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir("trainyard", appauthor=False))


def credentials_path() -> Path:
    return config_dir() / CREDENTIALS_FILE


def stored_credentials() -> dict[str, str]:
    path = credentials_path()
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise NotLoggedIn(f"{path} could not be read ({exc}); run `trainyard login URL` again.") from exc
    return {k: str(v) for k, v in stored.items() if isinstance(v, (str, int))} if isinstance(stored, dict) else {}


def save_credentials(credentials: Credentials) -> Path:
    """Write the credentials with mode 0600 from the start (never briefly world-readable)."""
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = {"url": credentials.url, "token": credentials.token}
    if credentials.project:
        body["project"] = credentials.project
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump(body, out, indent=2)
    os.chmod(partial, 0o600)
    os.replace(partial, path)
    return path


def resolve_credentials(url: str | None = None, token: str | None = None, project: str | None = None) -> Credentials:
    """Arguments first, then the environment, then the stored login (read only when needed)."""
    url = url or os.environ.get("TRAINYARD_URL")
    token = token or os.environ.get("TRAINYARD_TOKEN")
    project = project or os.environ.get("TRAINYARD_PROJECT")
    if not (url and token and project):
        stored = stored_credentials()
        # A stored token belongs to the stored studio: never send it to another URL.
        if not token and (not url or normalise_url(url) == stored.get("url")):
            token = stored.get("token")
        url = url or stored.get("url")
        project = project or stored.get("project") or None
    if not url:
        raise NotLoggedIn("No studio given: run `trainyard login URL`, or set TRAINYARD_URL and TRAINYARD_TOKEN.")
    if not token:
        raise NotLoggedIn(f"No API token for {url}: run `trainyard login {url}`, or set TRAINYARD_TOKEN.")
    return Credentials(url=url, token=token, project=project)
