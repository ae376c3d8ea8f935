"""Optional real browser: the same pages driven through Playwright with the system's Chromium.

Nothing is downloaded: Chromium is Debian's (``apt-get install chromium``), passed to Playwright as
``executable_path``. Page loads and form posts happen in the browser; the HTML it ends up with is parsed into the
same accessibility tree as in the plain-HTTP mode, and each step adds a screenshot. Requests to anything other
than the site are aborted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trajlake.errors import BrowserUnavailable

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")
_SUBMIT_JS = """([index, fields]) => {
  const form = document.querySelectorAll('form')[index];
  for (const [name, value] of fields) {
    const el = form.elements.namedItem(name);
    if (el && el.type !== 'hidden') el.value = value;
  }
  form.requestSubmit();
}"""


def find_chromium() -> str | None:
    """Path of the system's Chromium, or None."""
    env = os.environ.get("TRAJLAKE_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class ChromiumDriver:
    """One headless Chromium page on the site at ``base_url``."""

    def __init__(self, base_url: str, shots: Path, executable: str | None = None):
        exe = executable or find_chromium()
        if exe is None:
            raise BrowserUnavailable("no chromium executable found (apt-get install chromium, or set TRAJLAKE_CHROMIUM)")
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise BrowserUnavailable("playwright is not installed (pip install playwright)") from None
        self.base_url = base_url
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)
        self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(executable_path=exe, headless=True,
                                                     args=["--no-sandbox", "--disable-gpu"])
            self._page = self._browser.new_page(viewport={"width": 1024, "height": 768})
            self._page.route("**/*", self._only_site)
        except Exception:
            self._pw.stop()
            raise

    def _only_site(self, route: Any) -> None:
        if route.request.url.startswith(self.base_url + "/"):
            route.continue_()
        else:
            route.abort()

    def _result(self, response: Any) -> tuple[str, str, int]:
        return self._result_path(), self._page.content(), int(response.status) if response is not None else 0

    def get(self, path: str) -> tuple[str, str, int]:
        """Load a path; returns (path, html, HTTP status) after redirects."""
        return self._result(self._page.goto(self.base_url + path, wait_until="load"))

    def ensure_at(self, path: str) -> None:
        """Load ``path`` unless the page already shows it."""
        if self._result_path() != path:
            self.get(path)

    def _result_path(self) -> str:
        parts = urlsplit(self._page.url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def submit(self, form_index: int, fields: Sequence[tuple[str, str]]) -> tuple[str, str, int]:
        """Fill the ``form_index``-th form of the page with ``fields`` and submit it in the browser."""
        with self._page.expect_navigation(wait_until="load") as nav:
            self._page.evaluate(_SUBMIT_JS, [form_index, [list(f) for f in fields]])
        return self._result(nav.value)

    def screenshot(self, name: str) -> str:
        path = self.shots / name
        self._page.screenshot(path=str(path))
        return str(path)

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._pw.stop()
