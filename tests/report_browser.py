"""Opens a report.html in the system's headless Chromium (Playwright, no downloaded browser):
what a laptop screen shows, as facts a test can assert on and a full-page screenshot.

  python tests/report_browser.py OUTPUT_DIR   # writes OUTPUT_DIR/report.png, prints findings
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

VIEWPORT = {"width": 1366, "height": 900}  # a laptop


def chromium() -> str | None:
    """The system Chromium (Debian's `chromium`), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def inspect(html_path: str, screenshot: str) -> dict:
    """Loads `html_path` at a laptop's viewport and saves a full-page PNG to `screenshot`.

    Returns:
      {"errors": console errors and page errors, "requests": URLs requested other than
      the page and data: URLs, "sections": {id: text length}, "images": [(alt,
      naturalWidth)], "width": the page's scroll width}.

    Raises:
      RuntimeError: no system Chromium.
    """
    from playwright.sync_api import sync_playwright

    executable = chromium()
    if executable is None:
        raise RuntimeError("no chromium on PATH (Debian: apt-get install chromium)")
    page_url = Path(html_path).resolve().as_uri()
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True,
                                    args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url)
                    if r.url != page_url and not r.url.startswith("data:") else None)
            page.goto(page_url, wait_until="load")
            facts = page.evaluate("""() => ({
                sections: Object.fromEntries([...document.querySelectorAll('section[id]')]
                    .map(s => [s.id, s.innerText.trim().length])),
                images: [...document.images].map(i => [i.alt, i.complete ? i.naturalWidth : 0]),
                width: document.documentElement.scrollWidth,
            })""")
            page.screenshot(path=screenshot, full_page=True)
        finally:
            browser.close()
    return {"errors": errors, "requests": requests, **facts}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    print(json.dumps(inspect(str(out / "report.html"), str(out / "report.png")), indent=2))
