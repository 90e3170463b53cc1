"""Ray token authentication on the client side: where tokens live, how requests carry them.

A Marin cluster (and the `local` one) runs with `RAY_AUTH_MODE=token`: every dashboard/job
API request must carry `Authorization: Bearer <token>`. Tokens live in files, never in
command lines or environment values we print:

- cloud clusters: `$MARIN_TOKEN_DIR` (default `~/.ray`)/`auth_token` for the shared
  `RAY_AUTH_TOKEN` secret (Ray's own default path), `auth_token_<secret>` for another secret;
  `marin cluster auth` fetches it from Secret Manager;
- the `local` cluster: `<local state dir>/home/.ray/auth_token`, made by `ray get-auth-token --generate`.

The token is passed explicitly as a request header (`auth_headers`), so a client never depends
on the process-wide token cache of Ray, and `redact` scrubs it from any text we show.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

__all__ = ["auth_env_lines", "auth_headers", "read_token", "redact", "remote_token_path", "write_private_file"]

REDACTED = "<redacted-token>"


def remote_token_path(secret: str) -> Path:
    """Where the token of a cloud cluster whose Secret Manager secret is `secret` is cached."""
    base = Path(os.environ.get("MARIN_TOKEN_DIR") or Path.home() / ".ray")
    name = "auth_token" if secret == "RAY_AUTH_TOKEN" else f"auth_token_{secret}"
    return base / name


def read_token(path: Path, hint: str) -> str:
    """The token stored at `path`; `hint` names the command that installs it."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"No Ray auth token at {path}; run `{hint}` first") from None
    if not token:
        raise ValueError(f"The Ray auth token file {path} is empty; run `{hint}` again")
    return token


def write_private_file(path: Path, text: str) -> Path:
    """Write a secret (token, ssh key) readable by its owner only, never world-readable even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def auth_headers(token: str) -> dict[str, str]:
    """HTTP headers that authenticate a dashboard / job API request."""
    return {"Authorization": f"Bearer {token}"}


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every occurrence of each non-empty secret replaced by a placeholder."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def auth_env_lines(token_path: Path, address: str | None = None) -> list[str]:
    """Shell `export` lines that let Ray's own CLI/SDK talk to a token-auth cluster."""
    lines = ["export RAY_AUTH_MODE=token", f"export RAY_AUTH_TOKEN_PATH={shlex.quote(str(token_path))}"]
    if address:
        lines.append(f"export RAY_ADDRESS={shlex.quote(address)}")
    return lines
