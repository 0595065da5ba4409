"""Headless Chromium driven by selenium: Debian's ``chromium`` and ``chromedriver``
(``make test`` installs them with apt-get). Every wait is bounded; the driver process
(and the browser under it) is stopped by ``quit()`` and, failing that, by its PID."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).resolve().parents[2]
PAGES = Path(__file__).resolve().parent / "pages"
OUTPUT = ROOT / "runs" / "browser"
"""Where screenshots are kept (gitignored, like the chaos runs)."""
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PAGE_LOAD_SECONDS = 20
T = TypeVar("T")


def missing_browser() -> str | None:
    """Why the browser cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing: `make test` installs chromium and chromium-driver (apt-get)"
    return None


class Browser:
    """One headless Chromium with its own profile under ``profile_dir``."""

    def __init__(self, profile_dir: Path, *, width: int = 1400, height: int = 1000) -> None:
        reason = missing_browser()
        if reason is not None:
            raise RuntimeError(reason)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in (
            "--headless=new",
            "--no-sandbox",  # root in a container: the sandbox needs user namespaces
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-extensions",
            f"--user-data-dir={profile_dir}",
            f"--window-size={width},{height}",
        ):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver_log = str(profile_dir.parent / "chromedriver.log")
        self.service = Service(CHROMEDRIVER, log_output=driver_log)
        self.driver = webdriver.Chrome(service=self.service, options=options)
        self.driver.set_page_load_timeout(PAGE_LOAD_SECONDS)
        self.driver.set_script_timeout(10)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def run(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        """Poll ``check`` every 0.1 s until it returns something truthy; TimeoutError
        naming ``what`` (with the page's console) after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout} s\nconsole:\n{self.console()}")
            time.sleep(0.1)

    def console(self) -> str:
        try:
            entries = self.driver.get_log("browser")
        except Exception as exc:  # the log is a diagnostic only
            return f"(no console log: {exc})"
        return "\n".join(f"{e.get('level')} {e.get('message')}" for e in entries)

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            process = self.service.process
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)


def open_browser(tmp_path: Path) -> Iterator[Browser]:
    browser = Browser(tmp_path / "chromium-profile")
    try:
        yield browser
    finally:
        browser.quit()
