"""Serve the built site on 127.0.0.1 (``--serve``): a static file server on a free port."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

from dml2comm.errors import InputFileError

__all__ = ["make_server"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def make_server(site_dir: Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A server for ``site_dir`` bound to 127.0.0.1 (port 0: a free one) and its URL.

    Raises
    ------
    InputFileError
        ``site_dir`` has no ``index.html`` (the site was not built).
    """
    if not (site_dir / "index.html").is_file():
        raise InputFileError(f"no built site in {site_dir}; run without --no-site first")
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    host, bound = server.server_address[:2]
    return server, f"http://{host}:{bound}/"
