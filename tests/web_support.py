"""A real browser for the web view's tests: Debian's Chromium driven by Selenium through Debian's chromedriver.

Screenshots go to `$SIMRUN_SCREENSHOTS` (the test command sets it and prints it), else `build/screenshots` of the
checkout, at 1280x800.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# The flags the machine's notes give: without the background-networking ones Chromium's own connections are
# refused by this machine's closed network at every start.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,800",
)


def screenshots() -> Path:
    folder = Path(os.environ.get("SIMRUN_SCREENSHOTS") or ROOT / "build" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def have_browser() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


def start_browser(downloads: Path) -> Any:
    """A headless Chromium with a fresh profile that saves downloads into `downloads` without asking."""
    if not have_browser():
        pytest.skip("no chromium and chromium-driver (the test command installs them with apt-get)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(1280, 800)
    return driver


def wait_for(condition: Callable[[], Any], timeout_s: float = 30, what: str = "the page") -> Any:
    """The condition's first true value, polled; fails the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except Exception as exc:  # an element not there yet, a stale one: poll again
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what} did not show within {timeout_s} s (last: {last!r})")


def shoot(driver: Any, name: str) -> Path:
    """A screenshot of the page at 1280x800, named for what it shows."""
    path = screenshots() / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def console_errors(driver: Any) -> list[str]:
    """The page's console errors (a refused script, a policy violation), but for the missing favicon of Chromium."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
